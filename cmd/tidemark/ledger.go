package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/tidemark/tidemark/connector/httpsrc"
	"github.com/tidemark/tidemark/schemas"
)

// cmdLedger prints the connector's ledger: runs and their transactions.
func cmdLedger(ctx context.Context, a *cli) error {
	defer a.closeAll()
	opts, err := a.kafkaOpts()
	if err != nil {
		return err
	}
	if err := a.waitForKafka(ctx, opts); err != nil { // startup.go
		return err
	}
	n := 0
	err = a.ledger(opts).Entries(a.asItStands(ctx), 0, func(e *schemas.LedgerEntry) error {
		n++
		printLedgerEntry(a.stdout, e, a.jsonOut)
		return nil
	})
	if err != nil {
		return err
	}
	if n == 0 && !a.jsonOut {
		fmt.Fprintf(a.stdout, "no ledger entries for connector %q in %s (never run, or older than the ledger's retention)\n", a.cfg.Name, a.ledgerTopic())
	}
	return nil
}

// printLedgerEntry prints one ledger entry, as text or JSON, with the
// secrets of link cursors redacted wherever they appear: the request and
// next cursors, and the run's detail (a resumed run names the cursor it
// resumed from) and the reset's reason.
func printLedgerEntry(w io.Writer, e *schemas.LedgerEntry, asJSON bool) {
	e.RequestCursor, e.NextCursor = httpsrc.RedactCursor(e.RequestCursor), httpsrc.RedactCursor(e.NextCursor)
	e.Detail, e.Why = redactText(e.Detail), redactText(e.Why)
	if asJSON {
		b, _ := json.Marshal(e)
		fmt.Fprintln(w, string(b))
		return
	}
	switch e.Kind {
	case schemas.LedgerRun:
		fmt.Fprintf(w, "\nrun %s started %s: %s (%s)\n", e.RunID, e.At, e.Reason, printable(e.Detail))
	case schemas.LedgerReset:
		fmt.Fprintf(w, "\nRESET at %s by %s to watermark %s (seq %d): %s\n", e.At, e.By, orInf(e.Watermark), e.Seq, printable(e.Why))
	default:
		fmt.Fprintf(w, "  seq %-6d %s %-5s pages %-4d raw %-6d published %-6d deduped %-6d tombstones %-5d keys %d/%s  cursor %q -> %q  W %s\n",
			e.Seq, e.At, e.Phase, e.Pages, e.Raw, e.Published, e.Deduped, e.Tombstones, e.Keys, e.KeysDigest,
			e.RequestCursor, e.NextCursor, orInf(e.Watermark))
	}
}
