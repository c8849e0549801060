package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/harness"
)

// TestPageBoundKeepsWhatWasVisible: with PageRequest.Bound and Visible, a
// page keeps every row dated before the bound, and above it exactly the
// versions visible when MarkVisible was taken (docs/design.md, "A pass
// ends at its clock"): one committed before it even by a transaction
// younger than an older one still open (its id is above the mark), and
// not one committed since, nor one of a transaction in progress then that
// committed since.
func TestPageBoundKeepsWhatWasVisible(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	db.Exec(t, "CREATE TABLE other (x int)")
	src := open(t, config(db, "t"))
	bound := t0.Add(time.Hour)
	db.Exec(t, "INSERT INTO t VALUES (1, $1, 'below, before')", bound.Add(-time.Minute))

	// An older writer stays open across the mark, so the mark is its id.
	older, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer older.Rollback(ctx)
	if _, err := older.Exec(ctx, "INSERT INTO other VALUES (1)"); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, "INSERT INTO t VALUES (2, $1, 'above, committed before the mark')", bound.Add(time.Minute))
	// In progress at the mark, committed after it.
	inProgress, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer inProgress.Rollback(ctx)
	if _, err := inProgress.Exec(ctx, "INSERT INTO t VALUES (3, $1, 'above, in progress at the mark')", bound.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	// Its own in-progress subtransaction too.
	for _, q := range []string{"SAVEPOINT s", "INSERT INTO t VALUES (6, $1, 'above, subtransaction in progress at the mark')", "RELEASE s"} {
		var args []any
		if q[0] == 'I' {
			args = append(args, bound.Add(5*time.Minute))
		}
		if _, err := inProgress.Exec(ctx, q, args...); err != nil {
			t.Fatal(err)
		}
	}

	// A transaction that commits after the subtransaction's id was
	// assigned moves the snapshot's xmax above it.
	db.Exec(t, "INSERT INTO other VALUES (2)")

	mark, visible, err := src.MarkVisible(ctx)
	if err != nil || mark == "" || visible == "" {
		t.Fatalf("MarkVisible: %q %q %v", mark, visible, err)
	}
	if err := inProgress.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, "INSERT INTO t VALUES (4, $1, 'above, committed after the mark')", bound.Add(3*time.Minute))
	db.Exec(t, "INSERT INTO t VALUES (5, $1, 'below, committed after the mark')", bound.Add(-2*time.Minute))

	read := func(limit int) string {
		t.Helper()
		var rows []connector.Row
		req := connector.PageRequest{Since: t0, Limit: limit, Bound: bound, Visible: visible}
		for {
			p, err := src.Page(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			rows = append(rows, p.Rows...)
			if p.End || p.Last {
				return ids(rows)
			}
			req.Cursor = p.Next
		}
	}
	// The subtransaction (6) is kept: its id is below the snapshot's xmax
	// and not in its list of transactions in progress, which names only
	// its parent (more than was visible, never less).
	for _, limit := range []int{1, 2, 100} {
		if got, want := read(limit), "5,1,2,6"; got != want {
			t.Errorf("limit %d: read %s, want %s (below the bound: all; above it: the visible and the subtransaction)", limit, got, want)
		}
	}

	// Without the bound every row is read.
	rows := walk(t, src, t0, 100)
	if got, want := ids(rows), "5,1,2,3,4,6"; got != want {
		t.Errorf("without a bound: read %s, want %s", got, want)
	}

	// A snapshot that is not one is a bug, not a page to retry.
	_, err = src.Page(ctx, connector.PageRequest{Since: t0, Limit: 10, Bound: bound, Visible: "12:x:"})
	if !errors.Is(err, connector.ErrPermanent) {
		t.Errorf("a malformed snapshot: %v, want ErrPermanent", err)
	}
}
