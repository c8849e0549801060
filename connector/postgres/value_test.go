package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/harness"
)

// TestValueEncoding pins the record value encoding of docs/design.md, "Records", type by
// type, against real PostgreSQL output.
func TestValueEncoding(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TYPE mood AS ENUM ('happy', 'sad ☹')`)
	db.Exec(t, `CREATE TYPE pair AS (a int, b text)`)
	db.Exec(t, `CREATE DOMAIN posint AS integer CHECK (VALUE > 0)`)
	db.Exec(t, `CREATE DOMAIN tags AS text[]`)

	cases := []struct {
		typ, lit, want string
	}{
		{"smallint", "-32768", `-32768`},
		{"integer", "-2147483648", `-2147483648`},
		{"bigint", "9223372036854775807", `9223372036854775807`},
		{"bigint", "0", `0`},
		{"oid", "4294967295", `4294967295`},
		{"posint", "7", `7`},
		{"real", "1.5", `1.5`},
		{"real", "-3.4e38", `-3.4e+38`},
		{"double precision", "0.1", `0.1`},
		{"double precision", "1e300", `1e+300`},
		{"double precision", "'-0'", `-0`},
		{"double precision", "'NaN'", `"NaN"`},
		{"double precision", "'Infinity'", `"Infinity"`},
		{"real", "'-Infinity'", `"-Infinity"`},
		{"numeric", "12.50", `"12.50"`},
		{"numeric(10,4)", "-0.0001", `"-0.0001"`},
		{"numeric", "'NaN'", `"NaN"`},
		{"numeric", "123456789012345678901234567890.123456789", `"123456789012345678901234567890.123456789"`},
		{"boolean", "true", `true`},
		{"boolean", "false", `false`},
		{"text", "''", `""`},
		{"text", "'héllo ☃ 😀 日本'", `"héllo ☃ 😀 日本"`},
		{"text", `E'q"uo\\te\\\\'`, `"q\"uo\\te\\\\"`},
		{"text", `E'\n\t\r\b\f\x01\x1f<>&\x7f'`, `"\n\t\r\b\f\u0001\u001f<>&` + "\x7f" + `"`},
		{"text", `'NULL'`, `"NULL"`},
		{"varchar(10)", "'abc'", `"abc"`},
		{"char(5)", "'ab'", `"ab   "`},
		{"name", "'pg_name'", `"pg_name"`},
		{`"char"`, "'x'", `"x"`},
		{"mood", "'sad ☹'", `"sad ☹"`},
		{"pair", `ROW(1, 'x "y"')`, `"(1,\"x \"\"y\"\"\")"`},
		{"timestamptz", "'2024-05-01 12:00:00.000001+00'", `"2024-05-01T12:00:00.000001Z"`},
		{"timestamptz", "'2024-05-01 14:00:00.5+02'", `"2024-05-01T12:00:00.500000Z"`},
		{"timestamptz", "'1970-01-01 00:00:00+00'", `"1970-01-01T00:00:00.000000Z"`},
		{"timestamptz", "'2262-04-11 23:47:16.854775+00'", `"2262-04-11T23:47:16.854775Z"`},
		{"timestamptz", "'1969-12-31 23:59:59.999999+00'", `"1969-12-31T23:59:59.999999Z"`},
		{"timestamptz", "'infinity'", `"infinity"`},
		{"timestamptz", "'-infinity'", `"-infinity"`},
		{"timestamptz", "'0044-03-15 12:00:00+00 BC'", `"-0043-03-15T12:00:00.000000Z"`},
		{"timestamptz", "'10000-01-01 00:00:00.25+00'", `"10000-01-01T00:00:00.250000Z"`},
		{"timestamp", "'2024-05-01 12:00:00.000001'", `"2024-05-01T12:00:00.000001Z"`},
		{"timestamp", "'2024-05-01 12:00:00'", `"2024-05-01T12:00:00.000000Z"`},
		{"timestamp", "'infinity'", `"infinity"`},
		{"date", "'2024-05-01'", `"2024-05-01"`},
		{"date", "'infinity'", `"infinity"`},
		{"time", "'12:34:56.789'", `"12:34:56.789"`},
		{"timetz", "'12:34:56+02'", `"12:34:56+02"`},
		{"interval", "'1 day 2 hours 3.5 seconds'", `"P1DT2H3.5S"`},
		{"inet", "'192.168.0.1/24'", `"192.168.0.1/24"`},
		{"cidr", "'10.0.0.0/8'", `"10.0.0.0/8"`},
		{"macaddr", "'08:00:2B:01:02:03'", `"08:00:2b:01:02:03"`},
		{"uuid", "'A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11'", `"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"`},
		{"bytea", `'\x00ff10'`, `"AP8Q"`},
		{"bytea", `''`, `""`},
		{"bytea", `'\x6869'`, `"aGk="`},
		{"json", `'{"b": 1,  "a": [1, 2]}'`, `{"b": 1,  "a": [1, 2]}`},
		{"jsonb", `'{"b": {"c": [1, null, "x\"y"]}, "a": "é"}'`, `{"a": "é", "b": {"c": [1, null, "x\"y"]}}`},
		{"jsonb", `'"str"'`, `"str"`},
		{"jsonb", `'null'`, `null`},
		{"jsonb", `'[]'`, `[]`},
		{"int4range", "'[1,5)'", `"[1,5)"`},
		{"point", "'(1,2)'", `"(1,2)"`},
		{"bit(3)", "B'101'", `"101"`},
		{"integer[]", "'{}'", `[]`},
		{"integer[]", "'{1,NULL,-3}'", `[1,null,-3]`},
		{"integer[]", "'[0:1]={5,6}'", `[5,6]`},
		{"integer[][]", "'{{1,2},{3,4}}'", `[[1,2],[3,4]]`},
		{"integer[]", "'[-1:0][2:3]={{1,2},{3,4}}'", `[[1,2],[3,4]]`},
		{"integer[]", "'{{{1},{2}},{{3},{NULL}}}'", `[[[1],[2]],[[3],[null]]]`},
		{"bigint[]", "'{9223372036854775807}'", `[9223372036854775807]`},
		{"text[]", `ARRAY['NULL', NULL, 'a,b', 'q"uote', 'back\slash', '', ' sp ', '{x}', 'héllo😀', 'null']`,
			`["NULL",null,"a,b","q\"uote","back\\slash",""," sp ","{x}","héllo😀","null"]`},
		{"text[][]", `'{{a,"b c"},{NULL,"\\"}}'`, `[["a","b c"],[null,"\\"]]`},
		{"varchar[]", `'{x,y}'`, `["x","y"]`},
		{"tags", `'{t1,t2}'`, `["t1","t2"]`},
		{"bytea[]", `ARRAY['\x01ff'::bytea, NULL, '']`, `["Af8=",null,""]`},
		{"timestamptz[]", `ARRAY['2024-05-01 12:00:00.000001+00'::timestamptz, 'infinity', NULL]`, `["2024-05-01T12:00:00.000001Z","infinity",null]`},
		{"timestamp[]", `ARRAY['1970-01-01 00:00:00'::timestamp]`, `["1970-01-01T00:00:00.000000Z"]`},
		{"date[]", `'{2024-05-01}'`, `["2024-05-01"]`},
		{"jsonb[]", `ARRAY['{"a": [1, "}"]}'::jsonb, '"s"', 'null', NULL]`, `[{"a": [1, "}"]},"s",null,null]`},
		{"json[]", `ARRAY['{"x":1}'::json]`, `[{"x":1}]`},
		{"boolean[]", `'{t,f,NULL}'`, `[true,false,null]`},
		{"numeric[]", `'{1.50,NaN,-2}'`, `["1.50","NaN","-2"]`},
		{"double precision[]", `'{1.5,NaN,-Infinity,1e-7}'`, `[1.5,"NaN","-Infinity",1e-07]`},
		{"uuid[]", `'{A0EEBC99-9C0B-4EF8-BB6D-6BB9BD380A11}'`, `["a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"]`},
		{"mood[]", `'{happy,"sad ☹"}'`, `["happy","sad ☹"]`},
		{"box[]", `ARRAY[box '(1,1),(0,0)', box '(3,3),(2,2)']`, `["(1,1),(0,0)","(3,3),(2,2)"]`},
		{"pair[]", `ARRAY[ROW(1,'a b')::pair, NULL]`, `["(1,\"a b\")",null]`},
		{"int2vector", `'1 2'`, `"1 2"`},
	}

	var cols, lits, names []string
	for i, c := range cases {
		name := fmt.Sprintf("c%02d", i)
		names = append(names, name)
		cols = append(cols, fmt.Sprintf("%s %s", name, c.typ))
		lits = append(lits, fmt.Sprintf("(%s)::%s", c.lit, c.typ))
	}
	db.Exec(t, fmt.Sprintf("CREATE TABLE v (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, %s)", strings.Join(cols, ", ")))
	db.Exec(t, fmt.Sprintf("INSERT INTO v VALUES (1, '2024-01-01 00:00:00+00', %s)", strings.Join(lits, ", ")))
	db.Exec(t, "INSERT INTO v (id, updated_at) VALUES (2, '2024-01-02 00:00:00+00')")

	cfg := config(db, "v")
	cfg.Columns = names
	src := open(t, cfg)
	p, err := src.Page(context.Background(), connector.PageRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 2 {
		t.Fatalf("got %d rows, want 2", len(p.Rows))
	}

	// Exact bytes, column by column, then the whole object.
	got := p.Rows[0].Value
	if !json.Valid(got) {
		t.Fatalf("value is not valid JSON: %s", got)
	}
	var want strings.Builder
	want.WriteByte('{')
	for i, c := range cases {
		if i > 0 {
			want.WriteByte(',')
		}
		fmt.Fprintf(&want, "%q:%s", names[i], c.want)
		if !json.Valid([]byte(c.want)) {
			t.Errorf("case %d (%s): expected value %s is not valid JSON", i, c.typ, c.want)
		}
	}
	want.WriteByte('}')
	var perCol map[string]json.RawMessage
	if err := json.Unmarshal(got, &perCol); err != nil {
		t.Fatal(err)
	}
	for i, c := range cases {
		if g := string(perCol[names[i]]); g != c.want {
			t.Errorf("%s %s = %s: got %s, want %s", names[i], c.typ, c.lit, g, c.want)
		}
	}
	if string(got) != want.String() {
		t.Errorf("whole value:\n got %s\nwant %s", got, want.String())
	}

	// The all-NULL row: every column is JSON null, keys in column order.
	var nulls strings.Builder
	nulls.WriteByte('{')
	for i, n := range names {
		if i > 0 {
			nulls.WriteByte(',')
		}
		fmt.Fprintf(&nulls, "%q:null", n)
	}
	nulls.WriteByte('}')
	if got := string(p.Rows[1].Value); got != nulls.String() {
		t.Errorf("NULL row:\n got %s\nwant %s", got, nulls.String())
	}
}

// TestValueDefaultColumns: without Columns, every column in ordinal order
// (including id and updated_at), and keys are escaped column names.
func TestValueDefaultColumns(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE "T" (id bigint PRIMARY KEY, "weird ""col""" text, updated_at timestamptz NOT NULL, dropped int, n int)`)
	db.Exec(t, `ALTER TABLE "T" DROP COLUMN dropped`)
	db.Exec(t, `INSERT INTO "T" VALUES (42, 'x', '2024-05-01 12:00:00.000001+00', 3)`)
	src := open(t, config(db, "T"))
	p, err := src.Page(context.Background(), connector.PageRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Rows) != 1 {
		t.Fatalf("rows %d", len(p.Rows))
	}
	r := p.Rows[0]
	want := `{"id":42,"weird \"col\"":"x","updated_at":"2024-05-01T12:00:00.000001Z","n":3}`
	if string(r.Value) != want {
		t.Errorf("value\n got %s\nwant %s", r.Value, want)
	}
	if r.ID != "42" || r.Deleted || !r.UpdatedAt.Equal(time.Date(2024, 5, 1, 12, 0, 0, 1000, time.UTC)) || r.UpdatedAt.Location() != time.UTC {
		t.Errorf("row %+v", r)
	}
}

