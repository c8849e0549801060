package offsets

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// Store reads a connector's committed checkpoint.
type Store struct {
	opts      []kgo.Opt
	topic     string
	connector string
	ledger    *Ledger
	dataTopic string

	runMu sync.Mutex
	run   runLook // LastRun's last read
}

var _ connector.CheckpointStore = (*Store)(nil)

// NewStore returns a Store for connector's checkpoint on topic. opts
// configure the connection (brokers, TLS, SASL).
func NewStore(opts []kgo.Opt, topic, connectorName string) *Store {
	return &Store{opts: opts, topic: topic, connector: connectorName}
}

// FailClosed makes Load refuse to report "no checkpoint" when there is
// evidence that the connector ran before: committed entries in its ledger,
// or records of this connector (header connector = name) in dataTopic.
// Either means the checkpoint was lost, and starting over (from scratch or
// from "now") would be a guess.
func (s *Store) FailClosed(ledger *Ledger, dataTopic string) *Store {
	s.ledger, s.dataTopic = ledger, dataTopic
	return s
}

// Load returns the latest committed checkpoint, or nil when the connector
// has none. Only committed records are read (read_committed). With
// FailClosed it also audits the checkpoint against the ledger and refuses a
// missing checkpoint that evidence says should exist (a *connector.StopError).
//
// The checkpoint and the ledger are read one after the other, so a writer
// that commits in between (another instance, about to be fenced or having
// just fenced this one) leaves the ledger ahead of the checkpoint read.
// Load then reads both again, a few times, before it calls the ledger's
// lead a lost checkpoint.
//
// A caller that set its own ViewWait on ctx (a read-only command reading
// the topics as they stand) may get views cut short by an open transaction,
// one topic's and not the other's: the audit's verdict then proves nothing,
// and Load returns the checkpoint with an error wrapping
// ErrAuditInconclusive and what the audit found.
func (s *Store) Load(ctx context.Context) (*schemas.Checkpoint, error) {
	ctx, view := strictView(ctx)
	cut := new(atomic.Bool)
	if w, ok := fold.ViewWaitOf(ctx); ok && view == nil {
		ctx, cut = watchCut(ctx, w)
	}
	var cp *schemas.Checkpoint
	for attempt := 1; ; attempt++ {
		var err error
		if cp, err = s.latest(ctx, view); err != nil {
			return nil, err
		}
		if s.ledger == nil {
			break
		}
		afterCheckpointRead()
		err = s.ledger.Audit(ctx, cp)
		if verr := view.err(); verr != nil {
			return nil, verr // what the audit found in a partial view proves nothing
		}
		if err != nil && cut.Load() {
			return cp, fmt.Errorf("%w: %w", ErrAuditInconclusive, err)
		}
		if errors.Is(err, errLedgerAhead) && attempt < loadAttempts {
			continue
		}
		if err != nil {
			return nil, err
		}
		break
	}
	if cp == nil && s.dataTopic != "" {
		err := s.noRecordsOfOurs(ctx)
		if verr := view.err(); verr != nil {
			return nil, verr
		}
		if err != nil && cut.Load() {
			return nil, fmt.Errorf("%w: %w", ErrAuditInconclusive, err)
		}
		if err != nil {
			return nil, err
		}
	}
	return cp, nil
}

// ErrAuditInconclusive wraps what the ledger audit found when the caller's
// own view of the topics was cut short by an open transaction (see Load):
// the checkpoint returned with it is the newest committed before that
// transaction, and the audit may be fine once it is resolved.
var ErrAuditInconclusive = errors.New("the ledger audit is inconclusive while a transaction is open on the shared topics")

// loadAttempts bounds how often Load reads the checkpoint again when the
// ledger is ahead of it.
const loadAttempts = 3

// afterCheckpointRead is a test hook: it runs between Load's checkpoint
// read and its ledger audit.
var afterCheckpointRead = func() {}

