package postgres

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
)

func TestCheckFilter(t *testing.T) {
	for _, f := range []string{
		"", "tenant = 'a'", "(a OR b) AND c", "name = 'x)'", "name = 'it''s )'", `"we)ird" = 1`,
		"$$)$$ = x", "$tag$ ) $tag$ = x", "a = 1 -- trailing comment )", "a = 1 -- c )\nAND b", "/* ) /* nested ) */ */ true",
		`E'\')' = x`, "a$1 = 2", "x = ANY('{1,2}')",
	} {
		if err := checkFilter(f); err != nil {
			t.Errorf("%q refused: %v", f, err)
		}
	}
	for _, f := range []string{
		"1 = 1) OR (true", "(a", "a)", "a; DROP TABLE t", "id = $1", "'unterminated", `"unterminated`,
		"/* open", "$$ open", `E'\'`, "x = 'a' ) OR ( 'b' = 'b'",
	} {
		if err := checkFilter(f); err == nil {
			t.Errorf("%q accepted", f)
		}
	}
}

func TestArrayMalformed(t *testing.T) {
	e := rowEncoder{}
	for _, v := range []string{"", "1,2", "{1,2", "{1,,2}", "{1,}", "{1}x", "{1}}", `{"a}`, "[1:2]{1,2}", "{{1}"} {
		if out, err := e.appendArray(nil, []byte(v), kindNumber, ','); err == nil {
			t.Errorf("%q accepted as %s", v, out)
		}
	}
}

func TestTimestampFallback(t *testing.T) {
	for in, want := range map[string]string{
		"2024-05-01 12:00:00.000001+00":    `"2024-05-01T12:00:00.000001Z"`,
		"2024-05-01 14:30:00.1+02:30":      `"2024-05-01T12:00:00.100000Z"`,
		"2024-05-01 12:00:00-01:00:30":     `"2024-05-01T13:00:30.000000Z"`,
		"0001-01-01 00:00:00+00 BC":        `"0000-01-01T00:00:00.000000Z"`,
		"294276-12-31 23:59:59.999999+00":  `"294276-12-31T23:59:59.999999Z"`,
		"2024-05-01 12:00:00.1234567+00":   "error",
		"2024-05-01T12:00:00+00":           "error",
		"yesterday":                        "error",
		"2024-05-01 12:00:00+00 BC extra":  "error",
		"2024-05-01 12:00:00.000001+00:00": `"2024-05-01T12:00:00.000001Z"`,
	} {
		got, err := appendTimestamp(nil, []byte(in))
		if err != nil {
			got = []byte("error")
		}
		if string(got) != want {
			t.Errorf("%q: got %s, want %s", in, got, want)
		}
	}
}

func TestStringEscaping(t *testing.T) {
	for in, want := range map[string]string{
		"":                     `""`,
		"plain":                `"plain"`,
		"\x00\x1f\"\\/":        `"\u0000\u001f\"\\/"`,
		"é\u2028😀":             `"é` + "\u2028" + `😀"`,
		"bad\xffutf8\xc3":      `"bad\ufffdutf8\ufffd"`,
		"<script>&</sc>":       `"<script>&</sc>"`,
		"\u007f\u0080\xe2\x82": `"` + "\u007f\u0080" + `\ufffd\ufffd"`,
	} {
		got := appendString(nil, []byte(in))
		if string(got) != want || !json.Valid(got) {
			t.Errorf("%q: got %s, want %s (valid %v)", in, got, want, json.Valid(got))
		}
	}
}

func TestCursorRoundTrip(t *testing.T) {
	for _, k := range []key{{0, "1"}, {-1, "-5"}, {1714564800000001, "a:b:c"}, {1714564800000001, ""}} {
		kind := idText
		if k.id == "1" || k.id == "-5" {
			kind = idBigint
		}
		got, err := decodeCursor(k.cursor(), kind)
		if err != nil || got != k {
			t.Errorf("%+v: got %+v, %v", k, got, err)
		}
	}
	if _, err := decodeCursor("v1:1:ABCDEF00-0000-0000-0000-000000000000", idUUID); err == nil {
		t.Error("uppercase uuid accepted")
	}
}