// TestValueKeyColumns: the id and updated_at columns of the value are the
// row's own, wherever they stand in the column list, for every id type,
// in both protocols (simple_protocol returns every column as text), in a
// page and in a key-order load page, and in a non-UTC session.
func TestValueKeyColumns(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE tb (n int, "Upd" timestamptz NOT NULL, "the id" bigint PRIMARY KEY)`)
	db.Exec(t, `CREATE TABLE tt (id text PRIMARY KEY, updated_at timestamptz NOT NULL, n int)`)
	db.Exec(t, `CREATE TABLE tu (updated_at timestamptz NOT NULL, id uuid PRIMARY KEY)`)
	db.Exec(t, `INSERT INTO tb VALUES (1, '2024-05-01 12:00:00.000001+00', -7), (NULL, '1999-12-31 23:59:59.999999-03:30', 9007199254740993)`)
	db.Exec(t, `INSERT INTO tt VALUES (e'it\'s "q" \\ \u00e9', '2024-05-01 12:00:00+00', 1), ('', '0001-01-01 00:00:00+00', 2)`)
	db.Exec(t, `INSERT INTO tu VALUES ('9999-12-31 23:59:59.5+00', '0e37df36-f698-11e6-8dd4-cb9ced3df976')`)
	cases := []struct {
		table, idCol, uaCol string
		columns             []string
		want                map[string]string // id -> value
	}{
		{"tb", "the id", "Upd", nil, map[string]string{
			"-7":               `{"n":1,"Upd":"2024-05-01T12:00:00.000001Z","the id":-7}`,
			"9007199254740993": `{"n":null,"Upd":"2000-01-01T03:29:59.999999Z","the id":9007199254740993}`,
		}},
		{"tb", "the id", "Upd", []string{"the id", "n"}, map[string]string{
			"-7":               `{"the id":-7,"n":1}`,
			"9007199254740993": `{"the id":9007199254740993,"n":null}`,
		}},
		{"tb", "the id", "Upd", []string{"Upd", "the id"}, map[string]string{
			"-7":               `{"Upd":"2024-05-01T12:00:00.000001Z","the id":-7}`,
			"9007199254740993": `{"Upd":"2000-01-01T03:29:59.999999Z","the id":9007199254740993}`,
		}},
		{"tb", "the id", "Upd", []string{"n"}, map[string]string{"-7": `{"n":1}`, "9007199254740993": `{"n":null}`}},
		{"tt", "id", "updated_at", nil, map[string]string{
			`it's "q" \ é`: `{"id":"it's \"q\" \\ é","updated_at":"2024-05-01T12:00:00.000000Z","n":1}`,
			"":             `{"id":"","updated_at":"0001-01-01T00:00:00.000000Z","n":2}`,
		}},
		{"tu", "id", "updated_at", nil, map[string]string{
			"0e37df36-f698-11e6-8dd4-cb9ced3df976": `{"updated_at":"9999-12-31T23:59:59.500000Z","id":"0e37df36-f698-11e6-8dd4-cb9ced3df976"}`,
		}},
	}
	ctx := context.Background()
	for _, c := range cases {
		for _, dsn := range []string{"", "&default_query_exec_mode=simple_protocol", "&timezone=Asia/Kolkata"} {
			name := fmt.Sprintf("%s %v %s", c.table, c.columns, dsn)
			cfg := config(db, c.table)
			cfg.DSN += dsn
			cfg.IDColumn, cfg.UpdatedAtColumn, cfg.Columns = c.idCol, c.uaCol, c.columns
			src := open(t, cfg)
			p, err := src.Page(ctx, connector.PageRequest{Limit: 10})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			l, err := src.LoadPage(ctx, connector.LoadRequest{Limit: 10})
			if err != nil {
				t.Fatalf("%s: load: %v", name, err)
			}
			for what, rows := range map[string][]connector.Row{"page": p.Rows, "load": l.Rows} {
				if len(rows) != len(c.want) {
					t.Errorf("%s %s: %d rows, want %d", name, what, len(rows), len(c.want))
				}
				for _, r := range rows {
					if w, ok := c.want[r.ID]; !ok || string(r.Value) != w {
						t.Errorf("%s %s: id %q value\n got %s\nwant %s", name, what, r.ID, r.Value, w)
					}
				}
			}
		}
	}
}
