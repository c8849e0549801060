package offsets

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// Ledger reads a connector's ledger: one entry per committed transaction,
// one per run start and one per operator reset, kept for the ledger topic's
// retention (default 7 days).
type Ledger struct {
	opts      []kgo.Opt
	topic     string
	connector string
}

// NewLedger returns a Ledger for connector on topic.
func NewLedger(opts []kgo.Opt, topic, connectorName string) *Ledger {
	return &Ledger{opts: opts, topic: topic, connector: connectorName}
}

// Entries calls fn for the connector's committed entries still retained,
// oldest first. last > 0 limits the read to the last offsets of the topic.
func (l *Ledger) Entries(ctx context.Context, last int64, fn func(*schemas.LedgerEntry) error) error {
	_, err := l.entriesOn(ctx, nil, last, fn)
	return err
}

// entriesOn is Entries going on from where an earlier read ended (from;
// nil: none, read the last offsets), and returning where this one ended
// (fold.ScanOn); nil when the ledger topic does not exist.
func (l *Ledger) entriesOn(ctx context.Context, from *fold.Position, last int64, fn func(*schemas.LedgerEntry) error) (*fold.Position, error) {
	ctx, view := strictView(ctx)
	if last <= 0 {
		last = -1
	}
	ends, err := fold.ScanOn(ctx, l.opts, l.topic, from, last, func(r *kgo.Record) error {
		if string(r.Key) != l.connector || r.Value == nil {
			return nil
		}
		e, err := schemas.DecodeLedgerEntry(r.Value)
		if err != nil {
			return undecodableEntry(l.topic, l.connector, r.Offset, err)
		}
		return fn(e)
	})
	if verr := view.err(); verr != nil {
		return nil, verr
	}
	if errors.Is(err, fold.ErrNoTopic) {
		return nil, nil
	}
	return ends, err
}

// auditWindow is how many of the ledger's last offsets a start-up audit
// reads.
const auditWindow = 2000

// Audit cross-checks a checkpoint (nil = none) against the tail of the
// ledger (docs/design.md, "Safety stops"): the newest transaction entry must be the checkpoint's
// own (same seq, same next cursor, same counters); a checkpoint behind or
// ahead of the ledger, or two entries for one position with different
// cursors, is a safety stop. An empty ledger (expired, or a new ledger
// topic) proves nothing either way and passes.
func (l *Ledger) Audit(ctx context.Context, cp *schemas.Checkpoint) error {
	ctx, view := strictView(ctx)
	var last *schemas.LedgerEntry
	bySeq := map[int64]*schemas.LedgerEntry{}
	var dup error
	err := l.Entries(ctx, auditWindow, func(e *schemas.LedgerEntry) error {
		if e.Kind != schemas.LedgerTxn && e.Kind != schemas.LedgerReset {
			return nil
		}
		if e.Kind == schemas.LedgerReset {
			// A reset is the recorded reason for itself and what follows:
			// after a lost checkpoint it restarts the sequence, so its own
			// seq may repeat one from before it.
			clear(bySeq)
		}
		if prev, ok := bySeq[e.Seq]; ok && dup == nil && (prev.NextCursor != e.NextCursor || prev.RunID != e.RunID) {
			dup = stop(fmt.Sprintf("the ledger holds two committed entries for checkpoint seq %d with different cursors (%q by run %s, %q by run %s) and no reset between them",
				e.Seq, prev.NextCursor, prev.RunID, e.NextCursor, e.RunID))
		}
		bySeq[e.Seq] = e
		last = e
		return nil
	})
	if verr := view.err(); verr != nil {
		return verr // a partial view proves nothing either way
	}
	if err != nil {
		return fmt.Errorf("read ledger %s: %w", l.topic, err)
	}
	if dup != nil {
		return dup
	}
	switch {
	case last == nil:
		return nil
	case cp == nil:
		return stop(fmt.Sprintf("there is no checkpoint, but the ledger shows committed transactions up to seq %d (run %s at %s): the checkpoint was lost",
			last.Seq, last.RunID, last.At))
	case last.Seq > cp.Seq:
		return &aheadError{stop(fmt.Sprintf("the checkpoint (seq %d) is behind the ledger (seq %d committed by run %s at %s)", cp.Seq, last.Seq, last.RunID, last.At))}
	case last.Seq < cp.Seq:
		return stop(fmt.Sprintf("the checkpoint (seq %d) has no ledger entry; the ledger ends at seq %d", cp.Seq, last.Seq))
	case last.NextCursor != cp.Cursor:
		return stop(fmt.Sprintf("the checkpoint's cursor %q differs from its ledger entry's %q (seq %d)", cp.Cursor, last.NextCursor, cp.Seq))
	case last.Kind == schemas.LedgerTxn && last.Counters != cp.Counters:
		return stop(fmt.Sprintf("the checkpoint's counters %+v differ from its ledger entry's %+v (seq %d)", cp.Counters, last.Counters, cp.Seq))
	}
	return nil
}

// errLedgerAhead marks the audit's finding that the ledger holds a later
// committed transaction than the checkpoint (see Store.Load).
var errLedgerAhead = errors.New("the ledger is ahead of the checkpoint")

// aheadError is that finding: a *connector.StopError that also matches
// errLedgerAhead.
type aheadError struct{ error }

func (e *aheadError) Unwrap() []error { return []error{e.error, errLedgerAhead} }

func stop(reason string) error {
	return &connector.StopError{
		Reason: reason,
		Hint:   "nothing was written; inspect with `tidemark ledger` and `tidemark status`, then decide with `tidemark reset` (to scratch, or --to-watermark)",
	}
}

// undecodableEntry is the safety stop for a ledger entry of the connector
// that this build cannot read: it will not read on a retry either.
func undecodableEntry(topic, name string, offset int64, err error) error {
	return &connector.StopError{
		Reason: fmt.Sprintf("ledger %s offset %d holds an entry of connector %q that this build cannot read: %v", topic, offset, name, err),
		Hint: "was it written by a newer release (a rollback)? run that release again; the ledger cannot be skipped, since its audit proves that no other run wrote after the checkpoint. " +
			"To start over with this build, give the connector a new kafka.ledger_topic and run `tidemark reset`",
		Err: err,
	}
}
