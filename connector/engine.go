package connector

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

// Publisher is what the engine needs from Kafka: one transaction at a time
// holding data records and the checkpoint.
type Publisher interface {
	// Begin opens a transaction.
	Begin(ctx context.Context) error
	// Publish adds one row (an upsert, or a tombstone when Deleted) to the
	// open transaction. Delivery errors may surface here or at Commit.
	Publish(ctx context.Context, r *Row) error
	// Commit ends the open transaction with c: the state records first,
	// then the checkpoint built from their offsets, and the ledger entry,
	// all in the same transaction. An error means the outcome is failed or
	// unknown: the engine then calls Reset and reloads the checkpoint; it
	// never retries a commit.
	Commit(ctx context.Context, c *Commit) error
	// Abort aborts the open transaction, if any.
	Abort(ctx context.Context) error
	// Recover ends whatever the session left open after a failure and
	// re-initialises it presenting its current producer id and epoch, so
	// that a transaction with an unknown outcome is resolved (committed or
	// aborted) before the checkpoint is read back, and a session that
	// another instance has fenced learns it (ErrFenced). It never starts a
	// fresh session: that would fence the newer instance.
	Recover(ctx context.Context) error
}

// Commit is what ends a transaction besides the data records.
type Commit struct {
	// State are records for the offsets topic other than the checkpoint:
	// the dedupe set's segments, and tombstones (nil Value) of segments no
	// longer needed. They are written before the checkpoint.
	State []StateRecord
	// Checkpoint encodes the checkpoint given the offsets State got, in
	// order; nil for a transaction without one (a run-start entry).
	Checkpoint func(stateOffsets []int64) ([]byte, error)
	// Ledger is the ledger entry; nil for none.
	Ledger []byte
}

// StateRecord is a keyed record of the offsets topic.
type StateRecord struct {
	Key   string
	Value []byte
}

// StateRef names a committed state record: its key and offset.
type StateRef struct {
	Key    string
	Offset int64
}

// CheckpointStore reads the latest committed checkpoint.
type CheckpointStore interface {
	// Load returns the latest committed checkpoint read read_committed, or
	// nil when there is none.
	Load(ctx context.Context) (*schemas.Checkpoint, error)
	// State returns the values of committed state records, in the order of
	// refs. A record that is missing or has another key is an error.
	State(ctx context.Context, refs []StateRef) ([][]byte, error)
	// LastRun returns the run id of the connector's latest committed
	// run-start entry in the ledger, "" when there is none (or no ledger),
	// or when the store cannot tell (a view cut short by a transaction
	// still open): "" never stops a run as fenced.
	LastRun(ctx context.Context) (string, error)
}

// supersededEvery is how often an instance that committed nothing since
// reads the ledger for a newer run of its connector.
var supersededEvery = 30 * time.Second

// DefaultHeadLookback is Config.HeadLookback's default.
const DefaultHeadLookback = 100 * time.Millisecond

