package integration

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"regexp"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// typedDDL has a uuid id and one column of each type with an encoding of
// its own (docs/design.md, "Records").
const typedDDL = `CREATE TABLE typed (
	id uuid PRIMARY KEY,
	updated_at timestamptz NOT NULL,
	deleted_at timestamptz,
	n numeric,
	j jsonb,
	b bytea,
	tags text[],
	ts timestamptz,
	u uuid,
	i integer,
	f double precision,
	ok boolean
);
CREATE INDEX typed_updated_at_id ON typed (updated_at, id)`

const (
	uuidFull  = "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"
	uuidNulls = "00000000-0000-0000-0000-000000000002"
	uuidGone  = "00000000-0000-0000-0000-000000000003"
)

func seedTyped(r *rig.Rig) {
	r.T.Helper()
	r.Exec(`INSERT INTO typed VALUES (
		'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11', '2024-05-01 12:00:00.123456+00', NULL,
		12345678901234567890.123450,
		'{"b": [1, 2.5, "x"], "a": {"nested": true}, "s": "q\"uote"}',
		'\x00ff10',
		ARRAY['a', 'b c', NULL, 'q"uote', 'NULL'],
		'2024-05-01 14:00:00.000001+02',
		'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11',
		-7, 0.1, true)`)
	r.Exec(`INSERT INTO typed (id, updated_at) VALUES ($1, '2024-05-01 12:00:00.123457+00')`, uuidNulls)
	r.Exec(`INSERT INTO typed (id, updated_at, n) VALUES ($1, '2024-05-01 12:00:00.123458+00', 1)`, uuidGone)
}

// TestValueEncodingRoundTrip: a row with numeric, jsonb, bytea, text[],
// timestamptz with microseconds and uuid goes through Kafka unchanged: the
// record value is byte for byte what the source encodes, valid JSON, with
// the docs/design.md, "Records" encodings.
func TestValueEncodingRoundTrip(t *testing.T) {
	r := newRig(t, typedDDL, "typed")
	seedTyped(r)
	r.Once(r.Src, connector.Config{PageSize: 2})
	st := r.AssertTable() // byte-for-byte equal to the source's encoding
	rig.AssertNoDupes(t, st)

	got := st.Live[uuidFull]
	const want = `{"id":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11","updated_at":"2024-05-01T12:00:00.123456Z","deleted_at":null,` +
		`"n":"12345678901234567890.123450",` +
		`"j":{"a": {"nested": true}, "b": [1, 2.5, "x"], "s": "q\"uote"},` +
		`"b":"AP8Q",` +
		`"tags":["a","b c",null,"q\"uote","NULL"],` +
		`"ts":"2024-05-01T12:00:00.000001Z",` +
		`"u":"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",` +
		`"i":-7,"f":0.1,"ok":true}`
	if string(got.Value) != want {
		t.Errorf("value\n got %s\nwant %s", got.Value, want)
	}
	if !json.Valid(got.Value) {
		t.Fatalf("value is not valid JSON: %s", got.Value)
	}
	var v map[string]any
	dec := json.NewDecoder(bytes.NewReader(got.Value))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	timestampRE := regexp.MustCompile(`^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{6}Z$`)
	uuidRE := regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)
	if n, ok := v["n"].(string); !ok || n != "12345678901234567890.123450" {
		t.Errorf("numeric: %#v, want the exact decimal text as a string", v["n"])
	}
	if j, ok := v["j"].(map[string]any); !ok || j["a"].(map[string]any)["nested"] != true {
		t.Errorf("jsonb: %#v, want the document embedded", v["j"])
	}
	if s, ok := v["b"].(string); !ok {
		t.Errorf("bytea: %#v, want a base64 string", v["b"])
	} else if raw, err := base64.StdEncoding.DecodeString(s); err != nil || !bytes.Equal(raw, []byte{0x00, 0xff, 0x10}) {
		t.Errorf("bytea: %q decodes to %x (%v), want 00ff10", s, raw, err)
	}
	if a, ok := v["tags"].([]any); !ok || len(a) != 5 || a[2] != nil || a[3] != `q"uote` || a[4] != "NULL" {
		t.Errorf("text[]: %#v", v["tags"])
	}
	for _, col := range []string{"updated_at", "ts"} {
		s, _ := v[col].(string)
		if !timestampRE.MatchString(s) {
			t.Errorf("%s: %#v is not RFC 3339 UTC with six fractional digits", col, v[col])
		}
	}
	if ts, err := schemas.ParseTime(v["ts"].(string)); err != nil || !ts.Equal(time.Date(2024, 5, 1, 12, 0, 0, 1000, time.UTC)) {
		t.Errorf("timestamptz: %v (%v), want 2024-05-01T12:00:00.000001Z", ts, err)
	}
	for _, col := range []string{"id", "u"} {
		if s, _ := v[col].(string); !uuidRE.MatchString(s) || s != uuidFull {
			t.Errorf("uuid %s: %#v", col, v[col])
		}
	}
	if i, ok := v["i"].(json.Number); !ok || i.String() != "-7" {
		t.Errorf("integer: %#v", v["i"])
	}
	if h := got.Headers[schemas.HeaderUpdatedAt]; h != "2024-05-01T12:00:00.123456Z" {
		t.Errorf("updated_at header %q", h)
	}

	nulls := string(st.Live[uuidNulls].Value)
	const wantNulls = `{"id":"00000000-0000-0000-0000-000000000002","updated_at":"2024-05-01T12:00:00.123457Z","deleted_at":null,` +
		`"n":null,"j":null,"b":null,"tags":null,"ts":null,"u":null,"i":null,"f":null,"ok":null}`
	if nulls != wantNulls {
		t.Errorf("all-NULL row\n got %s\nwant %s", nulls, wantNulls)
	}
}

