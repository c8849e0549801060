package integration

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// TestConsistentInitialLoad: the first load reads one REPEATABLE READ
// snapshot, so the topic equals the table as it was when the load began,
// even though rows are inserted, updated and soft-deleted while it runs;
// the following pass picks all of those up and the topic equals the table.
func TestConsistentInitialLoad(t *testing.T) {
	r := newRig(t, itemsDDL, "items")
	r.seed(10, time.Second)
	atStart := r.expected()
	src := &hooked{Source: r.src}
	src.before = func(ctx context.Context, n int) error {
		if n == 2 { // inside the snapshot, after page 1 (ids 1..3)
			r.exec(`INSERT INTO items (id, updated_at, v) VALUES (11, clock_timestamp(), 'during the load')`)
			r.exec(`UPDATE items SET v = 'v1-updated', updated_at = clock_timestamp() WHERE id = 1`) // read
			r.exec(`UPDATE items SET v = 'v9-updated', updated_at = clock_timestamp() WHERE id = 9`) // not read yet
			r.exec(`UPDATE items SET deleted_at = clock_timestamp(), updated_at = clock_timestamp() WHERE id = 5`)
		}
		return nil
	}
	cfg := connector.Config{PageSize: 3, Consistent: true}
	r.once(src, cfg)
	st := r.assertFolded(atStart)
	assertNoDupes(t, st)
	cp := r.checkpoint()
	if cp.Phase != schemas.PhaseIdle || cp.Watermark == "" {
		t.Fatalf("after the consistent load: phase %q watermark %q", cp.Phase, cp.Watermark)
	}
	if w, _ := schemas.ParseTime(cp.Watermark); !w.After(t0.Add(10 * time.Second)) {
		t.Errorf("watermark %s after the consistent load; want the snapshot's start, a real clock reading", cp.Watermark)
	}

	r.once(src, cfg)
	st = r.assertTable()
	assertNoDupes(t, st)
	assertTombstoned(t, st, "5")
	if _, ok := st.Live["11"]; !ok {
		t.Error("the row inserted during the load was not picked up by the following pass")
	}
}

// interruptConsistentLoad stops a consistent initial load after page 2
// (each page its own transaction) and checks that the checkpoint says so.
func interruptConsistentLoad(t *testing.T, r *rig, cfg connector.Config) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &hooked{Source: r.src, after: func(n int, _ connector.Page) {
		if n == 2 {
			cancel()
		}
	}}
	if _, err := r.engine(src, cfg).Run(ctx, connector.Once); err != nil {
		t.Fatalf("stopped run: %v", err)
	}
	if cp := r.checkpoint(); cp.Phase != schemas.PhaseSnapshot {
		t.Fatalf("checkpoint after the stop: phase %q, want %q", cp.Phase, schemas.PhaseSnapshot)
	}
}

// TestConsistentLoadInterruptedRestarts: a consistent load stopped midway
// cannot continue under a new snapshot; the next run starts it over, and
// the result equals the table.
func TestConsistentLoadInterruptedRestarts(t *testing.T) {
	r := newRig(t, itemsDDL, "items")
	r.seed(9, time.Second)
	cfg := connector.Config{PageSize: 2, TxnMaxRecords: 2, Margin: 10 * time.Second, Consistent: true}
	interruptConsistentLoad(t, r, cfg)
	r.exec(`UPDATE items SET v = 'changed between the runs', updated_at = $1 WHERE id = 1`, t0.Add(time.Hour))
	r.once(r.src, cfg)
	st := r.assertTable()
	if cp := r.checkpoint(); cp.Phase != schemas.PhaseIdle {
		t.Errorf("checkpoint after the restarted load: phase %q", cp.Phase)
	}
	if st.Publications["1"][r.expected()["1"]] != 1 {
		t.Errorf("key 1: the value changed between the runs was not published once: %v", st.Publications["1"])
	}
}

// TestConsistentLoadRestartDedupes: the restarted load re-reads, from
// scratch, the rows the interrupted one already published; unchanged, they
// must be skipped by the dedupe set, which (W being minus infinity) covers
// every row published so far (CONTRACT §3). Rows are a minute apart, so the
// mid-pass pruning of B by PassMax - margin drops the early ones.
func TestConsistentLoadRestartDedupes(t *testing.T) {
	r := newRig(t, itemsDDL, "items")
	r.seed(9, time.Minute)
	cfg := connector.Config{PageSize: 2, TxnMaxRecords: 2, Margin: 10 * time.Second, Consistent: true}
	interruptConsistentLoad(t, r, cfg)
	c := r.once(r.src, cfg)
	st := r.assertTable()
	assertNoDupes(t, st)
	if c.Published != 5 {
		t.Errorf("the restarted load published %d records, want 5 (ids 5..9; ids 1..4 are unchanged and were committed before the stop)", c.Published)
	}
}