// Config configures an Engine. Zero values take the documented defaults.
type Config struct {
	// Name is the connector name; required.
	Name string
	// PageSize is the number of rows per page; default 1000.
	PageSize int
	// Margin is the safety margin M re-read below the watermark; default
	// 10s (0), and a negative value means no margin at all.
	Margin time.Duration
	// PollInterval is the time from the start of one pass to the start of
	// the next in continuous mode (the next starts at once when a pass
	// took longer); with Wake, the pause after a pass before the timer
	// starts a full pass. Default 1s.
	PollInterval time.Duration
	// PollJitter is the fraction (0..1) of PollInterval by which each
	// interval is shortened at random, never lengthened; default 0.
	PollJitter float64
	// Wake, when set, starts the next pass at once when it receives,
	// instead of waiting out the poll interval (a change notification from
	// the source). Polling stays: a wake-up that is lost costs at most one
	// poll interval. Wake-ups that arrive during a pass start one more pass
	// after it, and a pass during which a wake-up was taken is followed by
	// one more, and that one by another while it publishes (docs/design.md,
	// "Follow-up passes"). MinPassGap is the least time from the start of a
	// pass to the start of the next when a wake-up or a follow-up starts it
	// (default 0): a pass that took that long is followed at once.
	Wake       <-chan struct{}
	MinPassGap time.Duration
	// HeadLookback is how far below the watermark a head pass reads, so
	// that a writer that commits shortly after a later-dated row is read
	// by the next head pass, not the next full pass (docs/design.md,
	// "Head passes"). Default DefaultHeadLookback (0); a negative value
	// means none. It is never more than Margin.
	HeadLookback time.Duration
	// TxnMaxRecords, TxnMaxBytes and TxnMaxDuration bound one transaction;
	// defaults 10000 records, 16 MiB, 5s. Pages are never split.
	TxnMaxRecords  int
	TxnMaxBytes    int64
	TxnMaxDuration time.Duration
	// TxnTimeout is the broker-side transaction timeout the publisher
	// uses; default 60s. While a transaction is open, a page fetch is cut
	// off early enough to commit before the broker would abort it.
	TxnTimeout time.Duration
	// Horizon enables horizon mode; the source must implement Horizoner.
	Horizon bool
	// Consistent makes the initial load read one fixed snapshot; the source
	// must implement Snapshotter.
	Consistent bool
	// LoadWorkers, when positive, reads the initial load in key order,
	// split into key ranges read side by side by this many sessions
	// (docs/design.md, "The initial load in key order"); the source must
	// implement RangeLoader (and SessionSnapshotter with Consistent), or
	// the load walks (updated_at, id) order as a pass does. 0 (default):
	// the initial load is a pass from minus infinity.
	LoadWorkers int
	// Fingerprint and FingerprintFields describe the configuration that
	// defines the data set; a checkpoint with another fingerprint is a
	// safety stop.
	Fingerprint       string
	FingerprintFields map[string]string
	// RetryTimeout bounds how long consecutive transient failures (with
	// no commit between them) are retried before Run gives up; 0 (the
	// default) retries without limit. A failure after progress starts the
	// clock and the backoff over. The backoff is capped, jittered and
	// exponential, 250 ms doubling to 30 s.
	RetryTimeout time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Observer receives events for metrics; default none.
	Observer Observer
	// SweepInterval runs a reconciliation sweep between passes when this
	// much time has passed since the last one; 0 = only on demand. It needs
	// Topic and a source that implements LiveScanner.
	SweepInterval time.Duration
	// Topic reads the data topic for sweeps.
	Topic TopicView
	// RepublishOnSchemaChange makes a change of the source's shape
	// (Reshaper) schedule a sweep, which republishes every row whose
	// record now differs: every record then carries the new shape.
	RepublishOnSchemaChange bool
	// SweepMaxKeys is the memory budget of a sweep, in live topic keys
	// held at once (some 56 bytes each); default DefaultMaxKeysInMemory
	// (0), and a negative value always compares by buckets. A topic that
	// may hold more is compared by buckets (see Compare).
	SweepMaxKeys int
	// SweepMemory, when set, is called as a sweep starts with the most
	// live keys it may hold (SweepMaxKeys, or DefaultMaxKeysInMemory), and
	// the func it returns when the sweep ends: the process can make room
	// for the key set only while it is held (cmd/tidemark raises its soft
	// memory limit).
	SweepMemory func(keys int) (release func())
	// Now is the clock; default time.Now.
	Now func() time.Time
}

