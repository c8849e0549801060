package postgres_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestPassView: pages read in a pass's view see the table as it was when
// the view was opened, whatever commits since, until the view is older than
// its age; a closed view, or another source's, is refused
// (docs/design.md, "A pass reads one snapshot").
func TestPassView(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	db.Exec(t, "INSERT INTO t VALUES (1, $1, 'a'), (2, $2, 'b')", t0, t0.Add(time.Second))
	src := open(t, config(db, "t"))

	view, err := src.OpenView(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if view.Mark() == "" {
		t.Error("a table's view has no mark")
	}
	db.Exec(t, "INSERT INTO t VALUES (3, $1, 'c')", t0.Add(2*time.Second))
	db.Exec(t, "UPDATE t SET v = 'a2', updated_at = $1 WHERE id = 1", t0.Add(3*time.Second))

	read := func(v connector.PassView, limit int) string {
		t.Helper()
		return ids(walkRequest(t, src, connector.PageRequest{Since: t0, Limit: limit, View: v}))
	}
	for _, limit := range []int{1, 2, 10} {
		if got, want := read(view, limit), "1,2"; got != want {
			t.Errorf("limit %d: the view read %s, want %s (the table when it was opened)", limit, got, want)
		}
	}
	if got, want := read(nil, 10), "2,3,1"; got != want {
		t.Errorf("without the view: read %s, want %s", got, want)
	}
	if err := view.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := view.Close(ctx); err != nil {
		t.Errorf("closing twice: %v", err)
	}
	if _, err := src.Page(ctx, connector.PageRequest{Since: t0, Limit: 10, View: view}); err == nil {
		t.Error("a page in a closed view: no error")
	}
	// A view older than its age reads a newer snapshot from its next
	// page on; so does one whose transaction an error ended.
	aged, err := src.OpenView(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer aged.Close(ctx)
	if got, want := read(aged, 10), "2,3,1"; got != want {
		t.Fatalf("a new view read %s, want %s", got, want)
	}
	db.Exec(t, "INSERT INTO t VALUES (4, $1, 'd')", t0.Add(4*time.Second))
	if got, want := read(aged, 10), "2,3,1"; got != want {
		t.Errorf("a view within its age read %s, want %s", got, want)
	}
	restore := postgres.SetMaxViewAge(0)
	defer restore()
	if got, want := read(aged, 10), "2,3,1,4"; got != want {
		t.Errorf("a view past its age read %s, want %s (a newer snapshot)", got, want)
	}

	other := open(t, config(db, "t"))
	ov, err := other.OpenView(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ov.Close(ctx)
	if _, err := src.Page(ctx, connector.PageRequest{Since: t0, Limit: 10, View: ov}); !errors.Is(err, connector.ErrPermanent) {
		t.Errorf("a page in another source's view: %v, want ErrPermanent", err)
	}
}

// TestPassViewAfterAChangedPlan: a column's type changes between two
// passes, and the next pass's view runs on the connection whose cached
// statement was planned for the old type. PostgreSQL refuses it ("cached
// plan must not change result type"), which ends the view's transaction;
// the page is run again in a new one, and fails only on the changed
// column, which the engine's next pass reshapes for, not on an aborted
// transaction.
func TestPassViewAfterAChangedPlan(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v int)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	db.Exec(t, "INSERT INTO t VALUES (1, $1, 1)", t0)
	cfg := config(db, "t")
	cfg.DSN += "&pool_max_conns=1" // every view on the same connection
	src := open(t, cfg)
	page := func() error {
		t.Helper()
		v, err := src.OpenView(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer v.Close(ctx)
		_, err = src.Page(ctx, connector.PageRequest{Since: t0, Limit: 10, View: v})
		return err
	}
	if err := page(); err != nil {
		t.Fatal(err)
	}
	db.Exec(t, "ALTER TABLE t ALTER COLUMN v TYPE bigint")
	err := page()
	if err == nil || !strings.Contains(err.Error(), "changed type during the pass") {
		t.Fatalf("a page after the column's type changed: %v; want the changed column named, after the statement ran again in a new transaction", err)
	}
}
