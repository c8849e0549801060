package connector

import "time"

// Observer receives the engine's events, for metrics. Methods are called on
// the engine's goroutine and must return quickly.
type Observer interface {
	// ObservePage reports one fetched page: how long the fetch took and how
	// many rows it returned.
	ObservePage(fetch time.Duration, rows int)
	// ObserveCommit reports a committed transaction.
	ObserveCommit(c CommitInfo)
	// ObserveAbort reports an aborted or failed transaction.
	ObserveAbort()
	// ObserveRetry reports a transient failure about to be retried; reason
	// is one of "source", "kafka", "checkpoint", "other".
	ObserveRetry(reason string)
	// ObserveStop reports a fatal stop; kind is "safety_stop", "fenced" or
	// "fatal".
	ObserveStop(kind string)
	// ObserveSweep reports a finished reconciliation sweep.
	ObserveSweep(r SweepResult)
}

// CommitInfo describes one committed transaction.
type CommitInfo struct {
	Seq  int64
	Took time.Duration // Commit call (flush + EndTransaction)
	Span time.Duration // from the transaction's first page to its commit
	// Per-transaction counts.
	Records, Pages, Raw, Published, Deduped, Tombstones int64
	// Watermark after the commit (zero = minus infinity).
	Watermark time.Time
	// NewestUpdatedAt and OldestUpdatedAt bound the updated_at of the rows
	// published in the transaction (zero when it published none).
	NewestUpdatedAt, OldestUpdatedAt time.Time
	CommittedAt                      time.Time
	PassEnded                        bool
	// HeadPass is set with PassEnded when the pass was a head pass
	// (docs/design.md, "Head passes").
	HeadPass bool
}

// RereadObserver is implemented by observers that count re-reads: rows a
// pass read from the window below the watermark it started from, and rows
// the dedupe set skipped, per page, whether or not the pass commits
// (docs/design.md, "What a pass re-reads"). Discovered by type assertion.
type RereadObserver interface {
	ObserveReread(reread, deduped int)
}

// FutureObserver is implemented by observers that count rows dated after
// the source's clock (reported once per pass). Discovered by type
// assertion.
type FutureObserver interface {
	ObserveFutureDated(rows int)
}

// SchemaObserver is implemented by observers that count changes of the
// source's shape. Discovered by type assertion.
type SchemaObserver interface {
	ObserveSchemaChange()
}

// NopObserver observes nothing. It is the default Observer; embed it to
// implement only the methods an observer needs.
type NopObserver struct{}

func (NopObserver) ObservePage(time.Duration, int) {}
func (NopObserver) ObserveCommit(CommitInfo)       {}
func (NopObserver) ObserveAbort()                  {}
func (NopObserver) ObserveRetry(string)            {}
func (NopObserver) ObserveStop(string)             {}
func (NopObserver) ObserveSweep(SweepResult)       {}