func (c *Config) defaults() {
	if c.PageSize <= 0 {
		c.PageSize = 1000
	}
	if c.Margin == 0 {
		c.Margin = 10 * time.Second
	} else if c.Margin < 0 {
		c.Margin = 0
	}
	if c.PollInterval <= 0 {
		c.PollInterval = time.Second
	}
	if c.HeadLookback == 0 {
		c.HeadLookback = DefaultHeadLookback
	}
	c.HeadLookback = min(max(c.HeadLookback, 0), c.Margin)
	if c.TxnMaxRecords <= 0 {
		c.TxnMaxRecords = 10000
	}
	if c.TxnMaxBytes <= 0 {
		c.TxnMaxBytes = 16 << 20
	}
	if c.TxnMaxDuration <= 0 {
		c.TxnMaxDuration = 5 * time.Second
	}
	if c.TxnTimeout <= 0 {
		c.TxnTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
}

// Engine walks a Source and publishes through a Publisher. It is not safe
// for concurrent use; Run is called once.
type Engine struct {
	cfg   Config
	src   Source
	pub   Publisher
	store CheckpointStore
	log   *slog.Logger
	runID string

	// Working state: the last committed checkpoint plus whatever the open
	// transaction has added. After any failure it is thrown away and
	// rebuilt from the store, so it is never trusted beyond a commit.
	cp *schemas.Checkpoint
	b  *boundary

	// Open transaction.
	txOpen    bool
	txRecords int
	txBytes   int64
	txPages   int
	txStart   time.Time
	txKeys    int64
	txKeySum  uint64 // sum of FNV-1a 64 of the published keys
	txNewest  int64  // µs; newest/oldest updated_at published in the txn
	txOldest  int64
	bMoved    bool // a B entry's timestamp moved since the last commit
	// woke is set when the last idle ended on a wake-up, or for a
	// follow-up pass; fullAt is when the last full pass ended in this
	// process (docs/design.md, "Head passes").
	woke bool
	// wokeAt is when the last wake-up was received.
	wokeAt time.Time
	fullAt time.Time
	// wakeTaken is set when a wake-up is taken (before a pass, or between
	// two pages of a full pass); following, while the pass that runs is a
	// follow-up (docs/design.md, "Follow-up passes").
	wakeTaken, following bool
	// steps are the head passes finished and committed since the last
	// full pass, for the next one (PageRequest.Steps).
	steps []Step
	// forceHead makes the next pass a head pass: one run between two
	// pages of a full pass. fullHeads counts the head passes that ended
	// during the open full pass (docs/design.md, "Head passes during a
	// full pass"). passStarted is when the last pass started, for
	// MinPassGap.
	forceHead   bool
	nestOpen    bool // the open full pass may run head passes between its pages
	fullHeads   int
	passStarted time.Time
	// lookAt is when this run looks in the ledger for a newer one next
	// (lookForNewerRun): supersededEvery after its start, its last commit
	// or its last look.
	lookAt time.Time
	// headEnded is set by the end of a head pass for the commit that
	// follows (CommitInfo.HeadPass).
	headEnded bool
	// sweeping is set while a sweep runs: its commits end no pass, and
	// the updated_at of its records says nothing of how fresh they are.
	sweeping bool
	// rereadBelow is the watermark the open pass started from (µs): rows
	// at or below it are re-reads. passW marks it valid.
	rereadBelow int64
	passW       bool

	// For the completion record.
	startCounters schemas.Counters
	committed     schemas.Checkpoint // last committed
	// committedBy is the run that committed the checkpoint last loaded
	// (load sets the working copy's RunID to this run's); loadedRun the
	// one that committed the checkpoint this run started from.
	committedBy, loadedRun string
	// prevRun is the latest run in the ledger when this run started (the
	// one it follows), and started says its own run-start is committed:
	// any other run that appears later has taken over.
	prevRun string
	started bool
	// txBegan is when the open transaction began, on the real clock (the
	// broker's transaction timeout runs on it).
	txBegan time.Time
	// The source's clock at the start of the pass (and the host's then),
	// and the rows of the pass dated after it.
	clockAt, clockThen time.Time
	future             int
	futureID           string

	resumedFrom string
	startReason string
	lastEnd     endEvidence
	lastSweep   *SweepResult
	passesRun   int
	// loadEnded: the last pass ended a moving initial load in key order,
	// or a consistent one resumed under a new snapshot (Once runs one more
	// pass, for what changed while the load ran); loadResumed: this
	// process resumed the open load in key order.
	loadEnded, loadResumed bool
}

type endEvidence struct {
	at     time.Time
	cursor string
	since  string
	pages  int
}

// New returns an Engine. The source, publisher and store are owned by the
// caller.
func New(cfg Config, src Source, pub Publisher, store CheckpointStore) (*Engine, error) {
	cfg.defaults()
	if cfg.Name == "" {
		return nil, errors.New("connector: Config.Name is required")
	}
	if cfg.Horizon {
		if _, ok := src.(Horizoner); !ok {
			return nil, fmt.Errorf("connector: horizon mode needs a source that reports its oldest open writer; %T does not: %w", src, ErrPermanent)
		}
	}
	if cfg.Consistent {
		if _, ok := src.(Snapshotter); !ok {
			return nil, fmt.Errorf("connector: consistent initial load needs a source that can hold a snapshot; %T cannot: %w", src, ErrPermanent)
		}
	}
	var id [8]byte
	_, _ = rand.Read(id[:])
	return &Engine{cfg: cfg, src: src, pub: pub, store: store, log: cfg.Logger, runID: hex.EncodeToString(id[:])}, nil
}

// RunID identifies this run in checkpoints.
func (e *Engine) RunID() string { return e.runID }

// Mode selects how long Run runs.
type Mode int

const (
	// Continuous runs passes until the context is cancelled.
	Continuous Mode = iota
	// Once runs until one pass has reached the end of the source, then
	// returns the completion record.
	Once
)

// Run loads the checkpoint and walks until ctx is cancelled (Continuous) or
// the source is caught up (Once). A cancelled context is a clean stop: the
// open transaction is finished and Run returns a nil error. Transient
// failures are retried from the last committed checkpoint with capped,
// jittered exponential backoff; fatal ones (see Fatal) return at once.
func (e *Engine) Run(ctx context.Context, mode Mode) (*Completion, error) {
	started := e.cfg.Now()
	rt := &retry{e: e}
	if err := e.start(ctx, rt); err != nil {
		if ctx.Err() != nil && !Fatal(err) {
			// A signal while waiting for the source or Kafka: a clean
			// stop; nothing was written.
			return e.completion(started, "stopped by signal during start-up"), nil
		}
		if Fatal(err) {
			e.cfg.Observer.ObserveStop(stopKind(err))
		}
		return nil, err
	}
	for {
		published := e.cp.Counters.Published
		err := e.pass(ctx)
		published = e.cp.Counters.Published - published // before a sweep's repairs
		if err == nil && ctx.Err() == nil && e.sweepDue() {
			_, err = e.Sweep(ctx, e.cfg.Topic)
		}
		if err == nil && ctx.Err() == nil && mode != Once && !time.Now().Before(e.lookAt) {
			err = e.lookForNewerRun(ctx) // passes that commit nothing
		}
		if err == nil && ctx.Err() != nil {
			// The pass was interrupted: what it had handed to the
			// producer is committed, but the end was not reached.
			return e.completion(started, "stopped by signal before the end of the pass; the next run resumes at the committed cursor"), nil
		}
		if err == nil {
			rt.progress()
			e.passesRun++
			if mode == Once {
				if e.loadEnded {
					// The topic holds the moving load's view; what
					// changed while it ran is the next pass's.
					e.loadEnded = false
					continue
				}
				return e.completion(started, "caught up"), nil
			}
			// A pass that a wake-up started is followed by one more, and
			// a follow-up by another while they publish (docs/design.md,
			// "Follow-up passes").
			follow := e.cfg.Wake != nil && (e.wakeTaken || e.following && published > 0)
			e.wakeTaken, e.following = false, false
			var ok bool
			if ok, err = e.idle(ctx, follow); err == nil {
				if !ok {
					return e.completion(started, "stopped by signal"), nil
				}
				continue
			}
			// A fatal error of idle's look in the ledger: stopped below.
		}
		if ctx.Err() != nil && !Fatal(err) {
			return e.completion(started, "stopped by signal"), nil
		}
		if Fatal(err) {
			e.cfg.Observer.ObserveStop(stopKind(err))
			var stop *StopError
			if errors.As(err, &stop) && retryReason(err) == "source" && !stop.Unmarked {
				e.markNeedsDecision(ctx, stop)
			}
			return e.completion(started, "stopped: "+err.Error()), err
		}
		// The pass after a failure is full (docs/design.md, "Head
		// passes"), even when a wake-up started the one that failed.
		e.woke, e.fullAt = false, time.Time{}
		if ok, giveUp := rt.wait(ctx, err, "transient failure; will resume from the last committed checkpoint"); !ok {
			return e.stopAfterRetries(started, giveUp)
		}
		// Nothing runs on the uncommitted state: until the checkpoint is
		// reloaded, only the recovery itself is retried.
		if err := e.recoverRetrying(ctx, rt); err != nil {
			if Fatal(err) {
				e.cfg.Observer.ObserveStop(stopKind(err))
				return e.completion(started, "stopped: "+err.Error()), err
			}
			if ctx.Err() != nil {
				return e.completion(started, "stopped by signal"), nil
			}
			return e.stopAfterRetries(started, err)
		}
	}
}

// start loads the checkpoint and records the run start, retrying transient
// failures (the database or the broker not answering yet) like any other:
// a connector started during an outage waits for it to end.
func (e *Engine) start(ctx context.Context, rt *retry) error {
	loaded := false
	for {
		var err error
		if !loaded {
			if err = e.load(ctx, true); err == nil {
				loaded = true
			}
		}
		if err == nil {
			if err = e.startRun(ctx); err == nil {
				rt.progress()
				return nil
			}
		}
		if Fatal(err) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ok, giveUp := rt.wait(ctx, err, "start-up: waiting for the source and Kafka"); !ok {
			if giveUp != nil {
				return giveUp
			}
			return ctx.Err()
		}
		if loaded {
			// A failed run-start transaction: recover the session and
			// reload before trying again.
			if err := e.recoverRetrying(ctx, rt); err != nil {
				return err
			}
		}
	}
}

// recoverRetrying recovers (see recover), retrying a recovery that fails
// transiently. It returns nil once recovered, a fatal error, the error to
// give up with, or ctx's error.
func (e *Engine) recoverRetrying(ctx context.Context, rt *retry) error {
	for {
		err := e.recover(ctx)
		if err == nil {
			return nil
		}
		if Fatal(err) {
			return err
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if ok, giveUp := rt.wait(ctx, err, "recovery failed: the uncommitted state stays discarded; retrying the recovery"); !ok {
			if giveUp != nil {
				return giveUp
			}
			return ctx.Err()
		}
	}
}

// retry paces consecutive transient failures: capped, jittered exponential
// backoff, given up once Config.RetryTimeout has passed without progress
// (never when it is 0). Progress (a commit) starts the clock over, so a
// long pass is not given up for failures it recovered from.
type retry struct {
	e     *Engine
	since time.Time // first failure since the last progress
	n     int       // failures since then
	seq   int64     // committed seq at the last failure
}

func (r *retry) progress() { r.n = 0 }

// wait reports err, then waits before the next attempt. ok is false when
// the caller must stop: giveUp is then the error to stop with, or nil when
// ctx ended.
func (r *retry) wait(ctx context.Context, err error, what string) (ok bool, giveUp error) {
	e := r.e
	e.cfg.Observer.ObserveRetry(retryReason(err))
	if r.n > 0 && e.cp != nil && e.committed.Seq != r.seq {
		r.n = 0 // committed since the last failure
	}
	if e.cp != nil {
		r.seq = e.committed.Seq
	}
	if r.n == 0 {
		r.since = time.Now()
	}
	r.n++
	delay := backoff(r.n)
	failing := time.Since(r.since)
	if t := e.cfg.RetryTimeout; t > 0 && failing+delay > t {
		return false, fmt.Errorf("giving up after %d attempts in %s (retry timeout %s): %w", r.n, failing.Round(time.Millisecond), t, err)
	}
	e.log.Warn(what, "err", err, "attempt", r.n, "failing_for", failing.Round(time.Millisecond), "retry_in", delay.Round(time.Millisecond))
	return e.sleep(ctx, delay), nil
}

// stopAfterRetries ends Run when the retries stop: gave up, or a signal.
func (e *Engine) stopAfterRetries(started time.Time, giveUp error) (*Completion, error) {
	if giveUp != nil {
		return e.completion(started, "gave up"), giveUp
	}
	return e.completion(started, "stopped by signal"), nil
}

// sweepDue reports whether a sweep should run now: an unfinished one is
// always finished, and SweepInterval schedules the others.
func (e *Engine) sweepDue() bool {
	if e.cfg.Topic == nil {
		return false
	}
	if e.cp.Sweep != nil {
		return true
	}
	if e.cfg.SweepInterval <= 0 {
		return false
	}
	if e.cp.LastSweep == nil {
		return true
	}
	last, err := schemas.ParseTime(e.cp.LastSweep.At)
	return err != nil || e.cfg.Now().Sub(last) >= e.cfg.SweepInterval
}

// SweepOnce loads the checkpoint, records the run in the ledger and runs one
// sweep: `tidemark sweep`. Transient failures are retried like Run's: the
// committed part stays, and a new sweep from a new view converges.
func (e *Engine) SweepOnce(ctx context.Context, topic TopicView) (SweepResult, error) {
	rt := &retry{e: e}
	if err := e.start(ctx, rt); err != nil {
		return SweepResult{}, err
	}
	for {
		res, err := e.Sweep(ctx, topic)
		if err == nil || Fatal(err) || ctx.Err() != nil {
			return res, err
		}
		if ok, giveUp := rt.wait(ctx, err, "sweep failed; will resume from the last committed checkpoint"); !ok {
			if giveUp != nil {
				return res, giveUp
			}
			return res, ctx.Err()
		}
		if err := e.recoverRetrying(ctx, rt); err != nil {
			return res, err
		}
	}
}

// startRun records in the ledger where this run resumed from and why, in a
// transaction of its own. The caller retries a failure after recovering
// (which reloads the checkpoint the entry then describes).
func (e *Engine) startRun(ctx context.Context) error {
	entry := &schemas.LedgerEntry{
		Version: schemas.LedgerVersion, Connector: e.cfg.Name, Kind: schemas.LedgerRun, RunID: e.runID,
		Seq: e.cp.Seq, At: schemas.FormatTime(e.cfg.Now()), Reason: e.startReason, Detail: e.resumedFrom,
		Phase: e.cp.Phase, RequestCursor: e.cp.Cursor, NextCursor: e.cp.Cursor, Watermark: e.cp.Watermark,
		Counters: e.cp.Counters,
	}
	b, err := schemas.EncodeLedgerEntry(entry)
	if err != nil {
		return err
	}
	err = e.pub.Begin(ctx)
	if err == nil {
		// As every commit: never cancelled in flight, but bounded.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		err = e.pub.Commit(cctx, &Commit{Ledger: b})
		cancel()
	}
	if err != nil {
		return fmt.Errorf("record the run start in the ledger: %w", err)
	}
	e.started = true
	e.lookAt = time.Now().Add(supersededEvery)
	e.log.Info("run started", "run_id", e.runID, "reason", e.startReason, "from", e.resumedFrom)
	return nil
}

// markNeedsDecision records a source's safety stop (a rejected cursor) in
// the committed checkpoint, so that every later start refuses until an
// operator decides with `tidemark reset`. The checkpoint is reloaded first:
// nothing uncommitted is kept. A failure here is logged; the stop stands.
//
// The mark is what makes `check` and the next run say what this run said,
// so a transient failure (a transaction left open on the offsets or ledger
// topic for longer than a read waits, a broker error) is tried again, up
// to markAttempts times, 1 s and then 2 s later.
func (e *Engine) markNeedsDecision(ctx context.Context, stop *StopError) {
	ctx = context.WithoutCancel(ctx)
	var err error
	for attempt := range markAttempts {
		if attempt > 0 {
			e.sleep(ctx, time.Duration(attempt)*time.Second)
		}
		if err = e.recover(ctx); err == nil {
			e.cp.NeedsDecision = stop.Reason
			err = e.commit(ctx)
		}
		if err == nil || Fatal(err) {
			break
		}
	}
	if err != nil {
		e.log.Error("could not mark the checkpoint as needing a decision", "err", err)
		return
	}
	e.log.Error("checkpoint marked: needs an operator decision", "reason", stop.Reason, "action", stop.Hint)
}

// markAttempts bounds the attempts of markNeedsDecision.
const markAttempts = 3

// recover discards everything not committed: it checks that no newer run
// has taken over, recovers the producer session (KIP-360: its own id and
// epoch) and reloads the committed checkpoint and dedupe set. A checkpoint
// committed meanwhile by another run means this one was fenced
// (docs/design.md, "One writer").
func (e *Engine) recover(ctx context.Context) error {
	e.resetTx()
	e.steps, e.nestOpen = nil, false
	if err := e.checkSuperseded(ctx); err != nil {
		return err
	}
	if err := e.pub.Recover(ctx); err != nil {
		return staged("kafka", fmt.Errorf("recover the producer session: %w", err))
	}
	before := e.committed
	if err := e.load(ctx, false); err != nil {
		return err
	}
	if e.cp.Seq > before.Seq && e.committedBy != e.runID {
		return fmt.Errorf("%w: checkpoint seq %d was committed by run %s while this run (%s) had committed seq %d; this one stops and writes nothing more",
			ErrFenced, e.cp.Seq, e.committedBy, e.runID, before.Seq)
	}
	return nil
}

// checkSuperseded fails with ErrFenced when the ledger shows a run of this
// connector that started after this one. It is checked before the producer
// session is touched, so that a fenced instance does not re-initialise a
// session someone else owns (a broker that enforces KIP-360 would refuse
// it anyway; the embedded broker does not).
func (e *Engine) checkSuperseded(ctx context.Context) error {
	last, err := e.store.LastRun(ctx)
	if err != nil {
		return staged("checkpoint", fmt.Errorf("read the latest run from the ledger: %w", err))
	}
	// Only a run whose start entry follows this run's is newer. The run
	// that was newest when this one started is older: a ledger that shows
	// it last does not show this run's own entry (a view cut short, or a
	// broker that lost it) and proves nothing.
	// Nor is the run whose checkpoint this one loaded at start: it
	// committed before this run began (the ledger view at start may not
	// have shown its start, and this run's own start entry may not be
	// committed yet).
	if last == "" || last == e.runID || last == e.prevRun || last == e.loadedRun {
		return nil
	}
	return fmt.Errorf("%w: run %s of connector %q started after this one (run %s); this one stops and writes nothing more",
		ErrFenced, last, e.cfg.Name, e.runID)
}

// load reads the committed checkpoint into the working state and checks
// that it belongs to this configuration.
func (e *Engine) load(ctx context.Context, first bool) error {
	cp, err := e.store.Load(ctx)
	if err != nil {
		return staged("checkpoint", fmt.Errorf("read checkpoint: %w", err))
	}
	if first {
		if e.prevRun, err = e.store.LastRun(ctx); err != nil {
			return staged("checkpoint", fmt.Errorf("read the latest run from the ledger: %w", err))
		}
	}
	if cp == nil {
		cp = &schemas.Checkpoint{Phase: schemas.PhaseIdle}
		if first {
			e.resumedFrom = "fresh start: no checkpoint"
			e.startReason = schemas.ReasonFresh
		}
	} else {
		if cp.NeedsDecision != "" {
			return &StopError{
				Reason: fmt.Sprintf("the checkpoint is marked as needing an operator decision: %s", cp.NeedsDecision),
				Hint:   fmt.Sprintf("inspect with `tidemark status`, then `tidemark reset` (to scratch or to a stated watermark) for connector %q", e.cfg.Name),
			}
		}
		if cp.Fingerprint != e.cfg.Fingerprint {
			return e.fingerprintStop(cp)
		}
		if first {
			e.resumedFrom = fmt.Sprintf("resumed: phase %s, watermark %s, cursor %q, seq %d", cp.Phase, orInf(cp.Watermark), cp.Cursor, cp.Seq)
			e.startReason = schemas.ReasonResumed
			if cp.LastReset != nil && cp.RunID == schemas.ResetRunID {
				e.resumedFrom = fmt.Sprintf("after a reset by %s to watermark %s (%s), seq %d", cp.LastReset.By, orInf(cp.LastReset.Watermark), cp.LastReset.Reason, cp.Seq)
				e.startReason = schemas.ReasonReset
			}
		}
	}
	cp.Version = schemas.CheckpointVersion
	cp.Connector = e.cfg.Name
	cp.Fingerprint = e.cfg.Fingerprint
	cp.FingerprintFields = e.cfg.FingerprintFields
	e.committedBy = cp.RunID
	if first {
		e.loadedRun = cp.RunID
	}
	cp.RunID = e.runID
	if err := e.loadBoundary(ctx, cp); err != nil {
		return err
	}
	e.cp = cp
	e.committed = *cp
	e.committed.Load = cloneLoad(cp.Load)
	if first {
		e.startCounters = cp.Counters
	}
	return nil
}

func (e *Engine) fingerprintStop(cp *schemas.Checkpoint) error {
	var changes []string
	for k, v := range e.cfg.FingerprintFields {
		if old, ok := cp.FingerprintFields[k]; !ok || old != v {
			changes = append(changes, fmt.Sprintf("%s: %q -> %q", k, cp.FingerprintFields[k], v))
		}
	}
	for k, old := range cp.FingerprintFields {
		if _, ok := e.cfg.FingerprintFields[k]; !ok {
			changes = append(changes, fmt.Sprintf("%s: %q -> (unset)", k, old))
		}
	}
	slices.Sort(changes)
	what := "the configuration fingerprint differs"
	if len(changes) > 0 {
		what = "the configuration changed since the last checkpoint: " + strings.Join(changes, "; ")
	}
	return &StopError{
		Reason: what,
		Hint: fmt.Sprintf("either restore the previous configuration, or use a new connector name for a new data set, "+
			"or run `tidemark reset --config FILE` to start connector %q over (from scratch or from a stated watermark); nothing was written", e.cfg.Name),
	}
}

// pollDelay is the poll interval less its jitter.
func (e *Engine) pollDelay() time.Duration {
	d := e.cfg.PollInterval
	if j := e.cfg.PollJitter; j > 0 {
		// Only ever shorter: the interval is what a change may wait.
		d -= time.Duration(mrand.Float64() * j * float64(d))
	}
	return d
}

// idle waits between two passes. Without Wake, until the poll interval
// after the last pass started (at once when that pass took longer), so
// that a change waits at most the interval and one pass (docs/design.md,
// "Polling"). With Wake, the same while no wake-up has come for a poll
// interval (a quiet table, or notifications lost); otherwise the poll
// interval after the last pass ended, or less when Wake receives (then at
// least MinPassGap after the last pass started). A wake-up that came
// during the pass is taken at once; with follow, the next pass is a
// follow-up, MinPassGap after the last one started, as after a wake-up.
// While it waits, it looks for a newer run in the ledger when one is due
// (lookForNewerRun). It reports false when ctx ended, or the fatal error
// of that look.
func (e *Engine) idle(ctx context.Context, follow bool) (bool, error) {
	var d time.Duration
	if e.cfg.Wake == nil {
		d = max(e.pollDelay()-time.Since(e.passStarted), 0)
	} else {
		select {
		case <-e.cfg.Wake:
			return e.woken(ctx), nil
		default:
		}
		if follow {
			e.following = true
			return e.gap(ctx), nil
		}
		d = e.pollDelay()
		if time.Since(e.wokeAt) >= e.cfg.PollInterval {
			// Polling is the safety net now: a lost notification costs
			// what a change costs without notifications.
			d = max(d-time.Since(e.passStarted), 0)
		} else if e.cp.HeadsSinceFull && !e.fullAt.IsZero() {
			// Head passes ran since the last full pass: the next full pass
			// is due a poll interval after that one ended, not after the
			// last head pass (docs/design.md, "Head passes").
			d = max(min(d, time.Until(e.fullAt.Add(e.cfg.PollInterval))), 0)
		}
	}
	t := time.NewTimer(d)
	defer t.Stop()
	look := time.NewTimer(max(time.Until(e.lookAt), 0))
	defer look.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case <-t.C:
			return true, nil
		case <-e.cfg.Wake: // never ready when nil
			return e.woken(ctx), nil
		case <-look.C:
			if err := e.lookForNewerRun(ctx); err != nil {
				return false, err
			}
			look.Reset(time.Until(e.lookAt))
		}
	}
}

