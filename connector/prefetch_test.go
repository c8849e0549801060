package connector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
)

// slowSource is memTable whose Page takes a while (honouring ctx) and
// counts the calls in flight.
type slowSource struct {
	*memTable
	inflight atomic.Int32
	delay    time.Duration
}

func (s *slowSource) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	s.inflight.Add(1)
	defer s.inflight.Add(-1)
	select {
	case <-ctx.Done():
		return connector.Page{}, ctx.Err()
	case <-time.After(s.delay):
	}
	return s.memTable.Page(ctx, req)
}

// overlapPub fails commit failAt, cancels the run during commit cancelAt,
// and records whether the source was in flight during a Recover.
type overlapPub struct {
	*producer.Writer
	src                *slowSource
	commits            int
	failAt, cancelAt   int
	cancel             context.CancelFunc
	mu                 sync.Mutex
	overlapsInRecovery int
}

func (p *overlapPub) Commit(ctx context.Context, c *connector.Commit) error {
	p.commits++
	if p.commits == p.cancelAt {
		p.cancel()
	}
	if p.commits == p.failAt {
		_ = p.Writer.Abort(ctx)
		return errors.New("injected commit failure")
	}
	return p.Writer.Commit(ctx, c)
}

func (p *overlapPub) Recover(ctx context.Context) error {
	if p.src.inflight.Load() != 0 {
		p.mu.Lock()
		p.overlapsInRecovery++
		p.mu.Unlock()
	}
	return p.Writer.Recover(ctx)
}

type watchStore struct {
	connector.CheckpointStore
	src      *slowSource
	overlaps atomic.Int32
}

func (s *watchStore) Load(ctx context.Context) (*schemas.Checkpoint, error) {
	if s.src.inflight.Load() != 0 {
		s.overlaps.Add(1)
	}
	return s.CheckpointStore.Load(ctx)
}

// The page read ahead never overlaps the recovery after a failed commit,
// nor outlives a stop during a commit, and the table lands exactly once.
func TestPrefetchNeverOverlapsRecoveryOrOutlivesAStop(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 60 {
		m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	src := &slowSource{memTable: m, delay: 30 * time.Millisecond}
	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	ctx, cancel := context.WithCancel(context.Background())
	pub := &overlapPub{Writer: w, src: src, failAt: 3, cancelAt: 6, cancel: cancel}
	store := &watchStore{CheckpointStore: r.store(), src: src}
	cfg := connector.Config{Name: r.name, Fingerprint: "fp1", PageSize: 5, TxnMaxRecords: 5, Margin: time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	e, err := connector.New(cfg, src, pub, store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(ctx, connector.Once); err != nil {
		t.Fatal(err)
	}
	if n := src.inflight.Load(); n != 0 {
		t.Errorf("%d page fetches still running after Run returned", n)
	}
	if pub.overlapsInRecovery != 0 || store.overlaps.Load() != 0 {
		t.Errorf("a page fetch ran during Recover (%d) or a checkpoint load (%d)", pub.overlapsInRecovery, store.overlaps.Load())
	}
	// Resume and finish.
	r.once(m, connector.Config{PageSize: 5, TxnMaxRecords: 5, Margin: time.Second})
	r.assertOnce(m.expected(), "")
}
