package integration

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// TestConsistentInitialLoad: the first load reads one REPEATABLE READ
// snapshot, so the topic equals the table as it was when the load began,
// even though rows are inserted, updated and soft-deleted while it runs;
// the following pass picks all of those up and the topic equals the table.
func TestConsistentInitialLoad(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 10, time.Second)
	atStart := r.Expected()
	src := &hooked{Source: r.Src}
	src.before = func(ctx context.Context, n int) error {
		if n == 2 { // inside the snapshot, after page 1 (ids 1..3)
			r.Exec(`INSERT INTO items (id, updated_at, v) VALUES (11, clock_timestamp(), 'during the load')`)
			r.Exec(`UPDATE items SET v = 'v1-updated', updated_at = clock_timestamp() WHERE id = 1`) // read
			r.Exec(`UPDATE items SET v = 'v9-updated', updated_at = clock_timestamp() WHERE id = 9`) // not read yet
			r.Exec(`UPDATE items SET deleted_at = clock_timestamp(), updated_at = clock_timestamp() WHERE id = 5`)
		}
		return nil
	}
	cfg := connector.Config{PageSize: 3, Consistent: true}
	r.Once(src, cfg)
	st := r.AssertFolded(atStart)
	rig.AssertNoDupes(t, st)
	cp := r.Checkpoint()
	if cp.Phase != schemas.PhaseIdle || cp.Watermark == "" {
		t.Fatalf("after the consistent load: phase %q watermark %q", cp.Phase, cp.Watermark)
	}
	if w, _ := schemas.ParseTime(cp.Watermark); !w.After(rig.T0.Add(10 * time.Second)) {
		t.Errorf("watermark %s after the consistent load; want the snapshot's start, a real clock reading", cp.Watermark)
	}

	r.Once(src, cfg)
	st = r.AssertTable()
	rig.AssertNoDupes(t, st)
	rig.AssertTombstoned(t, st, "5")
	if _, ok := st.Live["11"]; !ok {
		t.Error("the row inserted during the load was not picked up by the following pass")
	}
}

// interruptConsistentLoad stops a consistent initial load after page 2
// (each page its own transaction) and checks that the checkpoint says so.
func interruptConsistentLoad(t *testing.T, r *rig.Rig, cfg connector.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &hooked{Source: r.Src, after: func(n int, _ connector.Page) {
		if n == 2 {
			cancel()
		}
	}}
	if _, err := r.Engine(src, cfg).Run(ctx, connector.Once); err != nil {
		t.Fatalf("stopped run: %v", err)
	}
	if cp := r.Checkpoint(); cp.Phase != schemas.PhaseSnapshot {
		t.Fatalf("checkpoint after the stop: phase %q, want %q", cp.Phase, schemas.PhaseSnapshot)
	}
}

// TestConsistentLoadResumes: a consistent load stopped midway continues
// from its committed cursor under a new snapshot, never from scratch, and
// keeps the first snapshot's start as the watermark it hands to the
// incremental passes. Rows changed between the runs, before and after the
// cursor, are each published once; a row changed between the runs has a
// newer updated_at, past the cursor, so the resumed load itself reads it
// and the topic equals the table when `run --once` returns.
func TestConsistentLoadResumes(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 60, time.Second)
	cfg := connector.Config{PageSize: 5, TxnMaxRecords: 5, Margin: 10 * time.Second, Consistent: true}
	interruptConsistentLoad(t, r, cfg)
	stopped := r.Checkpoint()
	if stopped.Cursor == "" || stopped.PassHorizon == "" {
		t.Fatalf("the stopped load committed no cursor or no snapshot start: cursor %q, pass_horizon %q", stopped.Cursor, stopped.PassHorizon)
	}
	readBefore := stopped.Counters.Raw

	r.Exec(`UPDATE items SET v = 'read, then changed', updated_at = clock_timestamp() WHERE id = 1`)
	r.Exec(`UPDATE items SET v = 'not read yet, changed', updated_at = clock_timestamp() WHERE id = 50`)
	r.Exec(`INSERT INTO items (id, updated_at, v) VALUES (61, clock_timestamp(), 'inserted between the runs')`)
	c := r.Once(r.Src, cfg)
	// The resumed load reads what is left after the cursor (ids 11..60 at
	// their old positions, 49 of them, plus 50 at its new one), then the
	// first incremental pass reads the rows changed since the snapshot.
	if c.Raw >= 60 {
		t.Errorf("the resumed run read %d rows after %d were read before the stop: the load started over (a full load alone reads 61)", c.Raw, readBefore)
	}
	cp := r.Checkpoint()
	if cp.Phase != schemas.PhaseIdle {
		t.Errorf("checkpoint after the resumed load: phase %q", cp.Phase)
	}
	first, _ := schemas.ParseTime(stopped.PassHorizon)
	if w, _ := schemas.ParseTime(cp.Watermark); w.Before(first) {
		t.Errorf("watermark %s after the resumed load is before the first snapshot's start %s", cp.Watermark, stopped.PassHorizon)
	}
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}

// TestConsistentLoadNoDuplicatesBeyondBounds: an uninterrupted consistent
// load of a table many times larger than a page and a transaction, while
// rows change, publishes every row version once, and so does the pass
// after it.
func TestConsistentLoadNoDuplicatesBeyondBounds(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Exec(`INSERT INTO items (id, updated_at, v) SELECT g, clock_timestamp(), 'v' || g FROM generate_series(1, 3000) g`)
	src := &hooked{Source: r.Src}
	src.before = func(ctx context.Context, n int) error {
		if n%5 == 0 { // inside the snapshot: change rows read and not read yet
			r.Exec(`UPDATE items SET v = v || '+', updated_at = clock_timestamp() WHERE id IN ($1, $2)`, n, 3000-n)
		}
		return nil
	}
	cfg := connector.Config{PageSize: 100, TxnMaxRecords: 200, Margin: 10 * time.Second, Consistent: true}
	r.Once(src, cfg)
	// The pass after the load must publish what changed before it began,
	// so nothing changes while it runs: a pass reads one snapshot, and
	// run --once promises what committed before it started. (A transient
	// failure retried during the load adds pages, and a page count that
	// went on changing rows would change some in the last pass's view.)
	src.before = nil
	r.Once(src, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}

// TestConsistentLoadOnAPoolOfOne: a consistent initial load holds its
// snapshot's session, the only one of a pool of one, from its first page
// to its last; it must ask for no other (a pass's view is no use to it:
// it reads in its snapshot), or it waits for ever. The passes after it
// read in their views on that one session too.
func TestConsistentLoadOnAPoolOfOne(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 10, time.Second)
	pg := r.PG
	pg.DSN += "&pool_max_conns=1"
	src := r.Open(pg)
	cfg := connector.Config{PageSize: 3, Consistent: true, Margin: time.Second}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.Engine(src, cfg).Run(ctx, connector.Once); err != nil || ctx.Err() != nil {
		t.Fatalf("run --once on a pool of one: %v (context: %v)", err, ctx.Err())
	}
	r.Exec(`UPDATE items SET v = 'changed', updated_at = clock_timestamp() WHERE id = 4`)
	if _, err := r.Engine(src, cfg).Run(ctx, connector.Once); err != nil || ctx.Err() != nil {
		t.Fatalf("the pass after the load, on a pool of one: %v (context: %v)", err, ctx.Err())
	}
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}