// TestRecordsMatchSchemas validates every record the connector wrote (data
// values and headers, upserts and tombstones, and every checkpoint in the
// offsets topic) against the JSON Schemas in schemas/.
func TestRecordsMatchSchemas(t *testing.T) {
	r := newRig(t, typedDDL, "typed")
	seedTyped(r)
	cfg := connector.Config{PageSize: 1, TxnMaxRecords: 2, Margin: time.Hour}
	r.Once(r.Src, cfg)
	r.Exec(`UPDATE typed SET deleted_at = '2024-05-01 13:00:00+00', updated_at = '2024-05-01 13:00:00+00' WHERE id = $1`, uuidGone)
	r.Exec(`UPDATE typed SET n = 'NaN', tags = '{}', updated_at = '2024-05-01 13:00:01+00' WHERE id = $1`, uuidNulls)
	r.Once(r.Src, cfg)
	st := r.AssertTable()
	rig.AssertTombstoned(t, st, uuidGone)

	ctx := context.Background()
	var upserts, deletes int
	err := fold.Scan(ctx, r.Opts, r.Topic, func(rec *kgo.Record) error {
		h := map[string]string{}
		for _, x := range rec.Headers {
			h[x.Key] = string(x.Value)
		}
		doc, _ := json.Marshal(h)
		if err := schemas.Validate(schemas.KindHeaders, doc); err != nil {
			t.Errorf("key %s offset %d: headers %s: %v", rec.Key, rec.Offset, doc, err)
		}
		if h[schemas.HeaderConnector] != r.Name {
			t.Errorf("key %s: connector header %q, want %q", rec.Key, h[schemas.HeaderConnector], r.Name)
		}
		switch {
		case rec.Value == nil:
			deletes++
			if h[schemas.HeaderOperation] != schemas.OpDelete {
				t.Errorf("key %s: tombstone with operation %q", rec.Key, h[schemas.HeaderOperation])
			}
		default:
			upserts++
			if h[schemas.HeaderOperation] != schemas.OpUpsert {
				t.Errorf("key %s: value with operation %q", rec.Key, h[schemas.HeaderOperation])
			}
			if err := schemas.Validate(schemas.KindValue, rec.Value); err != nil {
				t.Errorf("key %s offset %d: value %s: %v", rec.Key, rec.Offset, rec.Value, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if upserts != 4 || deletes != 1 {
		t.Errorf("%d upserts and %d tombstones, want 4 and 1", upserts, deletes)
	}

	var checkpoints int
	err = fold.Scan(ctx, r.Opts, r.Offsets, func(rec *kgo.Record) error {
		checkpoints++
		if err := schemas.Validate(schemas.KindCheckpoint, rec.Value); err != nil {
			t.Errorf("checkpoint at offset %d: %s: %v", rec.Offset, rec.Value, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if hist, err := r.Store().History(ctx); err != nil || len(hist) != checkpoints || checkpoints < 3 {
		t.Errorf("offsets topic: %d checkpoint records, store history %d (%v); want the same, at least 3", checkpoints, len(hist), err)
	}
}
