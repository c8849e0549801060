package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// TestStopAndResume cancels the run from inside the source after page k,
// then runs again: the final state equals the table and no (id, value) was
// published twice. With one page per transaction the stop lands between
// commits: page k is fetched while the commit of page k-1 is in flight,
// and it is published if that commit ended first, or else dropped (never
// handed to the producer) and read again by the resumed run. With the
// default bounds the pages read so far sit in the open transaction, which
// the clean stop commits.
func TestStopAndResume(t *testing.T) {
	for _, tc := range []struct {
		name      string
		txRecords int
		k         int
		kept      []int // rows the stopped run may commit
	}{
		{"commit_per_page", 3, 4, []int{9, 12}},
		{"open_transaction_at_stop", 0, 3, []int{9}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, rig.ItemsDDL, "items")
			for i := 1; i <= 20; i++ {
				r.InsertAt(i, rig.T0.Add(time.Duration(i)*time.Microsecond), fmt.Sprintf("v%d", i))
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			pagesServed := 0
			src := &hooked{Source: r.Src, after: func(n int, _ connector.Page) {
				pagesServed = n
				if n == tc.k {
					cancel()
				}
			}}
			retries := &retryCount{}
			cfg := connector.Config{PageSize: 3, TxnMaxRecords: tc.txRecords, Observer: retries}
			c, err := r.Engine(src, cfg).Run(ctx, connector.Once)
			cfg.Observer = nil
			if err != nil {
				t.Fatalf("stopped run: %v", err)
			}
			if pagesServed != tc.k {
				t.Errorf("the engine read %d pages after the cancel at page %d", pagesServed-tc.k, tc.k)
			}
			// The stop kept the pages handed to the producer, committed,
			// and the checkpoint resumes the open pass after them.
			st := r.Fold()
			kept := int(c.Published)
			switch {
			case len(st.Live) != kept:
				t.Errorf("after the stop: %d live keys, %d published", len(st.Live), c.Published)
			case retries.n.Load() > 0:
				// A transient failure resumed the stopped run from its last
				// checkpoint, re-reading pages: the stop then lands
				// elsewhere. What it kept is still checked below.
				t.Logf("the stopped run retried %d times; it kept %d rows", retries.n.Load(), kept)
			case !slices.Contains(tc.kept, kept):
				t.Errorf("after the stop: %d live keys, %d published; want one of %v", len(st.Live), c.Published, tc.kept)
			}
			cp := r.Checkpoint()
			if cp.Phase != schemas.PhasePass || cp.Cursor == "" {
				t.Errorf("checkpoint after the stop: phase %q cursor %q; want an open pass with a cursor", cp.Phase, cp.Cursor)
			}
			c2 := r.Once(r.Src, cfg)
			st = r.AssertTable()
			rig.AssertNoDupes(t, st)
			if c2.Published != int64(20-kept) {
				t.Errorf("resumed run published %d, want %d", c2.Published, 20-kept)
			}
			if st.Records != 20 {
				t.Errorf("the topic holds %d records, want 20", st.Records)
			}
		})
	}
}

// TestAbortedTransactionLeavesNothing: the source fails permanently after
// rows were published into the open transaction. The transaction is
// aborted: a read_committed fold shows none of its rows and the committed
// checkpoint is the one before it. A later run completes the table without
// duplicates.
func TestAbortedTransactionLeavesNothing(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 10, time.Second)
	var prior *schemas.Checkpoint
	src := &hooked{Source: r.Src}
	src.before = func(ctx context.Context, n int) error {
		if n != 4 {
			return nil
		}
		// Pages 1-2 (ids 1..4) are committed; page 3 (ids 5, 6) is in the
		// open transaction.
		cp, err := r.Store().Load(ctx)
		if err != nil {
			return err
		}
		prior = cp
		return fmt.Errorf("injected: the table's permissions changed: %w", connector.ErrPermanent)
	}
	cfg := connector.Config{PageSize: 2, TxnMaxRecords: 4}
	_, err := r.Engine(src, cfg).Run(context.Background(), connector.Once)
	if !errors.Is(err, connector.ErrPermanent) {
		t.Fatalf("run: want the permanent error, got %v", err)
	}
	if prior == nil {
		t.Fatal("no checkpoint was committed before the failure")
	}
	st := r.Fold()
	for _, id := range []string{"5", "6"} {
		if _, ok := st.Publications[id]; ok {
			t.Errorf("key %s from the aborted transaction is visible read_committed", id)
		}
	}
	want := r.Expected()
	for _, id := range []string{"5", "6", "7", "8", "9", "10"} {
		delete(want, id)
	}
	rig.AssertState(t, st, want)
	after := r.Checkpoint()
	a, _ := schemas.EncodeCheckpoint(prior)
	b, _ := schemas.EncodeCheckpoint(after)
	if !bytes.Equal(a, b) {
		t.Errorf("the committed checkpoint changed with the aborted transaction:\nbefore %s\nafter  %s", a, b)
	}
	if after.Cursor == "" || after.Phase != schemas.PhasePass {
		t.Errorf("checkpoint: phase %q cursor %q; want the open pass after id 4", after.Phase, after.Cursor)
	}

	r.Once(r.Src, cfg)
	st = r.AssertTable()
	rig.AssertNoDupes(t, st)
}

