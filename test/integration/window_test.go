package integration

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/rig"
)

// TestBulkUpdateBeyondEveryBound: one statement gives 6,000 rows one
// updated_at on a quiet table: a tie group 24 times a page and 6 times a
// transaction. The next pass publishes every changed row once; the three
// after it publish nothing. With no writer open, the pass's mark proves the
// group settled and the later passes do not even read it; with a writer
// held open since before the update, nothing is proven and the dedupe set
// alone (6,000 entries in segments of the offsets topic) skips the group on
// every pass, including a pass that fails midway and resumes from the
// committed checkpoint, and a new engine (a restart) that reads the set
// back.
func TestBulkUpdateBeyondEveryBound(t *testing.T) {
	const n = 6000
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("writer held open %v", held), func(t *testing.T) {
			r := newRig(t, rig.ItemsDDL, "items")
			r.Exec(`INSERT INTO items (id, updated_at, v) SELECT g, $1::timestamptz + g * interval '1 ms', 'v' || g FROM generate_series(1, $2::int) g`, rig.T0, n)
			cfg := connector.Config{PageSize: 250, TxnMaxRecords: 1000, Margin: 10 * time.Second}
			if c := r.Once(r.Src, cfg); c.Published != n {
				t.Fatalf("initial load published %d, want %d", c.Published, n)
			}
			if held {
				defer holdOldestTransaction(t, r)()
			}
			r.Exec(`UPDATE items SET v = v || '-bulk', updated_at = now()`)

			// The pass that reads the group fails once after 3 of its 6
			// transactions and resumes on the same engine.
			src := &hooked{Source: r.Src}
			failed := false
			src.before = func(ctx context.Context, page int) error {
				if page == 14 && !failed {
					failed = true
					return errors.New("injected: connection reset mid-pass")
				}
				return nil
			}
			c := r.Once(src, cfg)
			if c.Published != n {
				t.Errorf("the pass after the bulk update published %d records, want %d", c.Published, n)
			}
			if !failed {
				t.Error("the injected failure did not happen")
			}
			entries := r.Checkpoint().Boundary.Entries
			if held && entries != n {
				t.Errorf("dedupe set holds %d entries, want all %d (nothing is settled while the writer is open)", entries, n)
			}
			if !held && entries != 0 {
				t.Errorf("dedupe set holds %d entries, want 0 (every row settled)", entries)
			}
			for i := range 3 {
				c := r.Once(r.Src, cfg) // a new engine each time: B is read back
				want := int64(0)
				if held {
					want = n
				}
				if c.Published != 0 || c.Raw != want || c.Deduped != want {
					t.Errorf("pass %d after: read %d, deduplicated %d, published %d; want %d, %d, 0", i+2, c.Raw, c.Deduped, c.Published, want, want)
				}
			}
			st := r.AssertTable()
			rig.AssertNoDupes(t, st)
		})
	}
}
