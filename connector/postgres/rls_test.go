package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestRowLevelSecurityIsRefusedNotFiltered: a table with row-level
// security read by a role its policies apply to shows that role only some
// rows, and PostgreSQL filters the rest out silently: the walk would lose
// them and verify, reading through the same policies, would call the copy
// exact. The source refuses such a role at start, naming the table, the
// role and the fix; the owner (and a role with BYPASSRLS) reads every row.
func TestRowLevelSecurityIsRefusedNotFiltered(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	db.Exec(t, "INSERT INTO t SELECT i, now(), 'v' FROM generate_series(1, 10) i")
	db.Exec(t, "ALTER TABLE t ENABLE ROW LEVEL SECURITY")
	db.Exec(t, "CREATE POLICY even ON t FOR SELECT USING (id % 2 = 0)")
	ident, dsn := loginRole(t, db, "rls")
	db.Exec(t, fmt.Sprintf("GRANT SELECT ON t TO %s", ident))

	cfg := config(db, "t")
	cfg.DSN = dsn
	src, err := postgres.New(ctx, cfg)
	if err == nil {
		n := 0
		_, err := src.ScanLive(ctx, func(*connector.Row) error { n++; return nil })
		src.Close()
		t.Fatalf("a role under row-level security was accepted: it sees %d of the 10 rows (%v)", n, err)
	}
	t.Logf("New as %s: %v", ident, err)
	if !errors.Is(err, postgres.ErrBadConfig) {
		t.Errorf("not a bad configuration: %v", err)
	}
	for _, want := range []string{"row-level security", ident, "BYPASSRLS"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the error does not say %q: %v", want, err)
		}
	}

	// The preflight says so too, as a failed check, on a pool of one
	// connection as well.
	one := cfg
	one.DSN += "&pool_max_conns=1"
	if !strings.Contains(cfg.DSN, "?") {
		one.DSN = cfg.DSN + "?pool_max_conns=1"
	}
	for _, c := range []postgres.Config{cfg, one} {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		rep, err := postgres.Check(cctx, c)
		cancel()
		if err != nil {
			t.Fatalf("check as %s: %v", ident, err)
		}
		if err := rep.Err(); err == nil || !strings.Contains(err.Error(), "row-level security") {
			t.Errorf("check as %s: %v; want a failure naming row-level security", ident, err)
		}
	}

	// The reference feed serves what its role may read, on purpose.
	scoped := cfg
	scoped.RowSecurity = true
	n := 0
	if _, err := open(t, scoped).ScanLive(ctx, func(*connector.Row) error { n++; return nil }); err != nil || n != 5 {
		t.Errorf("with RowSecurity (the feed): %d rows, %v; want the policy's 5", n, err)
	}

	// The owner is not subject to the policy (without FORCE ROW LEVEL
	// SECURITY), nor is a role with BYPASSRLS: every row.
	for _, c := range []postgres.Config{config(db, "t"), func() postgres.Config {
		db.Exec(t, fmt.Sprintf("ALTER ROLE %s BYPASSRLS", ident))
		return cfg
	}()} {
		src := open(t, c)
		n := 0
		if _, err := src.ScanLive(ctx, func(*connector.Row) error { n++; return nil }); err != nil || n != 10 {
			t.Errorf("%s: %d rows, %v; want all 10", c.DSN, n, err)
		}
	}
}
