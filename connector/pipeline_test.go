package connector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
)

// signalTable is memTable that signals every Page call as it starts,
// counts the calls in flight, and takes 50 ms for each: a page fetched
// ahead just before a commit is still in flight when the commit begins,
// however the goroutines are scheduled.
type signalTable struct {
	*memTable
	fetched  chan struct{}
	inflight *atomic.Int32
}

func (s signalTable) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	select {
	case s.fetched <- struct{}{}:
	default:
	}
	time.Sleep(50 * time.Millisecond)
	return s.memTable.Page(ctx, req)
}

// watchedCommit holds each commit until a page fetch starts (or 300 ms
// pass), and counts the commits a fetch overlapped. failAt makes that
// commit fail without committing (its outcome then looks unknown).
type watchedCommit struct {
	*producer.Writer
	fetched    chan struct{}
	inflight   *atomic.Int32 // fetches in flight, if counted (see signalTable)
	commits    int
	overlapped int
	failAt     int
	failed     atomic.Bool
}

func (w *watchedCommit) Commit(ctx context.Context, c *connector.Commit) error {
	for len(w.fetched) > 0 {
		<-w.fetched // fetches that started before this commit
	}
	w.commits++
	if w.inflight != nil && w.inflight.Load() > 0 {
		w.overlapped++ // started just before this commit, still running
	} else {
		select {
		case <-w.fetched:
			w.overlapped++
		case <-time.After(300 * time.Millisecond):
		}
	}
	if w.commits == w.failAt {
		w.failed.Store(true)
		return errors.New("injected: commit outcome unknown")
	}
	return w.Writer.Commit(ctx, c)
}

// A pass that commits part way (sync.txn_max_records) fetches its next
// page while the commit is in flight, so that page joins the next
// transaction instead of waiting for the commit; a commit that fails with
// a fetch in flight is recovered with nothing lost or published twice.
func TestNextPageIsFetchedWhileACommitIsInFlight(t *testing.T) {
	for _, failAt := range []int{0, 2} {
		t.Run(fmt.Sprintf("fail_commit_%d", failAt), func(t *testing.T) {
			r := newRig(t)
			m := newMemTable()
			for i := range 100 {
				m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
			}
			fetched := make(chan struct{}, 1)
			inflight := new(atomic.Int32)
			src := signalTable{m, fetched, inflight}
			w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(w.Close)
			pub := &watchedCommit{Writer: w, fetched: fetched, inflight: inflight, failAt: failAt}
			cfg := connector.Config{Name: r.name, Fingerprint: "fp1", PageSize: 10, TxnMaxRecords: 20, Margin: time.Second,
				Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
			e, err := connector.New(cfg, src, pub, r.store())
			if err != nil {
				t.Fatal(err)
			}
			if _, err := e.Run(context.Background(), connector.Once); err != nil {
				t.Fatal(err)
			}
			r.assertOnce(m.expected(), "")
			// 100 rows in pages of 10, a commit every 20 records: the
			// commits part way through the pass (not the one that ends it)
			// each overlap the next page's fetch.
			if pub.overlapped < 4 {
				t.Errorf("%d of %d commits overlapped a page fetch, want at least the 4 made part way through the pass", pub.overlapped, pub.commits)
			}
			if failAt > 0 && !pub.failed.Load() {
				t.Errorf("commit %d never failed", failAt)
			}
		})
	}
}
