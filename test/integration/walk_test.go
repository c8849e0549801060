package integration

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// TestTableSizes walks tables whose size falls at every edge of the page
// size; each ends equal to the table, with no duplicate publication, and a
// re-run publishes nothing.
func TestTableSizes(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rows, page int
	}{
		{"empty", 0, 10},
		{"fewer_than_a_page", 3, 10},
		{"exact_multiple_of_page", 6, 3},
		{"page_size_1", 5, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rig.ItemsDDL, "items")
			r.Seed(1, tc.rows, time.Second)
			cfg := connector.Config{PageSize: tc.page}
			c := r.Once(r.Src, cfg)
			want := r.Expected()
			if len(want) != tc.rows {
				t.Fatalf("the table walk found %d rows, seeded %d", len(want), tc.rows)
			}
			st := r.AssertFolded(want)
			rig.AssertNoDupes(t, st)
			if c.Published != int64(tc.rows) {
				t.Errorf("completion: published %d, want %d", c.Published, tc.rows)
			}
			// End of pass = the first page that is not full (docs/design.md,
			// "The walk"): every full page, then one short or empty page.
			if wantPages := int64(tc.rows/tc.page + 1); c.Pages != wantPages {
				t.Errorf("completion: %d pages, want %d (full pages, then the short or empty page that ends the pass)", c.Pages, wantPages)
			}
			assertRerunPublishesNothing(t, r, r.Src, cfg, nil, st.Records)
		})
	}
}

// assertRerunPublishesNothing runs again over the unchanged table: the
// topic's record count must not move and the topic must still equal the
// table.
// want nil means the table as it is.
func assertRerunPublishesNothing(t *testing.T, r *rig.Rig, src connector.Source, cfg connector.Config, want map[string]string, before int) {
	t.Helper()
	c := r.Once(src, cfg)
	if want == nil {
		want = r.Expected()
	}
	st := r.AssertFolded(want)
	if st.Records != before {
		t.Errorf("re-run over an unchanged table: the topic went from %d to %d records", before, st.Records)
	}
	if c.Published != 0 {
		t.Errorf("re-run over an unchanged table: completion says %d published", c.Published)
	}
}

// TestTiesAcrossPageBoundary: five rows share one updated_at and the page
// size is 2, so two page boundaries fall inside the tie.
func TestTiesAcrossPageBoundary(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	for id := 1; id <= 5; id++ {
		r.InsertAt(id, rig.T0, fmt.Sprintf("tie%d", id))
	}
	r.InsertAt(6, rig.T0.Add(time.Second), "after")
	c := r.Once(r.Src, connector.Config{PageSize: 2})
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
	if len(st.Live) != 6 || c.Published != 6 {
		t.Errorf("live %d, published %d; want 6 and 6", len(st.Live), c.Published)
	}
	for id := 1; id <= 5; id++ {
		if h := st.Live[fmt.Sprint(id)].Headers[schemas.HeaderUpdatedAt]; h != "2024-05-01T12:00:00.000000Z" {
			t.Errorf("id %d: updated_at header %q", id, h)
		}
	}
}

// TestMicrosecondBoundaries: rows whose updated_at differ only in the sixth
// decimal, with page boundaries between them, for several page sizes, and a
// resume whose stored cursor sits on such a boundary.
func TestMicrosecondBoundaries(t *testing.T) {
	for _, page := range []int{1, 2, 3} {
		t.Run(fmt.Sprint("page", page), func(t *testing.T) {
			r := newRig(t, rig.ItemsDDL, "items")
			// ids descend while time ascends, so the id never decides the
			// order: only the microsecond does.
			for i := range 7 {
				r.InsertAt(100-i, rig.T0.Add(time.Duration(i)*time.Microsecond), fmt.Sprintf("µ%d", i))
			}
			// Stop after page 2 and resume: the checkpoint's cursor must
			// carry the microsecond exactly.
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			src := &hooked{Source: r.Src, after: func(n int, _ connector.Page) {
				if n == 2 {
					cancel()
				}
			}}
			cfg := connector.Config{PageSize: page, TxnMaxRecords: 1}
			if _, err := r.Engine(src, cfg).Run(ctx, connector.Once); err != nil {
				t.Fatalf("first run: %v", err)
			}
			r.Once(r.Src, cfg)
			st := r.AssertTable()
			rig.AssertNoDupes(t, st)
			if len(st.Live) != 7 {
				t.Errorf("live %d, want 7", len(st.Live))
			}
			for i := range 7 {
				id := fmt.Sprint(100 - i)
				want := schemas.FormatTime(rig.T0.Add(time.Duration(i) * time.Microsecond))
				if h := st.Live[id].Headers[schemas.HeaderUpdatedAt]; h != want {
					t.Errorf("id %s: updated_at header %q, want %q", id, h, want)
				}
			}
		})
	}
}

