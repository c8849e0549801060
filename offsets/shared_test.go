package offsets_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// txnWriter is another connector's producer on a shared topic.
// offLedTopics starts a broker with the one-partition topics "off" (the
// offsets topic) and "led" (the ledger) and returns the options to reach it.
func offLedTopics(t *testing.T) []kgo.Opt {
	t.Helper()
	k := harness.NewKafka(t)
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer adm.Close()
	if _, err := kadm.NewClient(adm).CreateTopics(context.Background(), 1, 1, nil, "off", "led"); err != nil {
		t.Fatal(err)
	}
	return opts
}

func txnWriter(t *testing.T, opts []kgo.Opt, id string) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), kgo.TransactionalID(id))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	return cl
}

func put(t *testing.T, cl *kgo.Client, topic, key string, value []byte) {
	t.Helper()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: topic, Key: []byte(key), Value: value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func endTxn(t *testing.T, cl *kgo.Client, commit bool) {
	t.Helper()
	if err := cl.EndTransaction(context.Background(), kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

// sharedTopics writes, on one-partition offsets and ledger topics shared
// by three connectors: c's committed checkpoint and ledger entry (seq 1),
// then a transaction of c that aborts (seq 2) after connector x's
// transaction began; x's stays open. The last record before the stable end
// of each topic is c's aborted one, and its abort marker lies after x's
// open transaction, so read_committed never delivers it.
func sharedTopics(t *testing.T) []kgo.Opt {
	t.Helper()
	opts := offLedTopics(t)
	c1 := txnWriter(t, opts, "tidemark-c")
	put(t, c1, "off", "c", checkpoint(t, 1, "p1"))
	put(t, c1, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 1, "p1"))
	endTxn(t, c1, true)
	c2 := txnWriter(t, opts, "tidemark-c")
	put(t, c2, "off", "c", checkpoint(t, 2, "p2"))
	put(t, c2, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 2, "p2"))
	x := txnWriter(t, opts, "tidemark-x")
	put(t, x, "off", "x", checkpoint(t, 7, "x7"))
	put(t, x, "led", "x", ledgerEntry(t, schemas.LedgerTxn, 7, "x7"))
	endTxn(t, c2, false)
	return opts
}

func TestLoadAndAuditOnASharedTopicWithAnOpenTransaction(t *testing.T) {
	opts := sharedTopics(t)
	// x's transaction stays open: each read waits this long for it
	// (fold.ViewWait), then stops before it and says so.
	var mu sync.Mutex
	open := map[string]fold.OpenTxn{}
	ctx := fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: 200 * time.Millisecond, Report: func(o fold.OpenTxn) {
		mu.Lock()
		open[o.Topic] = o
		mu.Unlock()
	}})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	led := offsets.NewLedger(opts, "led", "c")
	start := time.Now()
	cp, err := offsets.NewStore(opts, "off", "c").FailClosed(led, "").Load(ctx)
	if err != nil || cp == nil || cp.Seq != 1 || cp.Cursor != "p1" {
		t.Fatalf("Load: %+v, %v after %s; want seq 1 cursor p1", cp, err, time.Since(start).Round(time.Millisecond))
	}
	var seqs []int64
	if err := led.Entries(ctx, 0, func(e *schemas.LedgerEntry) error { seqs = append(seqs, e.Seq); return nil }); err != nil || len(seqs) != 1 || seqs[0] != 1 {
		t.Fatalf("Entries: %v, %v; want [1]", seqs, err)
	}
	if err := led.Audit(ctx, cp); err != nil {
		t.Fatalf("Audit: %v", err)
	}
	hist, err := offsets.NewStore(opts, "off", "c").History(ctx)
	if err != nil || len(hist) != 1 || hist[0].Seq != 1 {
		t.Fatalf("History: %d checkpoints, %v; want seq 1 only", len(hist), err)
	}
	// Offsets of both topics: c's seq 1 @0, its marker @1, c's seq 2 @2,
	// x's @3, c's abort marker @4.
	mu.Lock()
	defer mu.Unlock()
	for _, topic := range []string{"off", "led"} {
		if o := open[topic]; o.Partition != 0 || o.Offset != 3 || o.HighWatermark != 5 {
			t.Errorf("%s: reported %+v; want x's transaction open at offset 3 of 5", topic, o)
		}
	}
}
