package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/rig"
)

// TestAPassDoesNotChaseWriters: while a pass reads, a writer commits a
// page of new rows before every page it reads. A pass that walked to the
// end of the table as it found it would read page after page of rows
// committed after it began, for as long as the writer goes on; it reads
// the table as it was when it began instead (docs/design.md, "A pass reads
// one snapshot"). The rows it left are the next pass's.
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
	if pages := h.pages - before; pages > 2 {
		t.Errorf("the pass read %d pages while a writer committed a page before each: it chased the rows committed after it began (want 1, at most 2: the table as it was when it began holds no row to read)", pages)
	}
	h.before = nil
	r.Once(h, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}

// TestAPassReadsWhatWasVisibleAboveItsClock: rows dated hours ahead of
// the database's clock are committed before a pass begins, while an older
// writer is still open (so their transaction ids are not below the pass's
// mark). The pass must read every version visible when it began, above
// the clock of its start too: `run --once` promises what was committed
// before it started, and the next pass is no help to a run that has
// stopped.
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

// TestAPassReadsARowThatMovedAheadWhileItRead: a row is changed ('one')
// and committed before `run --once` starts; while the pass reads the rows
// before its place, a writer changes it again ('two', dated now). The pass
// must publish one or the other: 'one' was committed before it began.
// Leaving out what committed after its start by the new version's date
// and transaction id alone, on pages that each read the table as it is
// then, loses both: 'one' is gone from the table by the time its page is
// read and 'two' is left to a next pass that `--once` never runs; under a
// stream of updates to one row, no pass would ever publish it.
func TestAPassReadsARowThatMovedAheadWhileItRead(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 10, time.Second)
	cfg := connector.Config{PageSize: 2, Margin: time.Second}
	h := &hooked{Source: r.Src}
	r.Once(h, cfg)

	// Rows the pass reads before it reaches the changed row.
	for id := 20; id <= 23; id++ {
		r.InsertAt(id, rig.T0.Add(9500*time.Millisecond), "before it")
	}
	r.Exec(`UPDATE items SET v = 'one', updated_at = clock_timestamp() WHERE id = 2`)
	first := h.pages + 1
	h.before = func(ctx context.Context, n int) error {
		if n == first+1 {
			r.Exec(`UPDATE items SET v = 'two', updated_at = clock_timestamp() WHERE id = 2`)
		}
		return nil
	}
	r.Once(h, cfg)
	h.before = nil
	got, ok := r.Fold().Live["2"]
	if !ok || !strings.Contains(string(got.Value), `"v":"one"`) && !strings.Contains(string(got.Value), `"v":"two"`) {
		t.Fatalf("after run --once, row 2 in the topic is %s (live %v): want 'one', committed before the run began, or 'two'", got.Value, ok)
	}
	r.Once(h, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
}
