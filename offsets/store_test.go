package offsets_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

func produce(t *testing.T, opts []kgo.Opt, topic, key string, value []byte) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte(key), Value: value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func checkpoint(t *testing.T, seq int64, cursor string) []byte {
	t.Helper()
	b, err := schemas.EncodeCheckpoint(&schemas.Checkpoint{Version: schemas.CheckpointVersion, Connector: "c", Phase: schemas.PhaseIdle, Seq: seq, Cursor: cursor})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Load reads the tail first and widens the window until it finds the
// connector's key, however many other records follow it.
func TestLoadFindsTheNewestCheckpointBehindOtherConnectors(t *testing.T) {
	k := harness.NewKafka(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	produce(t, opts, "off", "c", checkpoint(t, 1, "a"))
	produce(t, opts, "off", "c", checkpoint(t, 2, "b"))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	other := checkpoint(t, 0, "x")
	var failed atomic.Int64
	var last atomic.Int64
	for i := range 5000 {
		cl.Produce(context.Background(), &kgo.Record{Topic: "off", Key: []byte(fmt.Sprintf("other-%d", i%7)), Value: other}, func(r *kgo.Record, err error) {
			if err != nil {
				failed.Add(1)
			}
			last.Store(max(last.Load(), r.Offset))
		})
	}
	if err := cl.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	cl.Close()
	if failed.Load() > 0 || last.Load() < 5001 {
		t.Fatalf("setup: %d failed, last offset %d", failed.Load(), last.Load())
	}
	cp, err := offsets.NewStore(opts, "off", "c").Load(context.Background())
	if err != nil || cp == nil || cp.Seq != 2 || cp.Cursor != "b" {
		t.Fatalf("got %+v, %v; want seq 2 cursor b", cp, err)
	}
	produce(t, opts, "off", "c", nil) // a tombstone clears it
	if cp, err := offsets.NewStore(opts, "off", "c").Load(context.Background()); err != nil || cp != nil {
		t.Fatalf("after a tombstone: %+v, %v", cp, err)
	}
	if cp, err := offsets.NewStore(opts, "missing-topic", "c").Load(context.Background()); err != nil || cp != nil {
		t.Fatalf("missing topic: %+v, %v", cp, err)
	}
}

func ledgerEntry(t *testing.T, kind string, seq int64, next string) []byte {
	t.Helper()
	b, err := schemas.EncodeLedgerEntry(&schemas.LedgerEntry{Version: schemas.LedgerVersion, Connector: "c", Kind: kind, RunID: "r", Seq: seq, NextCursor: next})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestAudit(t *testing.T) {
	k := harness.NewKafka(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	ctx := context.Background()
	led := offsets.NewLedger(opts, "led", "c")
	if err := led.Audit(ctx, nil); err != nil {
		t.Fatalf("no ledger: %v", err)
	}
	produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 1, "p1"))
	if err := led.Audit(ctx, nil); err == nil || !strings.Contains(err.Error(), "checkpoint was lost") {
		t.Fatalf("lost checkpoint: %v", err)
	}
	cp := &schemas.Checkpoint{Seq: 1, Cursor: "p1"}
	if err := led.Audit(ctx, cp); err != nil {
		t.Fatalf("consistent: %v", err)
	}
	if err := led.Audit(ctx, &schemas.Checkpoint{Seq: 2, Cursor: "p1"}); err == nil {
		t.Fatal("a checkpoint ahead of the ledger must stop")
	}
	if err := led.Audit(ctx, &schemas.Checkpoint{Seq: 1, Cursor: "other"}); err == nil {
		t.Fatal("a cursor that differs from the ledger must stop")
	}
	// A reset after a lost checkpoint starts the sequence over: its entry
	// may reuse seq 1 without conflicting with the entries before it.
	produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerReset, 1, ""))
	if err := led.Audit(ctx, &schemas.Checkpoint{Seq: 1}); err != nil {
		t.Fatalf("after a reset: %v", err)
	}
	// Two entries for one position with different cursors and no reset
	// between them: stop.
	produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 2, "q1"))
	produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 2, "q2"))
	if err := led.Audit(ctx, &schemas.Checkpoint{Seq: 2, Cursor: "q2"}); err == nil || !strings.Contains(err.Error(), "two committed entries") {
		t.Fatalf("conflicting entries: %v", err)
	}
}

// A writer that commits between Load's checkpoint read and its ledger read
// (another instance about to be fenced, or one that just fenced this one)
// leaves the ledger one transaction ahead of the checkpoint Load read.
// That is not a lost checkpoint: Load reads both again and returns the
// newer checkpoint. A ledger that stays ahead is still a safety stop.
func TestLoadRereadsWhenAWriterCommitsBetweenItsReads(t *testing.T) {
	k := harness.NewKafka(t, kfake.AllowAutoTopicCreation(), kfake.DefaultNumPartitions(1))
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	ctx := context.Background()
	produce(t, opts, "off", "c", checkpoint(t, 1, "p1"))
	produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 1, "p1"))
	store := offsets.NewStore(opts, "off", "c").FailClosed(offsets.NewLedger(opts, "led", "c"), "")

	calls, racing := 0, true
	defer offsets.SetAfterCheckpointRead(func() {
		calls++
		if racing && calls == 1 {
			produce(t, opts, "off", "c", checkpoint(t, 2, "p2"))
			produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 2, "p2"))
		}
	})()
	cp, err := store.Load(ctx)
	if err != nil || cp == nil || cp.Seq != 2 || cp.Cursor != "p2" {
		t.Fatalf("Load = %+v, %v; want the checkpoint of seq 2 read again", cp, err)
	}

	produce(t, opts, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 3, "p3")) // no checkpoint: lost
	calls, racing = 0, false
	_, err = store.Load(ctx)
	if err == nil || !strings.Contains(err.Error(), "is behind the ledger") {
		t.Fatalf("a ledger that stays ahead: %v, want a safety stop", err)
	}
	if calls < 2 {
		t.Errorf("Load read the checkpoint %d times before stopping, want it read again", calls)
	}
}
