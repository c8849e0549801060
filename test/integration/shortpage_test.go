package integration

import (
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/rig"
)

// TestPassEndsAtAShortPage: a page with fewer rows than the limit proves
// that nothing followed its last row when it was read, as an empty page
// read then would (docs/design.md, "Passes"), so the pass ends there: a
// table smaller than a page takes one page query, not two, and under a
// steady stream of writes passes end (and W moves) instead of chasing the
// newest row. The topic still equals the table after writes between
// passes, below and above the cursor.
func TestPassEndsAtAShortPage(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 5, time.Millisecond)
	cfg := connector.Config{PageSize: 100, Margin: time.Second}
	c := r.Once(r.Src, cfg)
	if c.Pages != 1 || c.Published != 5 {
		t.Errorf("first pass: %d pages, %d published; want 1 page (5 rows < 100) and 5", c.Pages, c.Published)
	}
	r.AssertTable()
	// Rows written below and above the cursor between passes are read by
	// the next pass, which again ends at its short page.
	r.Seed(6, 40, time.Millisecond)
	r.Exec(`UPDATE items SET updated_at = clock_timestamp(), v = 'moved' WHERE id IN (2, 30)`)
	if c = r.Once(r.Src, cfg); c.Pages != 1 {
		t.Errorf("second pass: %d pages, want 1", c.Pages)
	}
	r.AssertTable()

	// A full page proves nothing about what follows: 100 rows in pages of
	// 100 take the full page and then an empty one.
	r2 := newRig(t, rig.ItemsDDL, "items")
	r2.Seed(1, 100, time.Millisecond)
	if c := r2.Once(r2.Src, cfg); c.Pages != 2 || c.Published != 100 {
		t.Errorf("100 rows in pages of 100: %d pages, %d published; want 2 and 100", c.Pages, c.Published)
	}
	r2.AssertTable()
}
