package connector_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/producer"
)

// A sweep whose commit fails part way (the outcome unknown, as a broker's
// OUT_OF_ORDER_SEQUENCE_NUMBER makes it) is retried from the committed
// checkpoint, and its result counts every repair and tombstone of the
// sweep, those committed before the failure included: the summary, the
// completion record and the checkpoint's last_sweep say what was done.
func TestSweepRetriedAfterAFailedCommitCountsItsCommittedPart(t *testing.T) {
	r := newRig(t)
	m := newMemKeyTable()
	for i := range 40 {
		m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	src := sweepKeyTable{m}
	r.once(src, connector.Config{PageSize: 10})
	// Behind tidemark's back: 6 hard deletes and 9 changed values with
	// updated_at untouched, so that only a sweep sees them.
	for i := range 6 {
		m.del(fmt.Sprintf("k%03d", i))
	}
	for i := 10; i < 19; i++ {
		m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Second), "changed", false)
	}

	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	fetched := make(chan struct{}, 1)
	pub := &watchedCommit{Writer: w, fetched: fetched, failAt: 4} // run start, two sweep commits, then a failure
	cfg := connector.Config{Name: r.name, Fingerprint: "fp1", PageSize: 10, TxnMaxRecords: 4, Margin: time.Second,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	e, err := connector.New(cfg, src, pub, r.store())
	if err != nil {
		t.Fatal(err)
	}
	res, err := e.SweepOnce(context.Background(), fold.Topic{Opts: r.opts, Topic: r.topic})
	if err != nil {
		t.Fatal(err)
	}
	if !pub.failed.Load() {
		t.Fatal("no sweep commit failed")
	}
	if res.Tombstoned != 6 || res.Repaired != 9 {
		t.Errorf("sweep after a failed commit: %s; want 6 tombstoned and 9 repaired in all", res)
	}
	if !res.Resumed {
		t.Errorf("the sweep went on from its committed part but does not say so: %s", res)
	}
	cp, err := r.store().Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cp.LastSweep == nil || cp.LastSweep.Tombstoned != 6 || cp.LastSweep.Repaired != 9 {
		t.Errorf("checkpoint's last sweep: %+v; want 6 tombstoned and 9 repaired", cp.LastSweep)
	}
	r.assertOnce(m.expected(), "")
}
