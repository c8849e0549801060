package offsets_test

import (
	"context"
	"testing"

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

	store := offsets.NewStore(opts, "off", "c").FailClosed(offsets.NewLedger(opts, "led", "c"), "")
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
