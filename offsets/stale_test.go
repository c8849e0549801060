package offsets_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
)

// A connector's newest checkpoint and ledger entry committed after another
// connector's transaction began on the shared topics (that connector was
// killed mid-commit, say) lie beyond the last stable offset until that
// transaction is resolved. Reading the view as it stands would return the
// checkpoint before (a false "ledger ahead" safety stop, or with both
// topics held back, a stale checkpoint and pages published twice). The
// engine's reads (no ViewWait of the caller's) therefore fail transiently
// while it stays open, and read the newest once it is resolved.
func TestLoadNeverReadsAViewCutShortByAnotherConnectorsOpenTransaction(t *testing.T) {
	opts := offLedTopics(t)
	c1 := txnWriter(t, opts, "tidemark-c")
	put(t, c1, "off", "c", checkpoint(t, 1, "p1"))
	put(t, c1, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 1, "p1"))
	endTxn(t, c1, true)
	x := txnWriter(t, opts, "tidemark-x") // stays open on both topics
	put(t, x, "off", "x", checkpoint(t, 7, "x7"))
	put(t, x, "led", "x", ledgerEntry(t, schemas.LedgerTxn, 7, "x7"))
	c2 := txnWriter(t, opts, "tidemark-c")
	put(t, c2, "off", "c", checkpoint(t, 2, "p2"))
	put(t, c2, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 2, "p2"))
	endTxn(t, c2, true)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	led := offsets.NewLedger(opts, "led", "c")
	store := offsets.NewStore(opts, "off", "c").FailClosed(led, "")
	cp, err := store.Load(ctx)
	var stop *connector.StopError
	switch {
	case err == nil:
		t.Fatalf("Load while x's transaction is open: checkpoint seq %d, want a transient error (seq 2 lies beyond the stable end)", cp.Seq)
	case errors.As(err, &stop) || connector.Fatal(err):
		t.Fatalf("Load while x's transaction is open: a fatal error %v; want a transient one", err)
	case !errors.Is(err, offsets.ErrViewOpen):
		t.Fatalf("Load: %v; want offsets.ErrViewOpen", err)
	}
	t.Logf("while open: %v", err)
	// LastRun reads the view as it stands (the engine asks it while its own
	// last transaction may still be open).
	if _, err := store.LastRun(ctx); err != nil {
		t.Errorf("LastRun while open: %v", err)
	}
	endTxn(t, x, false)
	if cp, err = store.Load(ctx); err != nil || cp == nil || cp.Seq != 2 || cp.Cursor != "p2" {
		t.Fatalf("Load after x aborted: %+v, %v; want seq 2 cursor p2", cp, err)
	}
}
