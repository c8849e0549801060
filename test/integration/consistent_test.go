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

// TestConsistentLoadInterruptedRestarts: a consistent load stopped midway
// cannot continue under a new snapshot; the next run starts it over, and
// the result equals the table.
func TestConsistentLoadInterruptedRestarts(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 9, time.Second)
	cfg := connector.Config{PageSize: 2, TxnMaxRecords: 2, Margin: 10 * time.Second, Consistent: true}
	interruptConsistentLoad(t, r, cfg)
	r.Exec(`UPDATE items SET v = 'changed between the runs', updated_at = $1 WHERE id = 1`, rig.T0.Add(time.Hour))
	r.Once(r.Src, cfg)
	st := r.AssertTable()
	if cp := r.Checkpoint(); cp.Phase != schemas.PhaseIdle {
		t.Errorf("checkpoint after the restarted load: phase %q", cp.Phase)
	}
	if st.Publications["1"][r.Expected()["1"]] != 1 {
		t.Errorf("key 1: the value changed between the runs was not published once: %v", st.Publications["1"])
	}
}

// TestConsistentLoadRestartDedupes: the restarted load re-reads, from
// scratch, the rows the interrupted one already published; unchanged, they
// must be skipped by the dedupe set, which (W being minus infinity) covers
// every row published so far (CONTRACT §3). Rows are a minute apart, so the
// mid-pass pruning of B by PassMax - margin drops the early ones.
func TestConsistentLoadRestartDedupes(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 9, time.Minute)
	cfg := connector.Config{PageSize: 2, TxnMaxRecords: 2, Margin: 10 * time.Second, Consistent: true}
	interruptConsistentLoad(t, r, cfg)
	c := r.Once(r.Src, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
	if c.Published != 5 {
		t.Errorf("the restarted load published %d records, want 5 (ids 5..9; ids 1..4 are unchanged and were committed before the stop)", c.Published)
	}
}
