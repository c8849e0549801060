package offsets_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
)

// `tidemark status` and `tidemark check` read the fail-closed store as it
// stands (a ViewWait of their own whose Report warns). Another connector x
// killed in the middle of a transaction that reached only ONE of the shared
// topics (its run-start transaction writes only the ledger; a commit killed
// after its dedupe-set segments were flushed has written only the offsets
// topic) cuts one view and not the other, and the audit then compares a
// complete checkpoint with a cut ledger (or the reverse). That is no safety
// stop: Load returns the checkpoint with ErrAuditInconclusive, the caller
// was told of the open transaction, and once x's transaction is resolved
// the audit passes.
func TestAsItStandsReadIsNoFalseSafetyStop(t *testing.T) {
	for _, tc := range []struct {
		name   string
		xTopic string // the one shared topic x's open transaction reached
	}{
		{"x_open_on_the_ledger_only", "led"},  // x killed in its run-start transaction
		{"x_open_on_the_offsets_only", "off"}, // x killed after flushing its dedupe-set segments
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := offLedTopics(t)
			c1 := txnWriter(t, opts, "tidemark-c")
			put(t, c1, "off", "c", checkpoint(t, 1, "p1"))
			put(t, c1, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 1, "p1"))
			endTxn(t, c1, true)
			x := txnWriter(t, opts, "tidemark-x") // stays open, on one topic only
			if tc.xTopic == "led" {
				put(t, x, "led", "x", ledgerEntry(t, schemas.LedgerRun, 0, ""))
			} else {
				put(t, x, "off", "x#b7.0", []byte("segment"))
			}
			c2 := txnWriter(t, opts, "tidemark-c")
			put(t, c2, "off", "c", checkpoint(t, 2, "p2"))
			put(t, c2, "led", "c", ledgerEntry(t, schemas.LedgerTxn, 2, "p2"))
			endTxn(t, c2, true)

			// What cmdStatus / cmdCheck pass (asItStands), with a shorter
			// wait to keep the test quick: same rule, 2 s there.
			var warned []fold.OpenTxn
			ctx := fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: 200 * time.Millisecond, Report: func(o fold.OpenTxn) {
				warned = append(warned, o)
			}})
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			store := offsets.NewStore(opts, "off", "c").FailClosed(offsets.NewLedger(opts, "led", "c"), "")
			cp, err := store.Load(ctx)
			if err != nil && !errors.Is(err, offsets.ErrAuditInconclusive) {
				t.Fatalf("status/check read as it stands while only another connector's transaction is open on %s: %v\n(warnings printed: %v)", tc.xTopic, err, warned)
			}
			if cp == nil {
				t.Fatalf("Load as it stands returned no checkpoint (%v)", err)
			}
			if len(warned) == 0 {
				t.Errorf("the caller was not told of the open transaction on %s", tc.xTopic)
			}
			endTxn(t, x, false)
			warned = nil
			if cp, err = store.Load(ctx); err != nil || cp == nil || cp.Seq != 2 {
				t.Fatalf("Load as it stands after x aborted: %+v, %v; want seq 2 and a passing audit", cp, err)
			}
		})
	}
}
