package postgres

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/test/harness"
)

// TestPageQueriesArePlannedPerCall: the page queries are prepared once
// per session, and PostgreSQL may switch a prepared statement to one
// generic plan after five calls when that plan looks no dearer than the
// calls so far. A full pass's pages (a wide range, a mark that filters
// most rows) look dear, so a generic plan can win, and it cannot see
// that a head pass's range is a few rows at the top of the index. In
// the notify benchmark it did: a parallel index scan per page, 100 to
// 300 ms instead of 1, and 3.9 transactions a second instead of 25 at
// 4,000 updates a second. (A table of a test's size does not make the
// planner switch, so this checks the setting that rules the switch out:
// every session plans each call for its own bounds, unless the DSN says
// otherwise.) The same for the settings that keep pages in index order
// (TestPagesAreReadInIndexOrder).
func TestPageQueriesArePlannedPerCall(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	for _, c := range []struct{ dsn, want string }{
		{db.URL, "force_custom_plan off off"},
		{db.URL + "&plan_cache_mode=auto&enable_sort=on&jit=on", "auto on on"},
	} {
		s, err := New(ctx, Config{DSN: c.dsn, Schema: db.Schema, Table: "t"})
		if err != nil {
			t.Fatal(err)
		}
		var mode, sort, jit string
		err = s.pool.QueryRow(ctx, "SELECT current_setting('plan_cache_mode'), current_setting('enable_sort'), current_setting('jit')").Scan(&mode, &sort, &jit)
		s.Close()
		if got := mode + " " + sort + " " + jit; err != nil || got != c.want {
			t.Errorf("plan_cache_mode, enable_sort and jit of the source's sessions: %q, %v; want %q", got, err, c.want)
		}
	}
}

