package integration

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/rig"
)

// TestAPassDoesNotChaseWriters: while a pass reads, a writer commits a
// page of new rows before every page it reads. A pass that walked to the
// end of the table as it found it would read page after page of rows
// committed after it began, for as long as the writer goes on; it ends at
// the clock of its start instead (docs/design.md, "A pass ends at its
// clock"). The rows it left are the next pass's.
func TestAPassDoesNotChaseWriters(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 10, time.Second)
	cfg := connector.Config{PageSize: 5, Margin: time.Second}
	h := &hooked{Source: r.Src}
	r.Once(h, cfg)

	const rounds = 40
	id, written := 1000, 0
	h.before = func(ctx context.Context, n int) error {
		if written == rounds {
			return nil
		}
		written++
		for range cfg.PageSize {
			id++
			r.Exec(`INSERT INTO items (id, v) VALUES ($1, 'during')`, id)
		}
		return nil
	}
	before := h.pages
	r.Once(h, cfg)
	if pages := h.pages - before; pages > 4 {
		t.Errorf("the pass read %d pages while a writer committed a page before each: it chased the rows committed after it began (want at most 4 pages: its range up to its clock, and the part above for what was visible at its start)", pages)
	}
	h.before = nil
	r.Once(h, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}

// TestAPassReadsWhatWasVisibleAboveItsClock: a row dated an hour ahead of
// the database's clock is committed before a pass begins, while an older
// writer is still open (so the row's transaction id is not below the
// pass's mark). The pass ends its range at its clock, but it must still
// read every version visible when it began: `run --once` promises what was
// committed before it started, and the next pass, whose range starts
// below the row, is no later help to a run that has stopped.
func TestAPassReadsWhatWasVisibleAboveItsClock(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 3, time.Second)
	r.Exec(`CREATE TABLE other (x int)`)
	cfg := connector.Config{PageSize: 2, Margin: time.Second}
	r.Once(r.Src, cfg)

	ctx := context.Background()
	tx, err := r.DB.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO other VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	r.Exec(`INSERT INTO items (id, updated_at, v) VALUES (100, clock_timestamp() + interval '1 hour', 'ahead')`)
	r.Exec(`UPDATE items SET v = 'changed', updated_at = clock_timestamp() + interval '2 hours' WHERE id = 2`)
	r.Once(r.Src, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}