// FuzzArray: the array parser never panics and, when it succeeds, emits
// valid JSON.
func FuzzArray(f *testing.F) {
	for _, s := range []string{"{}", "{1,NULL}", `{"a\"b",NULL,"NULL"}`, "[0:1]={1,2}", "{{1,2},{3,4}}", `{"\\x01"}`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		e := rowEncoder{}
		for _, k := range []kind{kindString, kindNumber, kindJSON, kindBytea, kindTimestamp} {
			out, err := e.appendArray(nil, []byte(s), k, ',')
			if err == nil && k != kindNumber && k != kindJSON && !json.Valid(out) {
				t.Fatalf("%q (kind %d) -> invalid JSON %s", s, k, out)
			}
		}
	})
}

// benchRow is a typical ~200-byte row: bigint id, text, timestamptz,
// numeric, bool, jsonb, text[].
var benchRow = [][]byte{
	[]byte("123456789"),
	[]byte("Ada Lovelace <ada@example.com>"),
	[]byte("2024-05-01 12:00:00.123456+00"),
	[]byte("1234.50"),
	[]byte("t"),
	[]byte(`{"plan": "pro", "seats": 12, "flags": ["a", "b"]}`),
	[]byte(`{alpha,beta,"gamma delta",NULL}`),
	nil,
}

func benchEncoder() *rowEncoder {
	return &rowEncoder{cols: newValueColumns([]valueColumn{
		{name: "id", kind: kindNumber},
		{name: "name", kind: kindString},
		{name: "updated_at", kind: kindTimestamp},
		{name: "price", kind: kindString},
		{name: "active", kind: kindBool},
		{name: "attrs", kind: kindJSON},
		{name: "tags", kind: kindArray, elem: kindString, delim: ','},
		{name: "deleted_at", kind: kindTimestamp},
	})}
}