// woken takes a wake-up: the next pass starts at least MinPassGap after
// the last one started. It reports false when ctx ended.
func (e *Engine) woken(ctx context.Context) bool {
	e.tookWake()
	return e.gap(ctx)
}

// tookWake notes a wake-up taken from Wake, wherever it was taken: the
// pass that runs next, or the one that runs now, is followed by one more
// (docs/design.md, "Follow-up passes").
func (e *Engine) tookWake() { e.wokeAt, e.wakeTaken = time.Now(), true }

// gap starts the next pass as a wake-up does, MinPassGap after the last
// one started (a head pass: see headNext). Before a follow-up, one
// wake-up that arrives meanwhile is taken: the pass reads what it
// announced, and is followed in turn. Only one: a wake-up left waiting
// lets the listener hold further notifications unread
// (postgres.Listener), where taking each would read each. It reports
// false when ctx ended.
func (e *Engine) gap(ctx context.Context) bool {
	e.woke = true
	gap := e.cfg.MinPassGap - time.Since(e.passStarted)
	if gap <= 0 {
		return true
	}
	t := time.NewTimer(gap)
	defer t.Stop()
	wake := e.cfg.Wake
	if e.wakeTaken {
		wake = nil
	}
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
			return true
		case <-wake: // never ready when nil
			e.tookWake()
			wake = nil
		}
	}
}

