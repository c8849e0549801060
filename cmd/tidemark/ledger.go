package main

import (
	"context"
	"encoding/json"
	"fmt"

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
		e.RequestCursor, e.NextCursor = httpsrc.RedactCursor(e.RequestCursor), httpsrc.RedactCursor(e.NextCursor) // link cursors carry the endpoint's query
		if a.jsonOut {
			b, _ := json.Marshal(e)
			fmt.Fprintln(a.stdout, string(b))
			return nil
		}
		switch e.Kind {
		case schemas.LedgerRun:
			fmt.Fprintf(a.stdout, "\nrun %s started %s: %s (%s)\n", e.RunID, e.At, e.Reason, e.Detail)
		case schemas.LedgerReset:
			fmt.Fprintf(a.stdout, "\nRESET at %s by %s to watermark %s (seq %d): %s\n", e.At, e.By, orInf(e.Watermark), e.Seq, e.Why)
		default:
			fmt.Fprintf(a.stdout, "  seq %-6d %s %-5s pages %-4d raw %-6d published %-6d deduped %-6d tombstones %-5d keys %d/%s  cursor %q -> %q  W %s\n",
				e.Seq, e.At, e.Phase, e.Pages, e.Raw, e.Published, e.Deduped, e.Tombstones, e.Keys, e.KeysDigest,
				e.RequestCursor, e.NextCursor, orInf(e.Watermark))
		}
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