// TestMutationsBetweenPages mutates the table between pages of the first
// pass: an insert behind the cursor (within the margin), an insert ahead of
// it, an update of a row already read, soft deletes of a read and an unread
// row, and a hard DELETE of the cursor's anchor row. The first pass reads
// the table as it was when it began; the second the changes.
func TestMutationsBetweenPages(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 10, time.Second) // ids 1..10 at rig.T0+1s .. rig.T0+10s
	before := r.Expected()
	const page = 3
	var anchor string
	src := &hooked{Source: r.Src}
	src.after = func(n int, p connector.Page) {
		if n == 2 {
			anchor = p.Rows[len(p.Rows)-1].ID // the cursor's anchor: id 6
		}
	}
	src.before = func(ctx context.Context, n int) error {
		if n != 3 {
			return nil
		}
		// Pages 1 and 2 read ids 1..6; the cursor is at id 6.
		r.InsertAt(11, rig.T0.Add(2500*time.Millisecond), "behind") // behind the cursor, within the margin of W = rig.T0+23s
		r.InsertAt(12, rig.T0.Add(20*time.Second), "ahead")
		r.Exec(`UPDATE items SET v = 'v2-updated', updated_at = $1 WHERE id = 2`, rig.T0.Add(21*time.Second))
		r.Exec(`UPDATE items SET deleted_at = $1, updated_at = $1 WHERE id = 3`, rig.T0.Add(22*time.Second)) // read
		r.Exec(`UPDATE items SET deleted_at = $1, updated_at = $1 WHERE id = 8`, rig.T0.Add(23*time.Second)) // unread
		r.Exec(`DELETE FROM items WHERE id = $1`, anchor)
		return nil
	}
	cfg := connector.Config{PageSize: page, Margin: 30 * time.Second}
	r.Once(src, cfg)
	if anchor != "6" {
		t.Fatalf("anchor of page 2 is %q, want 6", anchor)
	}

	// The pass reads the table as it was when it began (docs/design.md, "A
	// pass reads one snapshot"): everything ahead of the cursor then, and
	// none of the changes made while it read, ahead of the cursor or
	// behind it. Those are the next pass's, which starts at W - margin.
	st := r.Fold()
	for _, id := range []string{"7", "8", "9", "10"} {
		if got := string(st.Live[id].Value); got != before[id] {
			t.Errorf("key %s (ahead of the cursor): %q after the first pass, want its value when the pass began, %q", id, got, before[id])
		}
	}
	for _, id := range []string{"11", "12"} {
		if _, ok := st.Live[id]; ok {
			t.Errorf("key %s, inserted after the pass began, published by it", id)
		}
	}
	if got := string(st.Live["2"].Value); got != before["2"] {
		t.Errorf("key 2: %s after the first pass, want its value when the pass began", got)
	}
	r.Once(src, cfg)

	// A hard delete is invisible to the walk: only a reconciliation sweep
	// can tombstone it, so the topic keeps id 6's last state.
	want := r.Expected()
	want[anchor] = before[anchor]
	st = r.AssertFolded(want)
	rig.AssertNoDupes(t, st)
	rig.AssertTombstoned(t, st, "3")
	rig.AssertTombstoned(t, st, "8")
	if string(st.Live["2"].Value) == before["2"] || st.Publications["2"][before["2"]] != 1 {
		t.Errorf("key 2: want the first value published once and then the updated one; got %v", st.Publications["2"])
	}
	if _, ok := st.Live["11"]; !ok {
		t.Error("key 11 (inserted behind the cursor, within the margin) never published")
	}
	assertRerunPublishesNothing(t, r, r.Src, cfg, want, st.Records)
}

// TestAnchorHardDeleted: the row a stored cursor points at is hard-deleted
// between pages; the strict-greater seek continues and loses nothing else.
func TestAnchorHardDeleted(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	// Ties around the anchor make the seek's (updated_at, id) comparison
	// matter: ids 1..4 share rig.T0, the anchor after page 1 is id 2.
	for id := 1; id <= 4; id++ {
		r.InsertAt(id, rig.T0, "tie")
	}
	for id := 5; id <= 8; id++ {
		r.InsertAt(id, rig.T0.Add(time.Duration(id)*time.Microsecond), "next")
	}
	before := r.Expected()
	src := &hooked{Source: r.Src}
	var anchor string // the last row of the latest page: the cursor's anchor
	src.after = func(n int, p connector.Page) {
		if len(p.Rows) > 0 {
			anchor = p.Rows[len(p.Rows)-1].ID
		}
	}
	src.before = func(ctx context.Context, n int) error {
		if n == 2 || n == 4 {
			r.Exec(`DELETE FROM items WHERE id = $1`, anchor) // id 2 after page 1, id 6 after page 3
		}
		return nil
	}
	r.Once(src, connector.Config{PageSize: 2})
	// Anchors deleted: id 2 (after page 1) and id 6 (after page 3). Both
	// were published before they were deleted; nothing else is missing.
	want := r.Expected()
	if _, ok := want["2"]; ok {
		t.Fatal("id 2 was not deleted")
	}
	if _, ok := want["6"]; ok {
		t.Fatal("id 6 was not deleted")
	}
	want["2"], want["6"] = before["2"], before["6"]
	st := r.AssertFolded(want)
	rig.AssertNoDupes(t, st)

	// The reconciliation sweep (docs/design.md, "Deletes and the sweep") then tombstones the two ids
	// gone from the table, and the topic equals the table.
	res, err := r.Engine(r.Src, connector.Config{PageSize: 2}).SweepOnce(context.Background(), fold.Topic{Opts: r.Opts, Topic: r.Topic})
	if err != nil {
		t.Fatalf("sweep: %v", err)
	}
	if res.Tombstoned != 2 || res.Repaired != 0 {
		t.Errorf("sweep: %s; want 2 tombstoned, 0 repaired", res)
	}
	st = r.AssertTable()
	rig.AssertTombstoned(t, st, "2")
	rig.AssertTombstoned(t, st, "6")
	rig.AssertNoDupes(t, st)
}