// latest returns the connector's newest checkpoint. It reads the tail of the
// topic first and widens the window only when the connector's key is not in
// it: until compaction catches up (never, for Kafka's active segment), the
// topic holds every checkpoint ever committed, and reading them all made each
// start slower than the one before. Only the newest one is decoded. A view
// that stopped short (see strictView) ends it with ErrViewOpen.
func (s *Store) latest(ctx context.Context, view *openView) (*schemas.Checkpoint, error) {
	// The topic also holds the dedupe set's segments (up to half a MiB
	// each), so the first window is small.
	for _, window := range []int64{16, 256, 4096, -1} {
		var last *kgo.Record
		err := fold.ScanTail(ctx, s.opts, s.topic, window, func(r *kgo.Record) error {
			if string(r.Key) == s.connector {
				last = r
			}
			return nil
		})
		if verr := view.err(); verr != nil {
			return nil, verr
		}
		if errors.Is(err, fold.ErrNoTopic) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read the checkpoint of %q from %s: %w", s.connector, s.topic, err)
		}
		if last == nil {
			continue
		}
		if last.Value == nil {
			return nil, nil // a tombstone: reset to nothing
		}
		cp, err := schemas.DecodeCheckpoint(last.Value)
		if err != nil {
			return nil, &connector.StopError{
				Reason: fmt.Sprintf("the checkpoint at %s/%d offset %d cannot be read", s.topic, last.Partition, last.Offset),
				Hint:   "check that every writer of this offsets topic runs a compatible tidemark release; `tidemark reset` decides explicitly (it replaces the checkpoint)",
				Err:    fmt.Errorf("%w: %w", ErrUnreadableCheckpoint, err),
			}
		}
		return cp, nil
	}
	return nil, nil
}

