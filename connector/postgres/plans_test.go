package postgres

import (
	"context"
	"testing"

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
// otherwise.)
func TestPageQueriesArePlannedPerCall(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	for _, c := range []struct{ dsn, want string }{
		{db.URL, "force_custom_plan"},
		{db.URL + "&plan_cache_mode=auto", "auto"},
	} {
		s, err := New(ctx, Config{DSN: c.dsn, Schema: db.Schema, Table: "t"})
		if err != nil {
			t.Fatal(err)
		}
		var mode string
		err = s.pool.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode)
		s.Close()
		if err != nil || mode != c.want {
			t.Errorf("plan_cache_mode of the source's sessions: %q, %v; want %s", mode, err, c.want)
		}
	}
}
