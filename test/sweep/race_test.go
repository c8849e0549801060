package sweep

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/rig"
)

// world is the writers' model of the table: which ids exist, which were
// hard-deleted (and may be re-inserted), and every id that was ever deleted
// in any way. A tombstone for an id outside everDeleted is a tombstone of a
// row that was never deleted: the bug the sweep must not have.
type world struct {
	t  *testing.T
	r  *rig.Rig
	mu sync.Mutex
	// rng is shared by every writer; each draw happens under mu.
	rng         *rand.Rand
	maxID       int
	gone        []int // hard-deleted ids, candidates for re-insert
	everDeleted map[string]bool
	ops         map[string]int
}

func (w *world) intn(n int) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rng.IntN(n)
}

func (w *world) count(op string) { w.mu.Lock(); w.ops[op]++; w.mu.Unlock() }

func (w *world) exec(ctx context.Context, sql string, args ...any) (int64, error) {
	tag, err := w.r.DB.Pool.Exec(ctx, sql, args...)
	return tag.RowsAffected(), err
}

// insert adds a new id.
func (w *world) insert(ctx context.Context) error {
	w.mu.Lock()
	w.maxID++
	id := w.maxID
	w.mu.Unlock()
	_, err := w.exec(ctx, `INSERT INTO items (id, v) VALUES ($1, $2)`, id, fmt.Sprintf("n%d", id))
	w.count("insert")
	return err
}

// update changes a random id's value (and updated_at, as an application
// must), or does nothing when the id does not exist.
func (w *world) update(ctx context.Context) error {
	w.mu.Lock()
	id, v := 1+w.rng.IntN(w.maxID), w.rng.Uint32()
	w.mu.Unlock()
	_, err := w.exec(ctx, `UPDATE items SET v = $2, updated_at = clock_timestamp() WHERE id = $1`, id, fmt.Sprintf("u%d", v))
	w.count("update")
	return err
}

// reinsert brings back a hard-deleted id, with a new value and updated_at.
func (w *world) reinsert(ctx context.Context) error {
	w.mu.Lock()
	if len(w.gone) == 0 {
		w.mu.Unlock()
		return nil
	}
	i := w.rng.IntN(len(w.gone))
	id := w.gone[i]
	w.gone = slices.Delete(w.gone, i, i+1)
	v := w.rng.Uint32()
	w.mu.Unlock()
	_, err := w.exec(ctx, `INSERT INTO items (id, v) VALUES ($1, $2)`, id, fmt.Sprintf("r%d", v))
	w.count("reinsert")
	return err
}

// softDelete sets deleted_at on a random id, or clears it (an undelete).
func (w *world) softDelete(ctx context.Context) error {
	w.mu.Lock()
	id, undo := 1+w.rng.IntN(w.maxID), w.rng.IntN(2) == 0
	w.everDeleted[strconv.Itoa(id)] = true
	w.mu.Unlock()
	sql := `UPDATE items SET deleted_at = clock_timestamp(), updated_at = clock_timestamp() WHERE id = $1 AND deleted_at IS NULL`
	if undo {
		sql = `UPDATE items SET deleted_at = NULL, updated_at = clock_timestamp() WHERE id = $1 AND deleted_at IS NOT NULL`
	}
	_, err := w.exec(ctx, sql, id)
	w.count("soft-delete")
	return err
}

// hardDelete removes a random existing id.
func (w *world) hardDelete(ctx context.Context) error {
	w.mu.Lock()
	id := 1 + w.rng.IntN(w.maxID)
	w.everDeleted[strconv.Itoa(id)] = true
	w.mu.Unlock()
	var got int
	err := w.r.DB.Pool.QueryRow(ctx, `DELETE FROM items WHERE id = $1 RETURNING id`, id).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.gone = append(w.gone, id)
	w.mu.Unlock()
	w.count("hard-delete")
	return nil
}

// mutate does one random write that a pass can see: never a hard delete,
// which only a sweep that starts after it can see.
func (w *world) mutate(ctx context.Context) error {
	switch w.intn(10) {
	case 0, 1, 2:
		return w.insert(ctx)
	case 3, 4, 5:
		return w.update(ctx)
	case 6, 7, 8:
		return w.reinsert(ctx)
	default:
		return w.softDelete(ctx)
	}
}

// racy is the PostgreSQL source with writes injected at the two instants
// the sweep's argument depends on: after the topic was read (E) but before
// the snapshot (S), and after S while the sweep compares and publishes.
// After `sweeps` complete sweeps it cancels the run at the start of the
// next one, so that every injected hard delete precedes a sweep that ran
// to the end.
type racy struct {
	*postgres.Source
	w      *world
	sweeps int
	cancel context.CancelFunc
	mu     sync.Mutex
	n      int
	failed error
}

var _ connector.LiveScanner = (*racy)(nil)