// lookForNewerRun reads the ledger for a run of this connector newer than
// this one, as recover does, when this run has committed nothing for
// supersededEvery (a quiet table): no transaction of its own would fail
// had another instance taken over (docs/design.md, "One writer"). It
// returns only a fatal error (ErrFenced); one that may pass, such as a
// ledger that cannot be read now, is logged, and the ledger looked at
// again supersededEvery later: it is not a failure of the run.
func (e *Engine) lookForNewerRun(ctx context.Context) error {
	err := e.checkSuperseded(ctx)
	e.lookAt = time.Now().Add(supersededEvery)
	if err == nil || Fatal(err) {
		return err
	}
	if ctx.Err() == nil {
		e.log.Warn("could not look in the ledger for another instance that took over; will look again", "err", err, "in", supersededEvery)
	}
	return nil
}

// headNext reports whether the pass about to start from idle is a head
// pass (docs/design.md, "Head passes"): a wake-up started it, there is a
// watermark to start from, and a full pass ended in this process less than
// a poll interval ago. Every other pass is full, so the poll timer, a retry
// and the first pass of a run all start full passes.
//
// However many rows head passes read, they go on until then: the full
// pass after them reads the margin's index range once, where full passes
// in their place would each read it.
func (e *Engine) headNext() bool {
	woke := e.woke
	e.woke = false
	if e.forceHead {
		e.forceHead = false
		return true
	}
	return woke && e.cp.Watermark != "" && !e.fullAt.IsZero() && time.Since(e.fullAt) < e.cfg.PollInterval
}