// State returns the values of committed state records of the offsets topic
// (the dedupe set's segments), in the order of refs. A record that is not
// there, or holds another key, wraps connector.ErrStateDamaged.
func (s *Store) State(ctx context.Context, refs []connector.StateRef) ([][]byte, error) {
	// The range lies below the last stable offset (the checkpoint naming
	// it was read), so no view is fixed.
	if len(refs) == 0 {
		return nil, nil
	}
	want := make(map[int64]int, len(refs))
	lo, hi := refs[0].Offset, refs[0].Offset
	for i, r := range refs {
		want[r.Offset] = i
		lo, hi = min(lo, r.Offset), max(hi, r.Offset)
	}
	out := make([][]byte, len(refs))
	found := 0
	err := fold.ScanRange(ctx, s.opts, s.topic, 0, lo, hi, func(r *kgo.Record) error {
		i, ok := want[r.Offset]
		if !ok {
			return nil
		}
		if string(r.Key) != refs[i].Key {
			return fmt.Errorf("%w: offset %d of %s holds key %q, not %q", connector.ErrStateDamaged, r.Offset, s.topic, r.Key, refs[i].Key)
		}
		if r.Value == nil {
			return fmt.Errorf("%w: offset %d of %s (key %q) is a tombstone", connector.ErrStateDamaged, r.Offset, s.topic, r.Key)
		}
		out[i] = r.Value
		found++
		if found == len(refs) {
			return fold.ErrStop
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read %d state records of %q from %s: %w", len(refs), s.connector, s.topic, err)
	}
	for i, v := range out {
		if v == nil {
			return nil, fmt.Errorf("%w: %s offset %d (key %q) is gone", connector.ErrStateDamaged, s.topic, refs[i].Offset, refs[i].Key)
		}
	}
	return out, nil
}

// LastRun returns the run id of the connector's latest run-start entry in
// the ledger, or "" when there is none, no ledger, or no verdict.
//
// It does not fail on open transactions (ErrViewOpen is for the
// checkpoint): the engine asks it before its own session has resolved its
// last transaction (docs/design.md, "One writer", step 3), which may still
// be open on the ledger. It waits a moment (lastRunWait) for the open
// transactions to end; a view still cut short by one then proves nothing:
// this connector's newest run-start entry may lie beyond it, and the
// newest the view shows would be an older run, so it returns "" rather
// than name one. At start it is asked right after Load, whose view was
// complete. A caller's own ViewWait is kept.
//
// The first call reads the ledger's last auditWindow offsets; each later
// call of the same Store goes on from where the one before it ended, so a
// run that started since is found however many entries of other
// connectors followed its start entry (a quiet run asks every 30 s). A
// partition added since is read whole; a ledger topic created again since
// is read as at the first call.
func (s *Store) LastRun(ctx context.Context) (string, error) {
	if s.ledger == nil {
		return "", nil
	}
	w, ok := fold.ViewWaitOf(ctx)
	if !ok {
		w = fold.ViewWait{Timeout: lastRunWait}
	}
	ctx, cut := watchCut(ctx, w)
	s.runMu.Lock()
	defer s.runMu.Unlock()
	found := ""
	pos, err := s.ledger.entriesOn(ctx, s.run.pos, auditWindow, func(e *schemas.LedgerEntry) error {
		if e.Kind == schemas.LedgerRun {
			found = e.RunID
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	last := found
	if found == "" && pos != nil && !pos.Afresh {
		last = s.run.last // this read went on from the last one and saw no run start
	}
	s.run = runLook{pos: pos, last: last} // pos nil: no ledger topic (yet)
	if cut.Load() {
		return "", nil
	}
	return last, nil
}

// runLook is where LastRun's last read of the ledger ended, and the newest
// run it has seen up to there.
type runLook struct {
	pos  *fold.Position
	last string
}

// watchCut puts w on ctx with its Report also noting, in cut, that a view
// stopped before an open transaction.
func watchCut(ctx context.Context, w fold.ViewWait) (context.Context, *atomic.Bool) {
	cut := new(atomic.Bool)
	report := w.Report
	w.Report = func(o fold.OpenTxn) {
		cut.Store(true)
		if report != nil {
			report(o)
		}
	}
	return fold.WithViewWait(ctx, w), cut
}

// lastRunWait bounds how long LastRun waits for the transactions open on
// the ledger: another connector's commit holds the ledger for milliseconds.
var lastRunWait = 500 * time.Millisecond

// ErrUnreadableCheckpoint marks a checkpoint this build cannot decode (a
// newer release's, or damaged): `tidemark reset` replaces it.
var ErrUnreadableCheckpoint = errors.New("checkpoint cannot be decoded")

// noRecordsOfOurs fails when the data topic already holds a committed record
// published by this connector, or by another tidemark connector: a data
// topic is one connector's (each one's sweep would tombstone the other's
// rows, and a connector renamed would publish every row again).
func (s *Store) noRecordsOfOurs(ctx context.Context) error {
	var found, foreign *kgo.Record
	var other string
	err := fold.Scan(ctx, s.opts, s.dataTopic, func(r *kgo.Record) error {
		for _, h := range r.Headers {
			if h.Key != schemas.HeaderConnector {
				continue
			}
			if string(h.Value) == s.connector {
				found = r
				return fold.ErrStop
			}
			if foreign == nil {
				foreign, other = r, string(h.Value)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, fold.ErrNoTopic) {
		return fmt.Errorf("look for earlier records of %q in %s: %w", s.connector, s.dataTopic, err)
	}
	if found != nil {
		return &connector.StopError{
			Reason: fmt.Sprintf("there is no checkpoint for connector %q in %s, but the data topic %s already holds its records (partition %d offset %d): the checkpoint was lost",
				s.connector, s.topic, s.dataTopic, found.Partition, found.Offset),
			Hint: "nothing was written; if the offsets topic was deleted on purpose, run `tidemark reset` (to scratch re-publishes every row; --to-watermark resumes from a stated point)",
		}
	}
	if foreign != nil {
		return &connector.StopError{
			Reason: fmt.Sprintf("connector %q has no checkpoint, and its data topic %s already holds records of connector %q (partition %d offset %d): a data topic is one connector's; "+
				"two connectors in one topic overwrite each other's keys and each one's sweep would tombstone the other's rows",
				s.connector, s.dataTopic, other, foreign.Partition, foreign.Offset),
			Hint: fmt.Sprintf("nothing was written; give this connector a topic of its own (kafka.topic), or, if it replaces %q (renamed, say) and that one will not run again, "+
				"take the topic over with `tidemark reset --config FILE --yes` (publishes every row again) or `tidemark reset --config FILE --to-watermark <%q's watermark, from tidemark status> --yes`", other, other),
		}
	}
	return nil
}

// History returns every committed checkpoint of the connector still in the
// topic, oldest first; a tombstone (reset to scratch) clears what came
// before it. Compaction may have removed older ones.
func (s *Store) History(ctx context.Context) ([]*schemas.Checkpoint, error) {
	ctx, view := strictView(ctx)
	var out []*schemas.Checkpoint
	err := fold.Scan(ctx, s.opts, s.topic, func(r *kgo.Record) error {
		if string(r.Key) != s.connector {
			return nil
		}
		if r.Value == nil {
			out = out[:0]
			return nil
		}
		cp, err := schemas.DecodeCheckpoint(r.Value)
		if err != nil {
			return &connector.StopError{
				Reason: fmt.Sprintf("the checkpoint at %s/%d offset %d cannot be read", s.topic, r.Partition, r.Offset),
				Hint:   "check that every writer of this offsets topic runs a compatible tidemark release; `tidemark reset` decides explicitly",
				Err:    err,
			}
		}
		out = append(out, cp)
		return nil
	})
	if verr := view.err(); verr != nil {
		return nil, verr
	}
	if errors.Is(err, fold.ErrNoTopic) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoints of %q from %s: %w", s.connector, s.topic, err)
	}
	return out, nil
}

// ErrViewOpen is returned by the reads of the checkpoint and the ledger
// when a topic's last stable offset stays before a transaction that is
// still open: see strictView. It is transient (the engine retries).
var ErrViewOpen = errors.New("a transaction on the topic is still open")

// strictWait bounds how long a read waits for the transactions open on a
// topic when it fixes its view, before it fails with ErrViewOpen.
var strictWait = 2 * time.Second

// openView records the first partition whose view stopped before an open
// transaction.
type openView struct {
	mu   sync.Mutex
	open *fold.OpenTxn
}

func (v *openView) report(o fold.OpenTxn) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.open == nil {
		v.open = &o
	}
}

// err is ErrViewOpen once a read's view stopped short; nil for a read
// whose caller chose its own ViewWait.
func (v *openView) err() error {
	if v == nil {
		return nil
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.open == nil {
		return nil
	}
	return fmt.Errorf("%w: %s. It belongs to another writer of the shared topic (another connector or task, killed mid-commit, say) "+
		"and ends when that writer's session is initialised again or the broker aborts it (its transaction timeout); "+
		"a read before then would miss whatever was committed after it, this connector's newest checkpoint among it", ErrViewOpen, v.open)
}

// strictView makes the offsets and ledger reads fix a complete view: every
// transaction written to the shared one-partition topic before the read
// began must be resolved, or the read fails with ErrViewOpen. A view that
// stops at the last stable offset before another writer's open transaction
// hides every record after it, this connector's newest checkpoint and
// ledger entry among them (a connector of a shared offsets topic killed in
// the middle of its commit leaves such a transaction open for its
// transaction timeout): reading it would return an older checkpoint, and
// resuming from it would publish pages twice (docs/design.md, "One
// writer"). The engine reads only after its own session resolved its last
// transaction, so in steady operation the wait is the few milliseconds
// another writer's commit takes. A caller that set a ViewWait on ctx
// (fold.WithViewWait) keeps its own rule, and so do the reads nested in an
// outer strict one, which checks for them; both get a nil *openView.
func strictView(ctx context.Context) (context.Context, *openView) {
	if _, ok := fold.ViewWaitOf(ctx); ok {
		return ctx, nil
	}
	v := &openView{}
	return fold.WithViewWait(ctx, fold.ViewWait{Timeout: strictWait, Report: v.report}), v
}
