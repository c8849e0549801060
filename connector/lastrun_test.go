package connector_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
)

// frozenLastRun answers every LastRun with what the first one found: the
// ledger as a reader sees it when this run's own start entry lies beyond
// its view (or a broker lost it), showing the run before this one.
type frozenLastRun struct {
	connector.CheckpointStore
	once  sync.Once
	first string
}

func (s *frozenLastRun) LastRun(ctx context.Context) (string, error) {
	var err error
	s.once.Do(func() { s.first, err = s.CheckpointStore.LastRun(ctx) })
	return s.first, err
}

// After a transient failure the engine asks the ledger whether a run newer
// than its own has started. A ledger that shows, as the newest run, the
// one that was newest when this run started (its own start entry not in
// view) names no newer run: that is no fencing, and the run goes on.
func TestLedgerShowingThePreviousRunIsNoFencing(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 30 {
		m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	r.once(m, connector.Config{PageSize: 10}) // a previous run, in the ledger
	for i := 30; i < 60; i++ {
		m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	pub := &watchedCommit{Writer: w, fetched: make(chan struct{}, 1), failAt: 3}
	cfg := connector.Config{Name: r.name, Fingerprint: "fp1", PageSize: 10, TxnMaxRecords: 10, Margin: time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	e, err := connector.New(cfg, m, pub, &frozenLastRun{CheckpointStore: r.store()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(context.Background(), connector.Once); err != nil {
		t.Fatalf("run with a failed commit and a ledger showing the previous run: %v", err)
	}
	if !pub.failed.Load() {
		t.Fatal("no commit failed")
	}
	r.assertOnce(m.expected(), "")
}
