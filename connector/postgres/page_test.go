package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// TestPageTiesAndMicros walks rows that tie on updated_at and rows that
// differ only in the sixth decimal, with page boundaries landing everywhere.
func TestPageTiesAndMicros(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	// Five rows share one updated_at; then ids 6 and 7 one microsecond
	// apart; id 0 sorts last despite the smallest id.
	for id := 1; id <= 5; id++ {
		db.Exec(t, "INSERT INTO t VALUES ($1, '2024-05-01 12:00:00.000001+00', 'tie')", id)
	}
	db.Exec(t, "INSERT INTO t VALUES (7, '2024-05-01 12:00:00.000002+00', 'a')")
	db.Exec(t, "INSERT INTO t VALUES (6, '2024-05-01 12:00:00.000003+00', 'b')")
	db.Exec(t, "INSERT INTO t VALUES (0, '2024-05-01 12:00:00.000004+00', 'c')")
	src := open(t, config(db, "t"))

	for _, limit := range []int{1, 2, 3, 1000} {
		t.Run(fmt.Sprint("limit", limit), func(t *testing.T) {
			rows := walk(t, src, time.Time{}, limit)
			if got, want := ids(rows), "1,2,3,4,5,7,6,0"; got != want {
				t.Fatalf("ids %s, want %s", got, want)
			}
			wantTS := []int{1, 1, 1, 1, 1, 2, 3, 4}
			for i, r := range rows {
				if want := t0.Add(time.Duration(wantTS[i]) * time.Microsecond); !r.UpdatedAt.Equal(want) || r.UpdatedAt.Location() != time.UTC {
					t.Errorf("row %s updated_at %s, want %s", r.ID, schemas.FormatTime(r.UpdatedAt), schemas.FormatTime(want))
				}
				if r.Deleted || r.Value == nil {
					t.Errorf("row %s: deleted %v value %s", r.ID, r.Deleted, r.Value)
				}
			}
			if string(rows[5].Value) != `{"id":7,"updated_at":"2024-05-01T12:00:00.000002Z","v":"a"}` {
				t.Errorf("value %s", rows[5].Value)
			}
		})
	}
}