// TestPagesAreReadInIndexOrder: page statements read the (updated_at, id)
// index in order and stop at the page's LIMIT, whatever the statistics
// say, wherever they run: in a pass's view (also once renewed), in a
// snapshot (the consistent load, sweep and verify) and on the pool (the
// reference feed). Under a stream of updates the statistics lag the
// table: the rows changed since the last ANALYZE lie above its histogram,
// so PostgreSQL estimates a few hundred where there are tens of thousands.
// For so few rows a bitmap scan and a sort look cheapest; but that plan
// reads every row after the cursor and sorts them for each page, so a
// pass's work grows with the square of its rows. In the notify benchmark
// at 10,000 updates a second it did: 1,000-row pages of 50 to 270 ms,
// passes of thousands of rows, and p99 in seconds.
func TestPagesAreReadInIndexOrder(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	db.Exec(t, "CREATE TABLE r (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, note text) WITH (autovacuum_enabled = false)")
	// updated_at at random with respect to the heap's order, as after
	// months of updates; analysed, then a fifth of the rows changed.
	db.Exec(t, "INSERT INTO r SELECT g, $1::timestamptz + random() * interval '100 s', repeat('x', 100) FROM generate_series(1, 100000) g", t0)
	db.Exec(t, "CREATE INDEX ON r (updated_at, id)")
	db.Exec(t, "ANALYZE r")
	db.Exec(t, "UPDATE r SET updated_at = $1::timestamptz + interval '100 s' + random() * interval '2 s' WHERE id % 5 = 0", t0)

	s, err := New(ctx, Config{DSN: db.URL, Schema: db.Schema, Table: "r"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mark, err := s.Mark(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := parseMark(mark)
	if err != nil {
		t.Fatal(err)
	}
	// A skip mark below every change, so that the filter is in the
	// statement but leaves every row in.
	skip := (m - 1000) & 0xffffffff
	since, before := t0.Add(100*time.Second), t0.Add(103*time.Second)
	lows, marks := []time.Time{since}, []int64{skip}
	q := s.shape().q
	pages := []struct {
		name string
		sql  string
		args []any
	}{
		{"head pass, first page", q.since, []any{since, 1000, skip, nil, nil}},
		{"next page", q.next, []any{since, "0", 1000, skip, nil, nil}},
		{"next page without a skip mark", q.next, []any{since, "0", 1000, nil, nil, nil}},
		{"next page with steps", q.next, []any{since, "0", 1000, skip, lows, marks}},
		{"window, first page", q.sinceBefore, []any{since, 1000, skip, nil, nil, before}},
		{"window, next page", q.nextBefore, []any{since, "0", 1000, skip, lows, marks, before}},
	}
	inOrder := func(where string, on querier) {
		t.Helper()
		for _, c := range pages {
			plan, err := explain(ctx, on, c.sql, c.args)
			if err != nil {
				t.Fatalf("%s, %s: %v", where, c.name, err)
			}
			if plan.has("Sort") || !plan.has("Index Scan") {
				raw, _ := json.Marshal(plan)
				t.Errorf("%s, %s: the page is not read in index order, but sorted (every page would read and sort every row after the cursor): %s", where, c.name, raw)
			}
		}
	}
	// The control: with PostgreSQL's defaults the table's statistics
	// make the pages sort, else this test tests nothing.
	if plan, err := explain(ctx, db.Pool, q.next, pages[1].args); err != nil || !plan.has("Sort") {
		raw, _ := json.Marshal(plan)
		t.Fatalf("with PostgreSQL's defaults the next page of the test's table is not sorted (%v): %s; the table no longer shows what the test is about", err, raw)
	}

	inOrder("on the pool", s.pool)
	v, err := s.OpenView(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close(ctx)
	inOrder("in a pass's view", v.(querier))
	if err := v.(*passView).renew(ctx); err != nil {
		t.Fatal(err)
	}
	inOrder("in a renewed view", v.(querier))
	sn, err := s.snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer sn.Close(ctx)
	if err := sn.with(ctx, func(tx pgx.Tx) error {
		inOrder("in a snapshot", tx)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestPagesThatMustSortAreNotCompiled: with no index that serves ORDER BY
// updated_at, id a page sorts whatever the settings, and the sort's penalty
// (enable_sort off) makes its estimated cost huge: PostgreSQL would
// JIT-compile it, with inlining and optimisation, on every call (some 100 ms
// where the page itself takes 10). The sessions turn jit off.
func TestPagesThatMustSortAreNotCompiled(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE u (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	db.Exec(t, "INSERT INTO u SELECT g, now() FROM generate_series(1, 50000) g")
	db.Exec(t, "ANALYZE u")
	s, err := New(ctx, Config{DSN: db.URL, Schema: db.Schema, Table: "u"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var raw string
	if err := s.pool.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+s.shape().q.next, time.Now().Add(-time.Hour), "0", 1000, nil, nil, nil).Scan(&raw); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(raw, `"Sort"`) {
		t.Fatalf("a table without the index: the page is not sorted: %s", raw)
	}
	if strings.Contains(raw, `"JIT"`) {
		t.Errorf("a page that must sort is JIT-compiled: %s", raw)
	}
}

// TestPassStartStatementsArePlannedOnce: the catalog statements every pass
// begins with (the shape's signature; the mark, alone or as a view opens)
// name no parameter, so each session plans them once. With parameters,
// the sessions' plan_cache_mode (force_custom_plan, for the pages) had
// PostgreSQL plan them at every pass: in the notify benchmark the
// signature's plan took 1.2 ms of the server's time per pass, several times
// its execution, tens of times a second.
func TestPassStartStatementsArePlannedOnce(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	// A name that needs quoting both as an identifier and as a literal,
	// with a backslash (an E'' literal).
	table := `it's "t" \ u`
	db.Exec(t, "CREATE TABLE "+pgx.Identifier{table}.Sanitize()+" (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	// One connection, so that every statement runs in the session the
	// test then asks.
	s, err := New(ctx, Config{DSN: db.URL + "&pool_max_conns=1", Schema: db.Schema, Table: table})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const passes = 7
	var marks []string
	for range passes {
		if ch, err := s.Reshape(ctx); err != nil || ch != nil {
			t.Fatalf("reshape of an unchanged table: %v, %v", ch, err)
		}
		if ch, _, err := s.ReshapeNow(ctx); err != nil || ch != nil {
			t.Fatalf("reshape (with the clock) of an unchanged table: %v, %v", ch, err)
		}
		m, err := s.Mark(ctx)
		if err != nil {
			t.Fatal(err)
		}
		v, err := s.OpenView(ctx)
		if err != nil {
			t.Fatal(err)
		}
		marks = append(marks, m, v.Mark())
		if err := v.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range marks {
		if _, rel, err := parseMark(m); err != nil || len(rel.oids) != 1 {
			t.Fatalf("mark %q names no relation (%v): the statement lost the table's name", m, err)
		}
	}
	stmts := map[string]string{"signature": signatureSQLFor(s.cfg), "signature and clock": reshapeNowSQLFor(s.cfg), "mark": markSQLFor(s.shape().tbl.ident)}
	type plans struct{ generic, custom int64 }
	got := map[string]plans{}
	for name, sql := range stmts {
		var p plans
		err := s.pool.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
			FROM pg_catalog.pg_prepared_statements WHERE statement = $1`, sql).Scan(&p.generic, &p.custom)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = p
	}
	for _, name := range []string{"signature", "signature and clock", "mark"} {
		p := got[name]
		if p.custom > 0 || p.generic == 0 {
			t.Errorf("the %s statement over %d passes: %d custom plans, %d runs of a generic plan; want none custom, every run generic (planned once)",
				name, passes, p.custom, p.generic)
		}
	}
}