func (s *racy) ScanLive(ctx context.Context, fn func(*connector.Row) error) (time.Time, error) {
	s.mu.Lock()
	s.n++
	n := s.n
	s.mu.Unlock()
	if n > s.sweeps {
		s.cancel()
		return time.Time{}, context.Canceled
	}
	// Between E and S: a hard delete (must be tombstoned: it precedes S), a
	// re-insert and an update (must not be: they are in S).
	for _, op := range []func(context.Context) error{s.w.hardDelete, s.w.reinsert, s.w.update, s.w.hardDelete} {
		if err := op(ctx); err != nil {
			return time.Time{}, fmt.Errorf("injected write before the snapshot: %w", err)
		}
	}
	first := true
	return s.Source.ScanLive(ctx, func(r *connector.Row) error {
		if first {
			// After S, before any tombstone is published: re-inserts of ids
			// the sweep is about to tombstone, a new id, an update.
			first = false
			for _, op := range []func(context.Context) error{s.w.reinsert, s.w.reinsert, s.w.insert, s.w.update, s.w.softDelete} {
				if err := op(ctx); err != nil {
					return fmt.Errorf("injected write after the snapshot: %w", err)
				}
			}
		}
		return fn(r)
	})
}

// TestSweepRacingWriters: many seeded iterations of a writer inserting,
// updating, soft-deleting and re-inserting rows while the engine runs
// passes and sweeps back to back, with writes also injected between the
// topic read and the snapshot and right after the snapshot. Nothing live is
// ever tombstoned: every tombstone in the topic belongs to an id that was
// deleted at some point, and after each iteration a pass (run --once)
// leaves the folded topic equal to the table, keys and values.
func TestSweepRacingWriters(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TIDEMARK_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("TIDEMARK_SEED=%q: %v", s, err)
		}
		seed = v
	}
	iters := 8
	if s := os.Getenv("TIDEMARK_SWEEP_ITERATIONS"); s != "" {
		iters, _ = strconv.Atoi(s)
	}
	t.Logf("seed %d (rerun with TIDEMARK_SEED=%d), %d iterations", seed, seed, iters)

	r := newRig(t)
	w := &world{t: t, r: r, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), everDeleted: map[string]bool{}, ops: map[string]int{}}
	ctx := context.Background()
	for range 150 {
		if err := w.insert(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cfg := connector.Config{PageSize: 50, TxnMaxRecords: 80, PollInterval: time.Millisecond, SweepInterval: time.Nanosecond}
	r.Once(r.Src, connector.Config{PageSize: 50, TxnMaxRecords: 80})

	var swept connector.SweepResult
	for it := range iters {
		// Quiescent hard deletes, of published and of unpublished rows.
		for range 1 + w.intn(6) {
			if err := w.hardDelete(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for range w.intn(4) {
			if err := w.insert(ctx); err != nil {
				t.Fatal(err)
			}
		}

		wctx, stopWriter := context.WithCancel(ctx)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Bounded and paced, so that a pass can catch up with it and
			// the engine reaches its sweeps.
			for range 200 {
				if wctx.Err() != nil {
					return
				}
				if err := w.mutate(wctx); err != nil && wctx.Err() == nil {
					t.Errorf("writer: %v", err)
					return
				}
				time.Sleep(time.Duration(w.intn(1000)) * time.Microsecond)
			}
		}()
		rctx, cancel := context.WithCancel(ctx)
		src := &racy{Source: r.Src, w: w, sweeps: 2 + w.intn(3), cancel: cancel}
		e := r.Engine(src, cfg)
		if _, err := e.Run(rctx, connector.Continuous); err != nil {
			t.Fatalf("iteration %d: run: %v", it, err)
		}
		cancel()
		stopWriter()
		wg.Wait()
		if t.Failed() {
			t.FailNow()
		}

		// A pass, as `tidemark run --once`, with no sweep due: it must leave
		// the topic equal to the table on its own.
		r.Once(r.Src, connector.Config{PageSize: 50, TxnMaxRecords: 80})
		st := r.Fold()
		if d := rig.Diff(st, r.Expected()); len(d) > 0 {
			t.Fatalf("iteration %d (seed %d): the folded topic differs from the table after a pass:\n  %s", it, seed, join(d))
		}
		w.mu.Lock()
		var wrong []string
		for _, k := range rig.Tombstoned(st) {
			if !w.everDeleted[k] {
				wrong = append(wrong, k)
			}
		}
		w.mu.Unlock()
		if len(wrong) > 0 {
			t.Fatalf("iteration %d (seed %d): tombstones for ids that were never deleted: %v", it, seed, wrong)
		}
		if cp := r.Checkpoint(); cp.LastSweep != nil {
			swept.Tombstoned, swept.Repaired = cp.LastSweep.Tombstoned, cp.LastSweep.Repaired
		}
	}
	st := r.Fold()
	t.Logf("writes %v; topic: %d records, %d tombstones, %d live keys", w.ops, st.Records, st.Tombstones, len(st.Live))
	if w.ops["hard-delete"] == 0 || w.ops["reinsert"] == 0 || st.Tombstones == 0 {
		t.Errorf("the workload did not exercise deletes and re-inserts: %v", w.ops)
	}
	if rep := r.Verify(); !rep.OK() {
		t.Errorf("verify at the end:\n%s", rep.Text())
	}
}

func join(d []string) string {
	out := ""
	for i, s := range d {
		if i == 20 {
			return out + fmt.Sprintf("\n  ... and %d more", len(d)-20)
		}
		if i > 0 {
			out += "\n  "
		}
		out += s
	}
	return out
}
