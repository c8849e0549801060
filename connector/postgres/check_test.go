package postgres_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// find returns the findings of one check.
func find(r postgres.Report, check string) []postgres.Finding {
	var out []postgres.Finding
	for _, f := range r.Findings {
		if f.Check == check {
			out = append(out, f)
		}
	}
	return out
}

// wantFinding fails unless the report has a finding of check with the
// severity whose message contains every fragment.
func wantFinding(t *testing.T, r postgres.Report, check string, sev postgres.Severity, fragments ...string) {
	t.Helper()
	for _, f := range find(r, check) {
		if f.Severity != sev {
			continue
		}
		ok := true
		for _, frag := range fragments {
			ok = ok && strings.Contains(f.Message, frag)
		}
		if ok {
			return
		}
	}
	t.Errorf("no %s %s finding containing %q in:\n%s", sev, check, fragments, r)
}

func check(t *testing.T, cfg postgres.Config) postgres.Report {
	t.Helper()
	r, err := postgres.Check(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	return r
}

func TestCheckHealthyTable(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id uuid PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at timestamptz, v text)")
	db.Exec(t, "CREATE INDEX t_seek ON t (updated_at, id)")
	cfg := config(db, "t")
	cfg.DeletedAtColumn = "deleted_at"
	cfg.Filter = "v <> 'x'"
	r := check(t, cfg)
	if err := r.Err(); err != nil {
		t.Fatalf("healthy table fails: %v\n%s", err, r)
	}
	for _, f := range r.Findings {
		if f.Severity != postgres.OK {
			t.Errorf("unexpected %s", f)
		}
	}
	wantFinding(t, r, "index", postgres.OK, `"t_seek"`)
	wantFinding(t, r, "id", postgres.OK, `"id" is uuid`)
	wantFinding(t, r, "filter", postgres.OK)

	// The method form on a live source agrees.
	src := open(t, cfg)
	r2, err := src.Check(context.Background())
	if err != nil || r2.String() != r.String() {
		t.Errorf("Source.Check: %v\n%s\nvs\n%s", err, r2, r)
	}
}