func TestBenchRow(t *testing.T) {
	out, err := benchEncoder().appendRow(nil, benchRow)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"id":123456789,"name":"Ada Lovelace <ada@example.com>","updated_at":"2024-05-01T12:00:00.123456Z","price":"1234.50","active":true,"attrs":{"plan": "pro", "seats": 12, "flags": ["a", "b"]},"tags":["alpha","beta","gamma delta",null],"deleted_at":null}`
	if string(out) != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
	if !strings.HasPrefix(string(out), "{") || !json.Valid(out) {
		t.Fatal("invalid")
	}
}

// BenchmarkEncodeRow measures row -> JSON value with a reused buffer.
func BenchmarkEncodeRow(b *testing.B) {
	e := benchEncoder()
	var buf []byte
	n := 0
	for _, v := range benchRow {
		n += len(v)
	}
	b.SetBytes(int64(n))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = e.appendRow(buf[:0], benchRow)
		if err != nil {
			b.Fatal(err)
		}
	}
}

func TestConfigStringRedacts(t *testing.T) {
	for _, dsn := range []string{
		"postgres://u:s3cret@h:5432/db?sslmode=disable",
		"postgresql://u:s3cret@h/db",
		"postgres://u@h/db?password=s3cret&sslmode=disable",
		"host=h user=u password=s3cret dbname=db",
		"host=h password = 's3 cret' dbname=db",
		`host=h password=top\ s3cret dbname=db`, // pgx reads "\ " as a space in an unquoted value
		`host=h password=s3\\ dbname=db`,
	} {
		c := Config{DSN: dsn, Password: "s3cret", Table: "t"}
		for _, s := range []string{c.String(), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c)} {
			if strings.Contains(s, "s3") || !strings.Contains(s, "REDACTED") {
				t.Errorf("%q leaks: %s", dsn, s)
			}
		}
	}
}

// TestMarksSettle: a head pass's Settle mark flags rows Settled instead of
// its own mark; a settle mark above the pass's own, or any settle mark when
// transaction ids went backwards, flags nothing (docs/design.md, "Head
// passes").
func TestMarksSettle(t *testing.T) {
	s := &Source{cfg: Config{Logger: slog.New(slog.DiscardHandler)}}
	sh := &shape{q: queries{marks: true}, tbl: &table{ident: `"public"."t"`}}
	mk := func(x int64) string { return formatMark(x, "16384") }
	other := func(x int64) string { return formatMark(x, "16999") }
	v1 := func(x int64) string { return markPrefixV1 + strconv.FormatInt(x, 10) }
	for _, c := range []struct {
		name                 string
		skip, mark, settle   string
		wantSkip, wantSettle any
	}{
		{"full pass", mk(100), mk(200), "", int64(100), int64(200)},
		{"head pass", mk(150), mk(200), mk(100), int64(150), int64(100)},
		{"head pass, no skip", "", mk(200), mk(100), nil, int64(100)},
		{"settle above the pass's own mark", mk(150), mk(200), mk(300), int64(150), nil},
		{"ids went backwards, full pass", mk(500), mk(200), "", nil, int64(200)},
		{"ids went backwards, head pass", mk(500), mk(200), mk(100), nil, nil},
		{"wraps modulo 2^32", mk(1<<32 + 7), mk(1<<32 + 9), mk(1<<32 + 5), int64(7), int64(5)},
		// Compared modulo 2^32, a mark more than 2^31 ids old would call
		// the newest versions old: skip nothing, settle nothing, from
		// 2^30 on (the versions a pass reads may be newer than its mark).
		{"skip mark 3e9 ids old", mk(1000), mk(1000 + 3_000_000_000), "", nil, int64((1000 + 3_000_000_000) & 0xffffffff)},
		{"skip mark 2^30 ids old", mk(1000), mk(1000 + 1<<30), "", nil, int64(1000 + 1<<30)},
		{"skip mark just under 2^30 ids old", mk(1001), mk(1000 + 1<<30), "", int64(1001), int64(1000 + 1<<30)},
		// A mark of another relation (the table replaced since) proves
		// nothing; an x1 mark (an earlier release) names none.
		{"skip mark of another relation", other(150), mk(200), "", nil, int64(200)},
		{"settle mark of another relation", mk(150), mk(200), other(100), int64(150), nil},
		{"x1 marks", v1(150), mk(200), v1(100), int64(150), int64(100)},
		{"settle mark 3e9 ids old", mk(1000 + 3_000_000_000 - 5), mk(1000 + 3_000_000_000), mk(1000), int64((1000 + 3_000_000_000 - 5) & 0xffffffff), nil},
	} {
		skip, settled, err := s.marks(context.Background(), nil, sh, connector.PageRequest{Skip: c.skip, Mark: c.mark, Settle: c.settle})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		var got any
		if settled != nil {
			got = *settled
		}
		if skip != c.wantSkip || got != c.wantSettle {
			t.Errorf("%s: skip %v, settle mark %v; want %v, %v", c.name, skip, got, c.wantSkip, c.wantSettle)
		}
	}
	for _, bad := range []string{"nonsense", "x2:100", "x2:100@", "x1:100@16384", "x2:-1@1"} {
		_, _, err := s.marks(context.Background(), nil, sh, connector.PageRequest{Mark: mk(1), Settle: bad})
		if stop := (*connector.StopError)(nil); !errors.As(err, &stop) {
			t.Errorf("settle mark %q: %v is not a safety stop (a retry reads the same checkpoint)", bad, err)
		}
		_, _, err = s.marks(context.Background(), nil, sh, connector.PageRequest{Mark: mk(1), Skip: bad})
		if stop := (*connector.StopError)(nil); !errors.As(err, &stop) {
			t.Errorf("skip mark %q: %v is not a safety stop", bad, err)
		}
	}
}

// TestMarksSteps: a step is used on the terms of a skip mark: of the same
// relation, not above the pass's own mark, younger than maxMarkAge; one
// that is not is left out with every step before it.
func TestMarksSteps(t *testing.T) {
	s := &Source{cfg: Config{Logger: slog.New(slog.DiscardHandler)}}
	sh := &shape{q: queries{marks: true}, tbl: &table{ident: `"public"."t"`}}
	mk := func(x int64) string { return formatMark(x, "16384") }
	at := func(s int) time.Time { return time.Date(2024, 5, 1, 12, 0, s, 0, time.UTC) }
	step := func(x int64, s int) connector.Step { return connector.Step{Mark: mk(x), Since: at(s)} }
	for _, c := range []struct {
		name      string
		mark      string
		steps     []connector.Step
		wantLows  []time.Time
		wantMarks []int64
	}{
		{"two steps", mk(200), []connector.Step{step(150, 1), step(180, 2)}, []time.Time{at(1), at(2)}, []int64{150, 180}},
		{"wraps modulo 2^32", mk(1<<32 + 9), []connector.Step{step(1<<32+7, 1)}, []time.Time{at(1)}, []int64{7}},
		{"no steps", mk(200), nil, nil, nil},
		{"no mark of the pass", "", []connector.Step{step(150, 1)}, nil, nil},
		{"no bound", mk(200), []connector.Step{{Mark: mk(150)}}, nil, nil},
		{"of another relation", mk(200), []connector.Step{{Mark: formatMark(150, "16999"), Since: at(1)}, step(180, 2)}, []time.Time{at(2)}, []int64{180}},
		// A head pass that read another relation may have published its
		// content for a key since: the steps before it prove nothing
		// about the topic now.
		{"another relation between two", mk(200), []connector.Step{step(120, 1), {Mark: formatMark(150, "16999"), Since: at(2)}, step(180, 3)}, []time.Time{at(3)}, []int64{180}},
		{"above the pass's mark", mk(200), []connector.Step{step(150, 1), step(300, 2)}, nil, nil},
		{"2^30 ids old", mk(1000 + 1<<30), []connector.Step{step(1000, 1), step(2000, 2)}, []time.Time{at(2)}, []int64{2000}},
	} {
		lows, marks, err := s.steps(context.Background(), nil, sh, connector.PageRequest{Mark: c.mark, Steps: c.steps})
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if c.wantLows == nil {
			if lows != nil || marks != nil {
				t.Errorf("%s: %v %v, want no steps", c.name, lows, marks)
			}
			continue
		}
		if !slices.Equal(lows.([]time.Time), c.wantLows) || !slices.Equal(marks.([]int64), c.wantMarks) {
			t.Errorf("%s: %v %v, want %v %v", c.name, lows, marks, c.wantLows, c.wantMarks)
		}
	}
	for _, bad := range [][]connector.Step{{{Mark: "nonsense", Since: at(1)}}, {step(150, 2), step(160, 1)}} {
		if _, _, err := s.steps(context.Background(), nil, sh, connector.PageRequest{Mark: mk(200), Steps: bad}); err == nil {
			t.Errorf("steps %v accepted", bad)
		}
	}
}

// TestMarkFormats: a mark lists its relation's oids (x3) up to
// maxMarkOids, beyond that a digest (x2, also what earlier releases wrote);
// an x2 mark of the same relation is the same relation as an x3 one, and
// an oid list that is not one is refused.
func TestMarkFormats(t *testing.T) {
	few := "16384,16390,16395"
	if got := formatMark(7, few); got != "x3:7@"+few {
		t.Errorf("formatMark = %q", got)
	}
	many := make([]string, maxMarkOids+1)
	for i := range many {
		many[i] = strconv.Itoa(20000 + i)
	}
	if got := formatMark(7, strings.Join(many, ",")); !strings.HasPrefix(got, "x2:7@") || strings.Contains(got, ",") {
		t.Errorf("formatMark of %d oids = %q, want a digest", len(many), got)
	}
	_, r3, err := parseMark("x3:7@" + few)
	if err != nil {
		t.Fatal(err)
	}
	_, r2, err := parseMark("x2:7@" + relationDigest(few))
	if err != nil {
		t.Fatal(err)
	}
	s := &Source{}
	if !s.covers(context.Background(), nil, r3, 7, r2) || !s.covers(context.Background(), nil, r2, 7, r3) {
		t.Errorf("an x2 and an x3 mark of one relation do not cover each other")
	}
	_, fewer, _ := parseMark("x3:7@16384,16390")
	if !s.covers(context.Background(), nil, fewer, 7, r3) {
		t.Errorf("a dropped partition: the earlier mark does not cover the relation")
	}
	_, other, _ := parseMark("x3:7@16999,16390,16395")
	if s.covers(context.Background(), nil, other, 7, r3) {
		t.Errorf("another table under the name is covered")
	}
	for _, bad := range []string{"x3:7@16384,abc", "x3:7@", "x3:7@-1", "x3:7@016384"} {
		if _, _, err := parseMark(bad); err == nil {
			t.Errorf("mark %q accepted", bad)
		} else if stop := (*connector.StopError)(nil); !errors.As(err, &stop) {
			t.Errorf("mark %q: %v is not a safety stop", bad, err)
		}
	}
}
