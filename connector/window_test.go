package connector_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
)

// TestTieGroupBeyondEveryBound: a one-statement bulk update leaves a tie
// group (many rows, one updated_at) several times larger than a page and
// than a transaction, on a quiet table. The pass that reads it publishes
// every row once; every later pass re-reads the window and publishes
// nothing. The source here proves nothing about what earlier passes saw,
// so the dedupe set alone must cover the whole window: it has no ceiling.
func TestTieGroupBeyondEveryBound(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	const n = 6000
	for i := range n {
		m.set(fmt.Sprintf("k%05d", i), t0.Add(time.Duration(i)*time.Millisecond), "v1", false)
	}
	cfg := connector.Config{PageSize: 250, TxnMaxRecords: 1000, Margin: 10 * time.Second}
	if c := r.once(m, cfg); c.Published != n {
		t.Fatalf("initial load published %d, want %d", c.Published, n)
	}
	bulk := t0.Add(time.Hour)
	for i := range n {
		m.set(fmt.Sprintf("k%05d", i), bulk, "bulk", false)
	}
	want := []int64{n, 0, 0, 0}
	for i, w := range want {
		c := r.once(m, cfg)
		if c.Published != w {
			t.Errorf("pass %d after the bulk update published %d records, want %d (read %d, deduplicated %d)", i+1, c.Published, w, c.Raw, c.Deduped)
		}
	}
	r.assertOnce(m.expected(), "")
}

// TestMarginRaisedBetweenRuns: sync.margin is a tuning setting and may
// change between runs. A larger margin must not re-read below the dedupe
// set's committed floor, whose entries were dropped: on a source without
// marks every row of that band would be published again. The pass starts
// at the floor until W - margin passes it.
func TestMarginRaisedBetweenRuns(t *testing.T) {
	r := newRig(t)
	T := t0.Add(time.Hour)
	now := func() time.Time { return T }
	m := newMemTable()
	m.set("old", T.Add(-60*time.Second), "x", false)
	m.set("new", T.Add(-1*time.Second), "y", false)
	r.once(m, connector.Config{Margin: 10 * time.Second, Now: now})
	r.once(m, connector.Config{Margin: 120 * time.Second, Now: now})
	// A late commit above the floor is still found with the larger margin.
	m.set("late", T.Add(-5*time.Second), "z", false)
	r.once(m, connector.Config{Margin: 120 * time.Second, Now: now})
	r.assertOnce(m.expected(), "after raising the margin")
}