func TestCheckFailures(t *testing.T) {
	db := harness.NewDB(t)
	s := pgx.Identifier{db.Schema}.Sanitize()
	cases := []struct {
		name, ddl string
		cfg       func(*postgres.Config)
		check     string
		fragments []string
	}{
		{"missing table", "", nil, "table", []string{s + `."nope" does not exist`}},
		{"nullable updated_at", "CREATE TABLE %s (id bigint PRIMARY KEY, updated_at timestamptz)", nil, "updated_at",
			[]string{"skipped forever", "ALTER TABLE " + s + `."nullable updated_at" ALTER COLUMN "updated_at" SET NOT NULL`}},
		{"timestamp without tz", "CREATE TABLE %s (id bigint PRIMARY KEY, updated_at timestamp NOT NULL)", nil, "updated_at",
			[]string{"timestamp without time zone", "must be timestamptz", "TYPE timestamptz USING"}},
		{"updated_at wrong type", "CREATE TABLE %s (id bigint PRIMARY KEY, updated_at bigint NOT NULL)", nil, "updated_at",
			[]string{`"updated_at"`, "is bigint", "timestamptz NOT NULL"}},
		{"missing updated_at", "CREATE TABLE %s (id bigint PRIMARY KEY, modified timestamptz NOT NULL)", nil, "updated_at",
			[]string{`"updated_at" does not exist`, "it has: id, modified"}},
		{"non-unique id", "CREATE TABLE %s (id bigint NOT NULL, updated_at timestamptz NOT NULL)", nil, "id",
			[]string{`"id"`, "is not unique", "CREATE UNIQUE INDEX CONCURRENTLY ON " + s + `."non-unique id" ("id")`}},
		{"unique over two columns", "CREATE TABLE %s (id bigint NOT NULL, k int, updated_at timestamptz NOT NULL, UNIQUE (id, k))", nil, "id",
			[]string{"is not unique"}},
		{"partial unique", "CREATE TABLE %s (id bigint NOT NULL, updated_at timestamptz NOT NULL); CREATE UNIQUE INDEX ON %[1]s (id) WHERE id > 0", nil, "id",
			[]string{"is not unique"}},
		{"nullable id", "CREATE TABLE %s (id bigint UNIQUE, updated_at timestamptz NOT NULL)", nil, "id",
			[]string{"is nullable", `ALTER COLUMN "id" SET NOT NULL`}},
		{"id wrong type", "CREATE TABLE %s (id numeric PRIMARY KEY, updated_at timestamptz NOT NULL)", nil, "id",
			[]string{`id column "id"`, "has type numeric", "bigint, integer, smallint, text, varchar or uuid"}},
		{"missing id", "CREATE TABLE %s (pk bigint PRIMARY KEY, updated_at timestamptz NOT NULL)", nil, "id",
			[]string{`id column "id" does not exist`}},
		{"deleted_at wrong type", "CREATE TABLE %s (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at boolean)",
			func(c *postgres.Config) { c.DeletedAtColumn = "deleted_at" }, "deleted_at", []string{"is boolean", "must be timestamptz"}},
		// A unique index of an inheritance parent does not cover its
		// children, which every query reads too: one id can be in two.
		{"inheritance parent", "CREATE TABLE %s (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL); CREATE TABLE inheritance_child () INHERITS (%[1]s)", nil, "id",
			[]string{"inheritance children", "inheritance_child"}},
		// A case-insensitive collation ties 'a' and 'A', which a unique
		// index of another collation lets exist side by side: the
		// cursor after ('a') skips 'A'.
		{"nondeterministic", "CREATE COLLATION IF NOT EXISTS ci_test (provider = icu, locale = 'und-u-ks-level2', deterministic = false); CREATE TABLE %s (id text COLLATE ci_test NOT NULL, updated_at timestamptz NOT NULL); CREATE UNIQUE INDEX ON %[1]s (id COLLATE \"C\")", nil, "id",
			[]string{"nondeterministic collation", "would skip one of them"}},
		// The usual fix, ADD PRIMARY KEY, is impossible on a view, and on
		// a table partitioned by another column: say so.
		{"a view", "CREATE TABLE a_view_base (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL); CREATE VIEW %s AS SELECT * FROM a_view_base", nil, "id",
			[]string{"is not unique", "view or foreign table has no index", "sync the table it reads from"}},
		{"a matview", "CREATE MATERIALIZED VIEW %s AS SELECT 1::bigint AS id, now() AS updated_at", nil, "id",
			[]string{"is not unique", "CREATE UNIQUE INDEX CONCURRENTLY"}},
		{"by time", "CREATE TABLE %s (id bigint NOT NULL, updated_at timestamptz NOT NULL, PRIMARY KEY (id, updated_at)) PARTITION BY RANGE (updated_at)", nil, "id",
			[]string{"is not unique", "partitioned by another column", "cannot sync it as a whole"}},
		{"missing column", "CREATE TABLE %s (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)",
			func(c *postgres.Config) { c.Columns = []string{"id", "ghost"} }, "columns", []string{`"ghost"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			table := c.name
			if c.ddl != "" {
				db.Exec(t, fmt.Sprintf(c.ddl, pgx.Identifier{table}.Sanitize()))
			} else {
				table = "nope"
			}
			cfg := config(db, table)
			if c.cfg != nil {
				c.cfg(&cfg)
			}
			r := check(t, cfg)
			wantFinding(t, r, c.check, postgres.Fail, c.fragments...)
			if err := r.Err(); !errors.Is(err, postgres.ErrBadConfig) {
				t.Errorf("Report.Err = %v, want ErrBadConfig", err)
			}
			// New refuses the same table with the same message.
			src, err := postgres.New(context.Background(), cfg)
			if err == nil {
				src.Close()
				t.Fatal("New accepted the table")
			}
			if !errors.Is(err, postgres.ErrBadConfig) || !strings.Contains(err.Error(), c.fragments[0]) {
				t.Errorf("New: %v", err)
			}
		})
	}
}

// TestCheckIndex: without an index serving ORDER BY updated_at, id the
// preflight warns with the exact statement to run; with one it is OK even
// on a tiny table where the planner would rather sort.
func TestCheckIndex(t *testing.T) {
	db := harness.NewDB(t)
	s := pgx.Identifier{db.Schema}.Sanitize()
	db.Exec(t, `CREATE TABLE "Big Table" ("ID" text PRIMARY KEY, "Updated At" timestamptz NOT NULL)`)
	db.Exec(t, `INSERT INTO "Big Table" SELECT g::text, now() FROM generate_series(1, 100) g`)
	db.Exec(t, `ANALYZE "Big Table"`)
	cfg := config(db, "Big Table")
	cfg.IDColumn, cfg.UpdatedAtColumn = "ID", "Updated At"

	r := check(t, cfg)
	want := `CREATE INDEX CONCURRENTLY ON ` + s + `."Big Table" ("Updated At", "ID");`
	wantFinding(t, r, "index", postgres.Warn, "Run: "+want, "Sort")
	if r.Err() != nil {
		t.Errorf("a missing index is a warning, not a failure: %v", r.Err())
	}

	// An index on updated_at alone does not serve the order either.
	db.Exec(t, `CREATE INDEX ON "Big Table" ("Updated At")`)
	wantFinding(t, check(t, cfg), "index", postgres.Warn, want)

	db.Exec(t, want)
	r = check(t, cfg)
	wantFinding(t, r, "index", postgres.OK, "serves ORDER BY")
	if n := len(find(r, "index")); n != 1 {
		t.Errorf("%d index findings", n)
	}
}

// TestCheckLoadIndex: with sync.load_workers the initial load reads pages
// ORDER BY id; a unique index the order cannot use (another operator
// class or collation than the column's) would have every load page sort
// the rest of its key range. check explains the load's statement too and
// says so; with the primary key it is OK, and without load workers it is
// not checked.
func TestCheckLoadIndex(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE t (id text NOT NULL, updated_at timestamptz NOT NULL)`)
	db.Exec(t, `CREATE UNIQUE INDEX t_id_pattern ON t (id text_pattern_ops)`)
	db.Exec(t, `CREATE INDEX ON t (updated_at, id)`)
	cfg := config(db, "t")
	if n := len(find(check(t, cfg), "load")); n != 0 {
		t.Errorf("without load workers: %d load findings", n)
	}
	cfg.LoadWorkers = 2
	r := check(t, cfg)
	wantFinding(t, r, "load", postgres.Warn, "ORDER BY", "sync.load_workers")
	if r.Err() != nil {
		t.Errorf("a load that sorts is a warning, not a failure: %v", r.Err())
	}
	db.Exec(t, `ALTER TABLE t ADD PRIMARY KEY (id)`)
	wantFinding(t, check(t, cfg), "load", postgres.OK, "serves")
}

// TestCheckTimesReadsTheIndex: the preflight's timestamp check runs at
// every start of `tidemark run`. It must be served by the (updated_at, id)
// index: a sequential scan of the whole table would make every start (and
// every restart after an outage) cost a full read of a big table.
func TestCheckTimesReadsTheIndex(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	db.Exec(t, "INSERT INTO t SELECT g, now() - g * interval '1 second', 'x' FROM generate_series(1, 20000) g")
	db.Exec(t, "ANALYZE t")
	for _, filter := range []string{"", "v <> 'y'"} {
		cfg := config(db, "t")
		cfg.Filter = filter
		ctx := context.Background()
		q, err := postgres.TimesQuery(ctx, db.Pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		// The check reads a few index pages, not the table's 150
		// heap pages or the whole index.
		var raw []byte
		if err := db.Pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+q).Scan(&raw); err != nil {
			t.Fatal(err)
		}
		var plan []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
			}
		}
		if err := json.Unmarshal(raw, &plan); err != nil || len(plan) != 1 {
			t.Fatalf("EXPLAIN: %v: %s", err, raw)
		}
		if b := plan[0].Plan.Hit + plan[0].Plan.Read; b > 20 {
			t.Errorf("filter %q: the timestamp check reads %d blocks of a 20000-row table:\n%s\n%s", filter, b, q, raw)
		}
	}
	// The findings are as before.
	db.Exec(t, "INSERT INTO t VALUES (-1, now() + interval '1 hour', 'x'), (-2, 'infinity', 'x')")
	r := check(t, config(db, "t"))
	wantFinding(t, r, "timestamps", postgres.Fail, "1 rows", "outside years 1..9999", "id -2")
	wantFinding(t, r, "timestamps", postgres.Warn, "1 rows", "ahead of the database clock")
	if f := find(r, "timestamps"); len(f) != 2 {
		t.Errorf("want one fail and one warning:\n%s", r)
	}
}

// TestCheckViewGetsNoHintItCannotTake: a view's columns are never NOT
// NULL, and ALTER TABLE cannot change them: the only finding about its id
// says why a view cannot be read.
func TestCheckViewGetsNoHintItCannotTake(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE base (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL); CREATE VIEW v AS SELECT * FROM base")
	for _, f := range check(t, config(db, "v")).Findings {
		if strings.Contains(f.Message, "ALTER TABLE") || strings.Contains(f.Message, "ADD PRIMARY KEY") {
			t.Errorf("a hint PostgreSQL refuses on a view: %s", f)
		}
	}
}
