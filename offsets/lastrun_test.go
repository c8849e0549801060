package offsets_test

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
)

func runEntry(t *testing.T, run string) []byte {
	t.Helper()
	b, err := schemas.EncodeLedgerEntry(&schemas.LedgerEntry{Version: schemas.LedgerVersion, Connector: "c", Kind: schemas.LedgerRun, RunID: run})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The engine asks LastRun, reading the shared ledger as it stands, whether
// a run newer than its own has started (a newer run means this one is
// fenced). When another connector's transaction open on the ledger began
// before this run's own start entry, that entry lies beyond the view, and
// the newest run the view shows is an older one of this connector: naming
// it would stop this run as fenced (exit 4) when nothing fenced it. A view
// cut short proves nothing: LastRun says "" (no verdict).
func TestLastRunNamesNoOlderRunFromACutView(t *testing.T) {
	opts := offLedTopics(t)
	c1 := txnWriter(t, opts, "tidemark-c")
	put(t, c1, "led", "c", runEntry(t, "r1"))
	endTxn(t, c1, true)
	x := txnWriter(t, opts, "tidemark-x") // another connector, killed mid-commit
	put(t, x, "led", "x", ledgerEntry(t, schemas.LedgerTxn, 9, "x9"))
	c2 := txnWriter(t, opts, "tidemark-c")
	put(t, c2, "led", "c", runEntry(t, "r2"))
	endTxn(t, c2, true)

	store := ledgerStore(opts)
	last, err := store.LastRun(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if last == "r1" {
		t.Fatalf("LastRun while x's transaction is open: %q, an older run than the newest (r2), which would stop run r2 as fenced", last)
	}
	endTxn(t, x, false)
	if last, err = store.LastRun(context.Background()); err != nil || last != "r2" {
		t.Fatalf("LastRun after x aborted: %q, %v; want r2", last, err)
	}
}

// A quiet run asks LastRun every 30 s whether a newer run of its
// connector started. On a ledger that busy connectors share, more than the
// audit window's worth of their entries can follow the newer run's start
// entry by the time it asks: a look at the tail alone would not see it
// (and give no verdict, for ever). LastRun reads on from where its last
// look ended, however much was written since.
func TestLastRunSeesARunBeyondTheAuditWindow(t *testing.T) {
	opts := offLedTopics(t)
	ctx := context.Background()
	store := startedStore(t, opts)
	c2 := txnWriter(t, opts, "tidemark-c")
	put(t, c2, "led", "c", runEntry(t, "r2"))
	endTxn(t, c2, true)
	x := txnWriter(t, opts, "tidemark-x") // a busy connector on the same ledger
	for i := range 2500 {
		x.Produce(ctx, &kgo.Record{Topic: "led", Key: []byte("x"), Value: ledgerEntry(t, schemas.LedgerTxn, int64(i), "x")}, nil)
	}
	if err := x.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	endTxn(t, x, true)
	if last, err := store.LastRun(ctx); err != nil || last != "r2" {
		t.Fatalf("LastRun after r2 and 2,500 entries of another connector: %q, %v; want r2", last, err)
	}
	// A new Store (a new process) has no earlier look to go on from: it
	// reads the tail, as at start.
	fresh := ledgerStore(opts)
	if last, err := fresh.LastRun(ctx); err != nil || last != "" {
		t.Fatalf("a new store's LastRun: %q, %v; want no verdict (r2 lies beyond the tail)", last, err)
	}
}

// LastRun going on from its last read: a partition added to the ledger
// since is read whole (not only its tail), and a ledger topic deleted and
// created again since is read afresh (its offsets start over: going on
// from the old position would skip its first entries).
func TestLastRunAfterTheLedgerTopicChanged(t *testing.T) {
	ctx := context.Background()
	t.Run("partition added", func(t *testing.T) {
		opts := offLedTopics(t)
		store := startedStore(t, opts)
		adm := admin(t, opts)
		if _, err := adm.CreatePartitions(ctx, 1, "led"); err != nil {
			t.Fatal(err)
		}
		cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		recs := []*kgo.Record{{Topic: "led", Partition: 1, Key: []byte("c"), Value: runEntry(t, "r2")}}
		for i := range 2500 {
			recs = append(recs, &kgo.Record{Topic: "led", Partition: 1, Key: []byte("x"), Value: ledgerEntry(t, schemas.LedgerTxn, int64(i), "x")})
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
		if last, err := store.LastRun(ctx); err != nil || last != "r2" {
			t.Fatalf("LastRun after r2 and 2,500 entries in a partition added since: %q, %v; want r2", last, err)
		}
	})
	t.Run("topic created again", func(t *testing.T) {
		opts := offLedTopics(t)
		store := startedStore(t, opts)
		adm := admin(t, opts)
		if _, err := adm.DeleteTopics(ctx, "led"); err != nil {
			t.Fatal(err)
		}
		if _, err := adm.CreateTopics(ctx, 1, 1, nil, "led"); err != nil {
			t.Fatal(err)
		}
		c2 := txnWriter(t, opts, "tidemark-c")
		put(t, c2, "led", "c", runEntry(t, "r2"))
		for range 50 {
			put(t, c2, "led", "x", ledgerEntry(t, schemas.LedgerTxn, 1, "x"))
		}
		endTxn(t, c2, true)
		if last, err := store.LastRun(ctx); err != nil || last != "r2" {
			t.Fatalf("LastRun after the ledger topic was created again: %q, %v; want r2", last, err)
		}
	})
}

// ledgerStore is connector c's store on the topics of offLedTopics.
func ledgerStore(opts []kgo.Opt) *offsets.Store {
	return offsets.NewStore(opts, "off", "c").FailClosed(offsets.NewLedger(opts, "led", "c"), "")
}

// startedStore commits run r1's start entry for connector c and returns a
// store whose first LastRun named it.
func startedStore(t *testing.T, opts []kgo.Opt) *offsets.Store {
	t.Helper()
	c1 := txnWriter(t, opts, "tidemark-c")
	put(t, c1, "led", "c", runEntry(t, "r1"))
	endTxn(t, c1, true)
	store := ledgerStore(opts)
	if last, err := store.LastRun(context.Background()); err != nil || last != "r1" {
		t.Fatalf("LastRun: %q, %v; want r1", last, err)
	}
	return store
}

func admin(t *testing.T, opts []kgo.Opt) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}