// fullWatermark is the watermark the next full pass reads from, less the
// margin: the one the last full pass left while head passes have run
// since, else W.
func (e *Engine) fullWatermark() string {
	if e.cp.HeadsSinceFull {
		return e.cp.FullWatermark
	}
	return e.cp.Watermark
}

// fullMark is the mark the next full pass skips by.
func (e *Engine) fullMark() string {
	if e.cp.HeadsSinceFull {
		return e.cp.FullMark
	}
	return e.cp.SeenMark
}

func (e *Engine) sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Backoff is the wait before retry number attempt (1, 2, ...): capped
// exponential backoff with jitter, 250 ms doubling to 30 s, the upper half
// of each step drawn at random.
func Backoff(attempt int) time.Duration { return backoff(attempt) }

func backoff(attempt int) time.Duration {
	d := 250 * time.Millisecond << min(attempt-1, 7)
	d = min(d, 30*time.Second)
	return d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
}

func stopKind(err error) string {
	var stop *StopError
	switch {
	case errors.Is(err, ErrFenced):
		return "fenced"
	case errors.As(err, &stop):
		return "safety_stop"
	}
	return "fatal"
}

// retryReason classifies a transient failure for metrics (a bounded set).
func retryReason(err error) string {
	var se *stageError
	if errors.As(err, &se) {
		return se.stage
	}
	return "other"
}

// stageError tags an error with the stage that failed.
type stageError struct {
	stage string
	err   error
}

func (e *stageError) Error() string { return e.err.Error() }
func (e *stageError) Unwrap() error { return e.err }

func staged(stage string, err error) error {
	if err == nil {
		return nil
	}
	return &stageError{stage: stage, err: err}
}

func orInf(ts string) string {
	if ts == "" {
		return "-infinity"
	}
	return ts
}