// TestSecondInstanceFencesFirst: a second instance with the same connector
// name starts while the first is mid-pass. The first stops with ErrFenced
// and never writes again; nothing of its open transaction is visible; the
// second completes the table without duplicates.
func TestSecondInstanceFencesFirst(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 12, time.Second)
	cfg := connector.Config{PageSize: 2, TxnMaxRecords: 4}
	var once sync.Once
	var fenceErr error
	src := &hooked{Source: r.Src}
	src.before = func(ctx context.Context, n int) error {
		if n == 4 { // pages 1-2 committed, page 3 in the open transaction
			once.Do(func() {
				// producer.New initialises the same transactional id: it
				// fences the first instance and aborts its open transaction.
				w, err := producer.New(ctx, producer.Config{Name: r.Name, Topic: r.Topic, OffsetsTopic: r.Offsets, Opts: r.Opts})
				if err != nil {
					fenceErr = err
					return
				}
				w.Close()
			})
		}
		return nil
	}
	_, err := r.Engine(src, cfg).Run(context.Background(), connector.Once)
	if fenceErr != nil {
		t.Fatalf("second instance: %v", fenceErr)
	}
	if !errors.Is(err, connector.ErrFenced) {
		t.Fatalf("first instance: want ErrFenced, got %v", err)
	}
	st := r.Fold()
	for id := range st.Publications {
		switch id {
		case "1", "2", "3", "4":
		default:
			t.Errorf("key %s visible although the fenced instance never committed it", id)
		}
	}
	if cp := r.Checkpoint(); cp.Seq != 1 {
		t.Errorf("checkpoint seq %d after the fence, want 1 (the fenced instance must not commit again)", cp.Seq)
	}
	r.Once(r.Src, cfg)
	st = r.AssertTable()
	rig.AssertNoDupes(t, st)
}

// TestRerunUnchangedTablePublishesNothing: every row is within the margin
// of the watermark. A re-run proves from the pass's mark that none changed
// and reads none of them; with a writer open since before they were
// written (so no mark proves anything), it reads them all again and the
// dedupe set skips them all. Either way the topic does not move.
func TestRerunUnchangedTablePublishesNothing(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(fmt.Sprintf("writer held open %v", held), func(t *testing.T) {
			r := newRig(t, rig.ItemsDDL, "items")
			if held {
				defer holdOldestTransaction(t, r)()
			}
			for i := 1; i <= 9; i++ {
				r.InsertAt(i, rig.T0.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("v%d", i))
			}
			cfg := connector.Config{PageSize: 2, Margin: time.Hour}
			r.Once(r.Src, cfg)
			st := r.AssertTable()
			rig.AssertNoDupes(t, st)
			before := r.Checkpoint()
			wantRead := int64(0)
			if held {
				wantRead = 9
			}
			for range 2 {
				c := r.Once(r.Src, cfg)
				if c.Raw != wantRead || c.Deduped != wantRead || c.Reread != wantRead {
					t.Errorf("re-run read %d rows (%d re-read), deduplicated %d; want %d of each", c.Raw, c.Reread, c.Deduped, wantRead)
				}
				assertRerunPublishesNothing(t, r, r.Src, cfg, nil, st.Records)
			}
			// A pass's mark is the cluster's oldest running transaction
			// id: when anything else in the cluster takes one (an
			// autoanalyze, another test's transaction), the re-run
			// records the new mark, which costs a transaction with no
			// records. Any other commit is one too many; so is any
			// commit while the held writer pins the mark.
			after := r.Checkpoint()
			if after.Seq != before.Seq && (after.SeenMark == before.SeenMark || held) {
				t.Errorf("re-runs committed %d transactions over an unchanged table (mark %q, then %q)", after.Seq-before.Seq, before.SeenMark, after.SeenMark)
			} else if after.Seq != before.Seq {
				t.Logf("re-runs committed %d transactions recording the mark %q, moved from %q", after.Seq-before.Seq, after.SeenMark, before.SeenMark)
			}
		})
	}
}

// holdOldestTransaction opens a transaction that holds a transaction id on
// another connection, so that every later write stays "fresh" against any
// mark (no pass can prove it saw them); the returned func ends it.
func holdOldestTransaction(t *testing.T, r *rig.Rig) func() {
	t.Helper()
	ctx := context.Background()
	conn, err := r.DB.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	return func() {
		_ = tx.Rollback(ctx)
		conn.Release()
	}
}

// retryCount is a connector.Observer that counts transient failures.
type retryCount struct {
	connector.NopObserver
	n atomic.Int64
}

func (o *retryCount) ObserveRetry(string) { o.n.Add(1) }