// TestPageShortIsNotEnd: a page shorter than the limit is not the end; only
// an empty page is, and a row added after a short page is still read.
func TestPageShortIsNotEnd(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "INSERT INTO t VALUES (1, $1), (2, $1)", t0)
	src := open(t, config(db, "t"))
	ctx := context.Background()

	p, err := src.Page(ctx, connector.PageRequest{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if p.End || len(p.Rows) != 2 || p.Next == "" {
		t.Fatalf("short page: End %v rows %d next %q", p.End, len(p.Rows), p.Next)
	}
	db.Exec(t, "INSERT INTO t VALUES (3, $1)", t0)
	p2, err := src.Page(ctx, connector.PageRequest{Cursor: p.Next, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if p2.End || ids(p2.Rows) != "3" {
		t.Fatalf("after short page: End %v ids %q", p2.End, ids(p2.Rows))
	}
	p3, err := src.Page(ctx, connector.PageRequest{Cursor: p2.Next, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	if !p3.End || len(p3.Rows) != 0 {
		t.Fatalf("empty page: End %v rows %d", p3.End, len(p3.Rows))
	}
	// An empty table ends at once.
	db.Exec(t, "DELETE FROM t")
	p4, err := src.Page(ctx, connector.PageRequest{Limit: 10})
	if err != nil || !p4.End {
		t.Fatalf("empty table: %+v %v", p4, err)
	}
}

// TestPageIDTypes walks text, varchar, uuid, integer and smallint ids;
// text ids must follow the column's collation exactly as ORDER BY does.
func TestPageIDTypes(t *testing.T) {
	db := harness.NewDB(t)
	var icu bool
	if err := db.Pool.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_collation WHERE collname = 'und-x-icu')`).Scan(&icu); err != nil || !icu {
		t.Fatalf("collation und-x-icu is needed (PostgreSQL with ICU): %v", err)
	}
	textIDs := []string{"a", "B", "b", "A", "_", "a:b", "ä", "10", "9", ""}
	cases := []struct {
		name, typ string
		ids       []string
		want      string // expected order, "" = as the database orders
	}{
		// In C order uppercase sorts before lowercase; ICU interleaves them.
		{"text_c", `text COLLATE "C"`, textIDs, ",10,9,A,B,_,a,a:b,b,ä"},
		{"text_icu", `text COLLATE "und-x-icu"`, textIDs, ",_,10,9,a,A,ä,a:b,b,B"},
		{"varchar_icu", `varchar(10) COLLATE "und-x-icu"`, textIDs, ",_,10,9,a,A,ä,a:b,b,B"},
		{"uuid", "uuid", []string{"ffffffff-0000-0000-0000-000000000000", "00000000-0000-0000-0000-000000000001", "7fffffff-ffff-ffff-ffff-ffffffffffff", "80000000-0000-0000-0000-000000000000"},
			"00000000-0000-0000-0000-000000000001,7fffffff-ffff-ffff-ffff-ffffffffffff,80000000-0000-0000-0000-000000000000,ffffffff-0000-0000-0000-000000000000"},
		{"integer", "integer", []string{"-2147483648", "2147483647", "0", "-1", "10", "9"}, "-2147483648,-1,0,9,10,2147483647"},
		{"smallint", "smallint", []string{"-32768", "32767", "2", "10"}, "-32768,2,10,32767"},
		{"bigint", "bigint", []string{"-9223372036854775808", "9223372036854775807", "100", "99"}, "-9223372036854775808,99,100,9223372036854775807"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db.Exec(t, fmt.Sprintf("CREATE TABLE %s (id %s PRIMARY KEY, updated_at timestamptz NOT NULL)", c.name, c.typ))
			for _, id := range c.ids {
				db.Exec(t, fmt.Sprintf("INSERT INTO %s VALUES ($1::text::%s, $2)", c.name, strings.Fields(c.typ)[0]), id, t0)
			}
			if got := dbOrder(t, db, c.name); got != c.want {
				t.Fatalf("database order %q, test expects %q", got, c.want)
			}
			src := open(t, config(db, c.name))
			for _, limit := range []int{1, 2, 1000} {
				if got := ids(walk(t, src, time.Time{}, limit)); got != c.want {
					t.Errorf("limit %d: walked %q, want %q", limit, got, c.want)
				}
			}
		})
	}
}

// TestPageDeletedAnchor: the cursor row is deleted between pages; the seek
// is strictly greater than its key, so the walk continues.
func TestPageDeletedAnchor(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	for id := 1; id <= 5; id++ {
		db.Exec(t, "INSERT INTO t VALUES ($1, $2)", id, t0)
	}
	src := open(t, config(db, "t"))
	ctx := context.Background()
	p, err := src.Page(ctx, connector.PageRequest{Limit: 2})
	if err != nil || ids(p.Rows) != "1,2" {
		t.Fatalf("first page %q %v", ids(p.Rows), err)
	}
	db.Exec(t, "DELETE FROM t WHERE id IN (2, 3)")
	p, err = src.Page(ctx, connector.PageRequest{Cursor: p.Next, Limit: 2})
	if err != nil || ids(p.Rows) != "4,5" {
		t.Fatalf("after deleting the anchor: %q %v", ids(p.Rows), err)
	}
}

// TestPageSinceInclusive: the first page starts at updated_at >= Since,
// never >, to the microsecond.
func TestPageSinceInclusive(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	for i := range 4 {
		db.Exec(t, "INSERT INTO t VALUES ($1, $2)", i, t0.Add(time.Duration(i)*time.Microsecond))
	}
	src := open(t, config(db, "t"))
	for _, c := range []struct {
		since time.Time
		want  string
	}{
		{time.Time{}, "0,1,2,3"},
		{t0.Add(-time.Hour), "0,1,2,3"},
		{t0.Add(1 * time.Microsecond), "1,2,3"},
		{t0.Add(3 * time.Microsecond), "3"},
		{t0.Add(4 * time.Microsecond), ""},
	} {
		for _, limit := range []int{1, 10} {
			if got := ids(walk(t, src, c.since, limit)); got != c.want {
				t.Errorf("since %s limit %d: %q, want %q", schemas.FormatTime(c.since), limit, got, c.want)
			}
		}
	}
}

// TestPageFilterAndSoftDelete: the filter narrows every page; soft-deleted
// rows come out Deleted with a nil Value.
func TestPageFilterAndSoftDelete(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at timestamptz, tenant text)")
	for id := 1; id <= 6; id++ {
		tenant := "a"
		if id%2 == 0 {
			tenant = "b"
		}
		db.Exec(t, "INSERT INTO t VALUES ($1, $2, NULL, $3)", id, t0.Add(time.Duration(id)*time.Second), tenant)
	}
	db.Exec(t, "UPDATE t SET deleted_at = now() WHERE id IN (3, 4)")

	cfg := config(db, "t")
	cfg.DeletedAtColumn = "deleted_at"
	cfg.Columns = []string{"tenant", "id"}
	cfg.Filter = "tenant = 'a' OR (id = 4) -- tenant a, and one of b"
	src := open(t, cfg)
	rows := walk(t, src, time.Time{}, 1)
	if got := ids(rows); got != "1,3,4,5" {
		t.Fatalf("filtered ids %q, want 1,3,4,5", got)
	}
	for _, r := range rows {
		del := r.ID == "3" || r.ID == "4"
		if r.Deleted != del || (r.Value == nil) != del {
			t.Errorf("row %s: Deleted %v Value %s", r.ID, r.Deleted, r.Value)
		}
	}
	if string(rows[0].Value) != `{"tenant":"a","id":1}` {
		t.Errorf("value %s", rows[0].Value)
	}
}

// TestPageMalformedCursor: a cursor this source did not write is refused
// with a message that says so, never interpreted.
func TestPageMalformedCursor(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "INSERT INTO t VALUES (1, $1)", t0)
	src := open(t, config(db, "t"))
	for _, c := range []string{
		"garbage", "v2:1:1", "v1:", "v1:123", "v1:abc:1", "v1:+5:1", "v1:01:1",
		"v1:1714564800000000:abc", "v1:1714564800000000:1 OR 1=1", "v1:1714564800000000:99999999999999999999",
		"eyJjdXJzb3IiOjF9",
	} {
		_, err := src.Page(context.Background(), connector.PageRequest{Cursor: c, Limit: 10})
		if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("cursor %q from the checkpoint is not a PostgreSQL-source cursor", c)) {
			t.Errorf("cursor %q: err %v", c, err)
		}
		// A retry cannot fix a checkpoint's cursor: a safety stop (exit
		// 3), not a failure retried for ever.
		if stop := (*connector.StopError)(nil); !errors.As(err, &stop) {
			t.Errorf("cursor %q: %T is not a safety stop", c, err)
		}
	}
	// A well-formed cursor works and resumes after its key.
	p, err := src.Page(context.Background(), connector.PageRequest{Cursor: fmt.Sprintf("v1:%d:0", t0.UnixMicro()), Limit: 10})
	if err != nil || ids(p.Rows) != "1" {
		t.Fatalf("valid cursor: %q %v", ids(p.Rows), err)
	}
	if p.Next != fmt.Sprintf("v1:%d:1", t0.UnixMicro()) {
		t.Errorf("next %q", p.Next)
	}
	if _, err := src.Page(context.Background(), connector.PageRequest{Limit: 0}); err == nil {
		t.Error("limit 0 accepted")
	}
}

// TestPageNullUpdatedAt: a NULL updated_at that slipped in after startup
// stops the page with the row's id rather than being skipped.
func TestPageNullUpdatedAt(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id text PRIMARY KEY, updated_at timestamptz NOT NULL)")
	src := open(t, config(db, "t"))
	db.Exec(t, "ALTER TABLE t ALTER COLUMN updated_at DROP NOT NULL")
	db.Exec(t, "INSERT INTO t VALUES ('row-7', NULL)")
	_, err := src.Page(context.Background(), connector.PageRequest{Limit: 10})
	if err == nil || !strings.Contains(err.Error(), `row id "row-7" has a NULL "updated_at"`) {
		t.Fatalf("err %v", err)
	}
}

// TestNewRefusesBadConfig: configuration problems are ErrBadConfig.
func TestNewRefusesBadConfig(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	ctx := context.Background()
	for name, cfg := range map[string]postgres.Config{
		"no table":       {DSN: db.URL, Schema: db.Schema},
		"missing table":  config(db, "nope"),
		"bad filter":     func() postgres.Config { c := config(db, "t"); c.Filter = "no_such_col = 1"; return c }(),
		"bad syntax":     func() postgres.Config { c := config(db, "t"); c.Filter = "1 = 1) OR (true"; return c }(),
		"missing column": func() postgres.Config { c := config(db, "t"); c.Columns = []string{"id", "nope"}; return c }(),
		"bad dsn":        {DSN: "postgres://%zz", Table: "t"},
	} {
		src, err := postgres.New(ctx, cfg)
		if err == nil {
			src.Close()
			t.Errorf("%s: accepted", name)
			continue
		}
		if !errors.Is(err, postgres.ErrBadConfig) {
			t.Errorf("%s: %v is not ErrBadConfig", name, err)
		}
	}
}

// TestPageExecModes: the walk and the values are the same whatever query
// exec mode the DSN asks for (simple_protocol returns every column as text).
func TestPageExecModes(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id text PRIMARY KEY, updated_at timestamptz NOT NULL, b bytea, a int[], f float8)")
	for i, id := range []string{"b", "a", "c:d", "it's"} {
		db.Exec(t, "INSERT INTO t VALUES ($1, $2, '\\x00ff', '{1,NULL}', 0.1)", id, t0.Add(time.Duration(i%2)*time.Microsecond))
	}
	var want []connector.Row
	for _, mode := range []string{"", "cache_statement", "cache_describe", "describe_exec", "exec", "simple_protocol"} {
		cfg := config(db, "t")
		if mode != "" {
			cfg.DSN += "&default_query_exec_mode=" + mode
		}
		src := open(t, cfg)
		got := walk(t, src, t0, 1)
		if mode == "" {
			want = got
			if ids(got) != "b,c:d,a,it's" {
				t.Fatalf("ids %q", ids(got))
			}
			continue
		}
		if len(got) != len(want) {
			t.Fatalf("%s: %d rows, want %d", mode, len(got), len(want))
		}
		for i := range got {
			if got[i].ID != want[i].ID || !got[i].UpdatedAt.Equal(want[i].UpdatedAt) || string(got[i].Value) != string(want[i].Value) {
				t.Errorf("%s: row %d = %+v (%s), want %+v (%s)", mode, i, got[i], got[i].Value, want[i], want[i].Value)
			}
		}
	}
}

// TestPageInfiniteUpdatedAt: an updated_at of infinity has no place in the
// change order; the page fails naming the row.
func TestPageInfiniteUpdatedAt(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "INSERT INTO t VALUES (9, 'infinity')")
	src := open(t, config(db, "t"))
	_, err := src.Page(context.Background(), connector.PageRequest{Limit: 10})
	if err == nil || !strings.Contains(err.Error(), `row id "9"`) || !strings.Contains(err.Error(), "infinity") {
		t.Fatalf("err %v", err)
	}
}

// TestReshapeIgnoresHarmlessChanges: a change the signature sees but that
// leaves the requirements met and the records alike (a value column's
// NOT NULL dropped, a unique index added) is no schema change.
func TestReshapeIgnoresHarmlessChanges(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text NOT NULL)")
	src := open(t, config(db, "t"))
	ctx := context.Background()
	for _, ddl := range []string{"ALTER TABLE t ALTER COLUMN v DROP NOT NULL", "CREATE UNIQUE INDEX ON t (v)", ""} {
		if ddl != "" {
			db.Exec(t, ddl)
		}
		if c, err := src.Reshape(ctx); c != nil || err != nil {
			t.Errorf("%q: Reshape = %+v, %v; want no change", ddl, c, err)
		}
	}
	db.Exec(t, "ALTER TABLE t ADD COLUMN w int")
	if c, err := src.Reshape(ctx); err != nil || c == nil || len(c.Added) != 1 {
		t.Errorf("an added column: Reshape = %+v, %v", c, err)
	}
}

// TestReshapeNowReadsShapeAndClock: ReshapeNow, which begins every pass,
// is Reshape and Now in one statement: it sees what Reshape sees, and its
// time is the server's clock when it ran.
func TestReshapeNowReadsShapeAndClock(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	src := open(t, config(db, "t"))
	ctx := context.Background()
	now := func() time.Time {
		t.Helper()
		n, err := src.Now(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	before := now()
	c, at, err := src.ReshapeNow(ctx)
	after := now()
	if err != nil || c != nil {
		t.Fatalf("an unchanged table: ReshapeNow = %+v, %v", c, err)
	}
	if at.Before(before) || at.After(after) || at.Location() != time.UTC {
		t.Errorf("ReshapeNow's clock %v is not the server's between %v and %v (in UTC)", at, before, after)
	}
	db.Exec(t, "ALTER TABLE t ADD COLUMN w int")
	if c, _, err := src.ReshapeNow(ctx); err != nil || c == nil || len(c.Added) != 1 || c.Added[0] != "w" {
		t.Errorf("an added column: ReshapeNow = %+v, %v", c, err)
	}
	if c, _, err := src.ReshapeNow(ctx); err != nil || c != nil {
		t.Errorf("after the change: ReshapeNow = %+v, %v; want no change", c, err)
	}
	db.Exec(t, "DROP TABLE t")
	var stop *connector.StopError
	if _, _, err := src.ReshapeNow(ctx); !errors.As(err, &stop) {
		t.Errorf("the table dropped: ReshapeNow = %v; want a safety stop", err)
	}
}

// TestTypeChangeDuringAPass: a column retyped between two pages of a pass
// must not be encoded by its old type (a number kind would paste text as
// is, an invalid JSON value). The page fails instead, and the next pass,
// which starts by reshaping, reads it by its new type.
func TestTypeChangeDuringAPass(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, n int)")
	db.Exec(t, "INSERT INTO t SELECT g, $1::timestamptz + g * interval '1 second', g FROM generate_series(1, 4) g", t0)
	src := open(t, config(db, "t"))
	ctx := context.Background()
	p, err := src.Page(ctx, connector.PageRequest{Since: t0, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(t, "ALTER TABLE t ALTER COLUMN n TYPE text USING 'A-' || n")
	for _, req := range []connector.PageRequest{{Since: t0, Cursor: p.Next, Limit: 2}, {Since: t0, Limit: 4}} {
		q, err := src.Page(ctx, req)
		if err == nil {
			for _, r := range q.Rows {
				if !json.Valid(r.Value) {
					t.Fatalf("invalid JSON published for id %s: %s", r.ID, r.Value)
				}
			}
			t.Fatalf("a page read the retyped column by its old type without an error: %d rows", len(q.Rows))
		}
		if !strings.Contains(err.Error(), `"n"`) {
			t.Errorf("the error does not name the column: %v", err)
		}
	}
	c, err := src.Reshape(ctx)
	if err != nil || c == nil || len(c.Retyped) != 1 {
		t.Fatalf("Reshape = %+v, %v", c, err)
	}
	q, err := src.Page(ctx, connector.PageRequest{Since: t0, Limit: 4})
	if err != nil || len(q.Rows) != 4 || string(q.Rows[3].Value) != `{"id":4,"updated_at":"2024-05-01T12:00:04.000000Z","n":"A-4"}` {
		t.Fatalf("after Reshape: %v %+v", err, q.Rows)
	}
}

// markOf is src's mark now.
func markOf(t *testing.T, src *postgres.Source) string {
	t.Helper()
	m, err := src.Mark(context.Background())
	if err != nil || m == "" {
		t.Fatalf("Mark: %q, %v", m, err)
	}
	return m
}

// skipPage is the ids of a page from t0 - 1 minute, skipping by skip.
func skipPage(t *testing.T, src *postgres.Source, skip string) string {
	t.Helper()
	p, err := src.Page(context.Background(), connector.PageRequest{Since: t0.Add(-time.Minute), Limit: 10, Skip: skip, Mark: markOf(t, src)})
	if err != nil {
		t.Fatal(err)
	}
	return ids(p.Rows)
}

// TestMarkOfAReplacedTable: a mark proves what a pass saw of one relation.
// When the table is replaced under its name (a shadow table swapped in,
// a dump restored), rows the new table got from transactions below an
// earlier pass's mark were never seen: a later pass must not skip them,
// whether it notices the swap (Reshape) or starts after it (a restart).
func TestMarkOfAReplacedTable(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "INSERT INTO t VALUES (1, $1)", t0)
	db.Exec(t, "CREATE TABLE t_new (LIKE t INCLUDING ALL)")
	db.Exec(t, "INSERT INTO t_new VALUES (1, $1), (2, $1)", t0)
	src := open(t, config(db, "t"))
	mark := func(src *postgres.Source) string { return markOf(t, src) }
	page := func(src *postgres.Source, skip string) string { return skipPage(t, src, skip) }
	m1 := mark(src)
	if got := page(src, m1); got != "" {
		t.Fatalf("the control: a pass skipping by a mark taken after every write returns %q", got)
	}
	db.Exec(t, "ALTER TABLE t RENAME TO t_old")
	db.Exec(t, "ALTER TABLE t_new RENAME TO t")
	if c, err := src.Reshape(ctx); err != nil || c == nil || !c.Replaced {
		t.Fatalf("Reshape = %+v, %v", c, err)
	}
	if got := page(src, m1); got != "1,2" {
		t.Errorf("after the swap, skipping by the old table's mark: %q, want 1,2", got)
	}
	if got := page(open(t, config(db, "t")), m1); got != "1,2" {
		t.Errorf("a restart after the swap, skipping by the old table's mark: %q, want 1,2", got)
	}
}

// TestMarkOfAPartitionedTable: partitions created, filled or dropped are
// routine upkeep of a partitioned table (pg_partman, retention), not a
// replaced table: a mark taken before still proves what a pass saw of the
// partitions it covered, so the window is not read again (the rows a pass
// settled are in no dedupe set, and would be published twice). A table
// attached as a partition holding versions below the mark was never seen:
// then nothing is skipped, as for a replaced table.
func TestMarkOfAPartitionedTable(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE pt (id bigint, updated_at timestamptz NOT NULL, PRIMARY KEY (id)) PARTITION BY RANGE (id);
		CREATE TABLE pt_1 PARTITION OF pt FOR VALUES FROM (0) TO (100);
		CREATE TABLE pt_2 PARTITION OF pt FOR VALUES FROM (100) TO (200);
		CREATE INDEX ON pt (updated_at, id);
		CREATE TABLE pt_4 (LIKE pt INCLUDING ALL)`)
	db.Exec(t, "INSERT INTO pt VALUES (1, $1), (150, $1)", t0)
	db.Exec(t, "INSERT INTO pt_4 VALUES (350, $1)", t0) // written before the mark, not yet a partition
	src := open(t, config(db, "pt"))
	mark := func(src *postgres.Source) string { return markOf(t, src) }
	page := func(src *postgres.Source, skip string) string { return skipPage(t, src, skip) }
	m1 := mark(src)
	if got := page(src, m1); got != "" {
		t.Fatalf("the control: a pass skipping by a mark taken after every write returns %q", got)
	}
	for _, step := range []struct{ sql, want string }{
		{"CREATE TABLE pt_3 PARTITION OF pt FOR VALUES FROM (200) TO (300)", ""},
		{"INSERT INTO pt VALUES (250, '" + t0.Format(time.RFC3339Nano) + "')", "250"},
		{"DROP TABLE pt_2", "250"},
		{"ALTER TABLE pt ATTACH PARTITION pt_4 FOR VALUES FROM (300) TO (400)", "1,250,350"},
	} {
		db.Exec(t, step.sql)
		if got := page(src, m1); got != step.want {
			t.Errorf("after %s, skipping by the mark taken before: %q, want %q", step.sql, got, step.want)
		}
		if got := page(open(t, config(db, "pt")), m1); got != step.want {
			t.Errorf("a restart after %s, skipping by the mark taken before: %q, want %q", step.sql, got, step.want)
		}
	}
}

// TestMarkOfAPartitionedTableWithSelectOnly: the role the docs suggest has
// SELECT on the table only, not on partitions created later (CREATE TABLE
// ... PARTITION OF copies no grants): a new, empty partition still leaves
// the skip on.
func TestMarkOfAPartitionedTableWithSelectOnly(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE pt (id bigint, updated_at timestamptz NOT NULL, PRIMARY KEY (id)) PARTITION BY RANGE (id);
		CREATE TABLE pt_1 PARTITION OF pt FOR VALUES FROM (0) TO (100);
		CREATE INDEX ON pt (updated_at, id)`)
	db.Exec(t, "INSERT INTO pt VALUES (1, $1)", t0)
	role := "ro_" + db.Schema
	db.Exec(t, `CREATE ROLE `+role+` LOGIN`)
	t.Cleanup(func() {
		db.Exec(t, `DROP OWNED BY `+role)
		db.Exec(t, `DROP ROLE `+role)
	})
	db.Exec(t, `GRANT USAGE ON SCHEMA `+db.Schema+` TO `+role)
	db.Exec(t, `GRANT SELECT ON pt TO `+role)
	cfg := config(db, "pt")
	cfg.DSN = strings.Replace(cfg.DSN, "://postgres@", "://"+role+"@", 1)
	src := open(t, cfg)
	m1 := markOf(t, src)
	db.Exec(t, "CREATE TABLE pt_2 PARTITION OF pt FOR VALUES FROM (100) TO (200)")
	if got := skipPage(t, open(t, cfg), m1); got != "" {
		t.Errorf("after a partition was created, as a role with SELECT on the table only: %q, want nothing read again", got)
	}
}

// TestSnapshotOutlastsIdleInTransactionTimeout: a view (a sweep's or
// verify's source snapshot, a load's sessions) waits idle in its
// transaction while the topic is read; a server's or role's
// idle_in_transaction_session_timeout (common on managed PostgreSQL) must
// not end it, or every retry would fail the same way.
func TestSnapshotOutlastsIdleInTransactionTimeout(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "INSERT INTO t VALUES (1, $1), (2, $1)", t0)
	cfg := config(db, "t")
	cfg.DSN += "&idle_in_transaction_session_timeout=300"
	src := open(t, cfg)
	for _, n := range []int{1, 2} {
		sn, err := src.SnapshotSessions(ctx, n)
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
		rows := 0
		err = sn.(interface {
			ScanLive(context.Context, func(*connector.Row) error) error
		}).ScanLive(ctx, func(*connector.Row) error { rows++; return nil })
		_ = sn.Close(ctx)
		if err != nil || rows != 2 {
			t.Errorf("%d session(s): a scan after 1 s idle under a 300 ms idle_in_transaction_session_timeout: %d rows, %v", n, rows, err)
		}
	}
}

// TestSnapshotKeepsTheShapeChange: a view opened after a column change
// (a sweep's, a resumed load's) reads the new shape, and the change is
// still reported to the next pass (logged, counted, a republish sweep
// scheduled), not swallowed by the view.
func TestSnapshotKeepsTheShapeChange(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	src := open(t, config(db, "t"))
	db.Exec(t, "ALTER TABLE t ADD COLUMN x int")
	sn, err := src.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := sn.Close(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := src.Reshape(ctx)
	if err != nil || c == nil || len(c.Added) != 1 || c.Added[0] != "x" {
		t.Fatalf("Reshape after a snapshot = %+v, %v; want x added", c, err)
	}
	if c, err := src.Reshape(ctx); c != nil || err != nil {
		t.Errorf("reported twice: %+v, %v", c, err)
	}
}

// TestPageSteps: a full pass after head passes skips by the last full
// pass's mark and, from each head pass's lower bound on, by that head
// pass's mark (docs/design.md, "Head passes"). What a head pass saw from
// its bound on is left out; a late commit dated below the bound of every
// head pass that began after it, and whatever committed after the last
// head pass began, are returned, page by page too.
func TestPageSteps(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	src := open(t, config(db, "t"))
	mark := func() string {
		m, err := src.Mark(ctx)
		if err != nil || m == "" {
			t.Fatalf("Mark: %q, %v", m, err)
		}
		return m
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	full := mark() // the last full pass: nothing below it
	// Head pass 1 reads from 10s: it sees 2 and 3, not 1 (below its bound).
	db.Exec(t, "INSERT INTO t VALUES (1, $1), (2, $2), (3, $3)", at(5), at(10), at(12))
	h1 := connector.Step{Mark: mark(), Since: at(10)}
	// Head pass 2 reads from 20s: it sees 5, not 4 (a late commit dated
	// below its bound) nor 6 (committed after it began).
	db.Exec(t, "INSERT INTO t VALUES (4, $1), (5, $2)", at(11), at(21))
	h2 := connector.Step{Mark: mark(), Since: at(20)}
	db.Exec(t, "INSERT INTO t VALUES (6, $1)", at(15))
	req := connector.PageRequest{Since: at(-60), Limit: 10, Skip: full, Mark: mark(), Steps: []connector.Step{h1, h2}}
	const want = "1,4,6"
	if p, err := src.Page(ctx, req); err != nil || ids(p.Rows) != want {
		t.Errorf("first page with two steps: %q, %v; want %s (2, 3 and 5 the head passes saw)", ids(p.Rows), err, want)
	}
	req.Limit = 1
	var all []string
	for cursor := ""; ; {
		req.Cursor = cursor
		p, err := src.Page(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if p.End {
			break
		}
		all = append(all, ids(p.Rows))
		cursor = p.Next
	}
	if got := strings.Join(all, ","); got != want {
		t.Errorf("page by page with two steps: %q, want %s", got, want)
	}
	req.Since, req.Cursor, req.Limit = time.Time{}, "", 10
	if p, err := src.Page(ctx, req); err != nil || ids(p.Rows) != want {
		t.Errorf("no lower bound, two steps: %q, %v; want %s", ids(p.Rows), err, want)
	}
	req.Steps = []connector.Step{h1}
	if p, err := src.Page(ctx, req); err != nil || ids(p.Rows) != "1,4,6,5" {
		t.Errorf("the first step only: %q, %v; want 1,4,6,5", ids(p.Rows), err)
	}
	req.Steps = nil
	if p, err := src.Page(ctx, req); err != nil || ids(p.Rows) != "1,2,4,3,6,5" {
		t.Errorf("no steps: %q, %v; want 1,2,4,3,6,5", ids(p.Rows), err)
	}
}

// TestPageWindow: a page bounded to a window of updated_at, [From,
// Before), returns only the window's rows, to the microsecond, with and
// without a cursor, and its End or Last speaks of the window. Walking the
// windows one after another, each from its From with no cursor, reads the
// table exactly once, ties included.
func TestPageWindow(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	// ids 0..9 one microsecond apart, and ids 10..12 tied on t0+5µs.
	for i := range 10 {
		db.Exec(t, "INSERT INTO t VALUES ($1, $2)", i, t0.Add(time.Duration(i)*time.Microsecond))
	}
	for i := 10; i <= 12; i++ {
		db.Exec(t, "INSERT INTO t VALUES ($1, $2)", i, t0.Add(5*time.Microsecond))
	}
	src := open(t, config(db, "t"))
	us := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Microsecond) }
	// window reads [from, before) page by page, as the engine does: the
	// first page from From with no cursor, then by cursor.
	window := func(since, from, before time.Time, limit int) string {
		t.Helper()
		req := connector.PageRequest{Since: since, From: from, Before: before, Limit: limit}
		var got []connector.Row
		for i := 0; ; i++ {
			if i > 100 {
				t.Fatal("the window did not end")
			}
			p, err := src.Page(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, p.Rows...)
			if p.End || p.Last {
				return ids(got)
			}
			req.Cursor = p.Next
		}
	}
	for _, limit := range []int{1, 2, 100} {
		for _, c := range []struct {
			since, from, before time.Time
			want                string
		}{
			{us(0), time.Time{}, us(3), "0,1,2"},
			{us(0), us(3), us(5), "3,4"},
			{us(0), us(5), us(6), "5,10,11,12"},
			{us(0), us(6), us(7), "6"},
			{us(0), us(7), us(7), ""},
			{us(4), us(2), us(6), "4,5,10,11,12"}, // From below Since: Since holds
			{us(0), us(9), time.Time{}, "9"},      // the last window is open
		} {
			if got := window(c.since, c.from, c.before, limit); got != c.want {
				t.Errorf("limit %d, since %d from %v before %v: %q, want %q", limit, c.since.Sub(t0).Microseconds(), c.from, c.before, got, c.want)
			}
		}
		var all []string
		for lo := 0; lo < 12; lo += 3 {
			before := us(lo + 3)
			if lo+3 >= 12 {
				before = time.Time{}
			}
			if s := window(us(0), us(lo), before, limit); s != "" {
				all = append(all, s)
			}
		}
		if got, want := strings.Join(all, ","), "0,1,2,3,4,5,10,11,12,6,7,8,9"; got != want {
			t.Errorf("limit %d: the windows read %s, want %s", limit, got, want)
		}
	}
}
