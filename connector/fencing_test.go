package connector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// ledgerChain checks the one-writer invariant on the ledger: every
// transaction entry continues the one before it (seq + 1, and its request
// cursor is the previous entry's next cursor), so no two sessions ever
// committed on the same state; and it returns the run of every entry.
func ledgerChain(t *testing.T, r *rig) []*schemas.LedgerEntry {
	t.Helper()
	var out []*schemas.LedgerEntry
	if err := offsets.NewLedger(r.opts, r.ledger, r.name).Entries(context.Background(), 0, func(e *schemas.LedgerEntry) error {
		out = append(out, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var prev *schemas.LedgerEntry
	for _, e := range out {
		if e.Kind != schemas.LedgerTxn {
			continue
		}
		if prev != nil && (e.Seq != prev.Seq+1 || e.RequestCursor != prev.NextCursor) {
			t.Errorf("ledger: seq %d by run %s (request cursor %q) does not continue seq %d by run %s (next cursor %q): two writers",
				e.Seq, e.RunID, e.RequestCursor, prev.Seq, prev.RunID, prev.NextCursor)
		}
		prev = e
	}
	return out
}

// TestTwoLiveInstancesOneWriter: instance A runs continuously; instance B
// starts and takes over. A then meets a transient failure and recovers: it
// must learn that it is fenced (ErrFenced) and commit nothing more, instead
// of taking the connector back. The ledger stays one chain and the topic
// equals the table.
func TestTwoLiveInstancesOneWriter(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 40 {
		m.set(fmt.Sprintf("k%02d", i), t0.Add(time.Duration(i)*time.Second), "v1", false)
	}
	cfg := connector.Config{PageSize: 3, TxnMaxRecords: 3, PollInterval: 20 * time.Millisecond}
	srcA := &failOnce{Source: m}
	a, _ := r.engine(srcA, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runA := inBackground(ctx, a)
	waitSeq(t, r, 3)

	b, _ := r.engine(m, cfg) // fences A
	bctx, bcancel := context.WithCancel(context.Background())
	var bErr error
	bDone := make(chan struct{})
	go func() { _, bErr = b.Run(bctx, connector.Continuous); close(bDone) }()
	waitLedgerRuns(t, r, 2)

	// A's next page fails: it recovers, and must find out it is fenced.
	srcA.arm()
	for i := range 10 {
		m.set(fmt.Sprintf("n%02d", i), time.Now(), "new", false)
		time.Sleep(20 * time.Millisecond)
	}
	runA.fenced(t, 30*time.Second, "instance A (instance B took over)")
	bcancel()
	<-bDone
	if bErr != nil {
		t.Errorf("instance B: %v", bErr)
	}
	entries := ledgerChain(t, r)
	var bRun string
	for _, e := range entries {
		if e.Kind == schemas.LedgerRun {
			bRun = e.RunID
		}
	}
	afterB := false
	for _, e := range entries {
		if e.Kind == schemas.LedgerRun && e.RunID == bRun {
			afterB = true
		}
		if afterB && e.Kind == schemas.LedgerTxn && e.RunID != bRun {
			t.Errorf("seq %d committed by run %s after run %s took over", e.Seq, e.RunID, bRun)
		}
	}
	r.once(m, cfg)
	r.assertOnce(m.expected(), "")
}

// An instance fenced while its table is quiet has nothing to commit, so
// no transaction of its own fails; it still finds the newer run in the
// ledger within a while (supersededEvery) and stops with ErrFenced,
// instead of polling on and reporting itself ready: also while it waits
// out a poll interval far longer than that (with notifications, an hour
// is a fair setting).
func TestQuietInstanceFindsItIsFenced(t *testing.T) {
	defer connector.SetSupersededEvery(200 * time.Millisecond)()
	for _, poll := range []time.Duration{20 * time.Millisecond, time.Hour} {
		t.Run(poll.String(), func(t *testing.T) {
			r := newRig(t)
			m := newMemTable()
			for i := range 10 {
				m.set(fmt.Sprintf("k%02d", i), t0.Add(time.Duration(i)*time.Second), "v1", false)
			}
			cfg := connector.Config{PageSize: 5, TxnMaxRecords: 5, PollInterval: poll}
			a, _ := r.engine(m, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			runA := inBackground(ctx, a)
			waitSeq(t, r, 2)

			b, _ := r.engine(m, cfg) // fences A; the table stays as it is
			if _, err := b.Run(context.Background(), connector.Once); err != nil {
				t.Fatalf("instance B: %v", err)
			}
			runA.fenced(t, 20*time.Second, "instance A (fenced while its table was quiet)")
		})
	}
}

// flakyLedger fails LastRun while armed, and counts the checkpoint loads.
type flakyLedger struct {
	connector.CheckpointStore
	armed, loads atomic.Int64
}

func (s *flakyLedger) LastRun(ctx context.Context) (string, error) {
	if s.armed.Load() != 0 {
		return "", errors.New("injected: ledger read timed out")
	}
	return s.CheckpointStore.LastRun(ctx)
}

func (s *flakyLedger) Load(ctx context.Context) (*schemas.Checkpoint, error) {
	s.loads.Add(1)
	return s.CheckpointStore.Load(ctx)
}

// The quiet instance's look at the ledger is only a look: when the ledger
// cannot be read, the run goes on as it was (no retry of a failure, no
// new producer session, no reload of the checkpoint and the dedupe set)
// and looks again later; it finds a newer run once the ledger answers.
func TestQuietInstanceLedgerFailureIsNoFailure(t *testing.T) {
	defer connector.SetSupersededEvery(100 * time.Millisecond)()
	r := newRig(t)
	m := newMemTable()
	m.set("k1", t0, "v1", false)
	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	store := &flakyLedger{CheckpointStore: r.store()}
	var logs harness.SyncBuffer
	a, err := connector.New(connector.Config{Name: r.name, Fingerprint: "fp1", PollInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))}, m, w, store)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runA := inBackground(ctx, a)
	waitSeq(t, r, 1)
	loads := store.loads.Load()
	store.armed.Store(1)
	time.Sleep(time.Second) // some ten looks at the ledger, all failing
	store.armed.Store(0)
	select {
	case <-runA.done:
		t.Fatalf("instance A stopped while the ledger could not be read: %v", runA.err)
	default:
	}
	if strings.Contains(logs.String(), "transient failure") || store.loads.Load() != loads {
		t.Errorf("a look at the ledger that failed was taken for a failure of the run (checkpoint loads %d -> %d):\n%s", loads, store.loads.Load(), logs.String())
	}
	if !strings.Contains(logs.String(), "injected: ledger read timed out") {
		t.Errorf("the failed looks at the ledger were not logged:\n%s", logs.String())
	}
	b, _ := r.engine(m, connector.Config{}) // fences A
	if _, err := b.Run(context.Background(), connector.Once); err != nil {
		t.Fatalf("instance B: %v", err)
	}
	runA.fenced(t, 20*time.Second, "instance A (instance B took over)")
}

// background is an engine's continuous run on a goroutine of its own.
type background struct {
	done chan struct{} // closed when Run returned
	err  error         // Run's error, once done
}

func inBackground(ctx context.Context, e *connector.Engine) *background {
	b := &background{done: make(chan struct{})}
	go func() { _, b.err = e.Run(ctx, connector.Continuous); close(b.done) }()
	return b
}

// fenced waits up to d for the run to stop, and checks that it stopped
// fenced (ErrFenced).
func (b *background) fenced(t *testing.T, d time.Duration, who string) {
	t.Helper()
	select {
	case <-b.done:
	case <-time.After(d):
		t.Fatalf("%s still runs %s on", who, d)
	}
	if !errors.Is(b.err, connector.ErrFenced) {
		t.Errorf("%s: want ErrFenced, got %v", who, b.err)
	}
}

// failOnce fails the next page after arm is called, once.
type failOnce struct {
	connector.Source
	mu    sync.Mutex
	armed bool
}

func (f *failOnce) arm() { f.mu.Lock(); f.armed = true; f.mu.Unlock() }

func (f *failOnce) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	f.mu.Lock()
	armed := f.armed
	f.armed = false
	f.mu.Unlock()
	if armed {
		return connector.Page{}, errors.New("injected: connection reset")
	}
	return f.Source.Page(ctx, req)
}

func waitSeq(t *testing.T, r *rig, seq int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		cp, err := offsets.NewStore(r.opts, r.offsets, r.name).Load(context.Background())
		if err == nil && cp != nil && cp.Seq >= seq {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no checkpoint seq %d within 20s (last %v, %v)", seq, cp, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func waitLedgerRuns(t *testing.T, r *rig, n int) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		runs := 0
		_ = offsets.NewLedger(r.opts, r.ledger, r.name).Entries(context.Background(), 0, func(e *schemas.LedgerEntry) error {
			if e.Kind == schemas.LedgerRun {
				runs++
			}
			return nil
		})
		if runs >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d run entries within 20s, want %d", runs, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// slowPage blocks one page fetch for a while, once armed, honouring ctx.
type slowPage struct {
	connector.Source
	mu    sync.Mutex
	at    int // page number to slow down (1-based)
	n     int
	delay time.Duration
}

func (s *slowPage) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	s.mu.Lock()
	s.n++
	slow := s.n == s.at
	s.mu.Unlock()
	if slow {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return connector.Page{}, ctx.Err()
		}
	}
	return s.Source.Page(ctx, req)
}

// TestSlowPageIsNotFencing: a page fetch that outlasts the broker's
// transaction timeout, while a transaction is open, must not end as
// "fenced": the engine bounds how long a transaction stays open while it
// fetches, commits what it has, and fetches again.
func TestSlowPageIsNotFencing(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 30 {
		m.set(fmt.Sprintf("k%02d", i), t0.Add(time.Duration(i)*time.Second), "v1", false)
	}
	src := &slowPage{Source: m, at: 3, delay: 4 * time.Second}
	cfg := connector.Config{PageSize: 3, TxnMaxRecords: 100, TxnMaxDuration: time.Second, TxnTimeout: 2 * time.Second}
	e, _ := r.engineTimeout(src, cfg, 2*time.Second)
	c, err := e.Run(context.Background(), connector.Once)
	if err != nil {
		t.Fatalf("run with a page slower than the transaction timeout: %v", err)
	}
	if c.Published != 30 {
		t.Errorf("published %d, want 30", c.Published)
	}
	r.assertOnce(m.expected(), "")
}

// TestCheckpointOfAnotherRunIsFenced: when a commit's outcome is unknown
// and the reloaded checkpoint was committed by another run, this instance
// was superseded: it must stop as fenced, not carry on from the other
// run's state (two instances writing by turns), even when the ledger
// gives no verdict.
func TestCheckpointOfAnotherRunIsFenced(t *testing.T) {
	m := newMemTable()
	m.set("a", t0, "x", false)
	e, err := connector.New(connector.Config{Name: "c1", Fingerprint: "fp1"}, m, &failCommit{at: 2}, &otherRunStore{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err = e.Run(context.Background(), connector.Once); !errors.Is(err, connector.ErrFenced) {
		t.Errorf("a checkpoint committed by another run while this one recovered: got %v, want ErrFenced", err)
	}
}

// failCommit is a publisher whose commit number at fails (an unknown
// outcome, or a connection reset before anything was committed).
type failCommit struct{ commits, at int }

func (p *failCommit) Begin(context.Context) error                   { return nil }
func (p *failCommit) Publish(context.Context, *connector.Row) error { return nil }
func (p *failCommit) Commit(ctx context.Context, c *connector.Commit) error {
	p.commits++
	if c.Checkpoint != nil {
		if _, err := c.Checkpoint(make([]int64, len(c.State))); err != nil {
			return err
		}
	}
	if p.commits == p.at {
		return errors.New("unknown outcome (injected)")
	}
	return nil
}
func (p *failCommit) Abort(context.Context) error   { return nil }
func (p *failCommit) Recover(context.Context) error { return nil }

// otherRunStore has no checkpoint at first; reloaded, it holds one that
// another run committed meanwhile, and the ledger gives no verdict.
type otherRunStore struct{ loads int }

func (s *otherRunStore) Load(context.Context) (*schemas.Checkpoint, error) {
	s.loads++
	if s.loads == 1 {
		return nil, nil
	}
	return &schemas.Checkpoint{Version: schemas.CheckpointVersion, Connector: "c1", Fingerprint: "fp1", Phase: schemas.PhaseIdle,
		Seq: 7, RunID: "other-run", Watermark: schemas.FormatTime(t0)}, nil
}
func (s *otherRunStore) State(context.Context, []connector.StateRef) ([][]byte, error) {
	return nil, nil
}
func (s *otherRunStore) LastRun(context.Context) (string, error) { return "", nil }

// TestSignalDuringStartUpIsACleanStop: a connector started while its
// checkpoint store does not answer waits; a signal then is a clean stop
// (exit 0), not a runtime failure.
func TestSignalDuringStartUpIsACleanStop(t *testing.T) {
	m := newMemTable()
	e, err := connector.New(connector.Config{Name: "c1", Fingerprint: "fp1"}, m, &failCommit{at: 2}, &downStore{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	c, err := e.Run(ctx, connector.Continuous)
	if err != nil || c == nil || c.Termination != "stopped by signal during start-up" {
		t.Errorf("got %+v, %v; want a clean stop", c, err)
	}
}

// downStore is a checkpoint store that does not answer.
type downStore struct{ otherRunStore }

func (*downStore) Load(context.Context) (*schemas.Checkpoint, error) {
	return nil, errors.New("connection refused")
}

// TestStartUpNotFencedByTheRunBefore: a ledger view cut short at start-up
// (another writer's open transaction on the ledger topic) may not show the
// run before this one; when this run's own start then fails and the ledger,
// read again, shows that run, it is the run whose checkpoint this one
// loaded, so it started earlier: not a newer instance, no fence.
func TestStartUpNotFencedByTheRunBefore(t *testing.T) {
	m := newMemTable()
	m.set("a", t0, "x", false)
	st := &cutShortLedger{}
	e, err := connector.New(connector.Config{Name: "c1", Fingerprint: "fp1"}, m, &failCommit{at: 1}, st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err = e.Run(context.Background(), connector.Once); err != nil {
		t.Errorf("a start-up that failed once, after a ledger view cut short: %v", err)
	}
}

// cutShortLedger holds a checkpoint committed by run "before"; its first
// ledger read does not show that run's start, later reads do.
type cutShortLedger struct{ reads int }

func (s *cutShortLedger) Load(context.Context) (*schemas.Checkpoint, error) {
	return &schemas.Checkpoint{Version: schemas.CheckpointVersion, Connector: "c1", Fingerprint: "fp1", Phase: schemas.PhaseIdle,
		Seq: 3, RunID: "before", Watermark: schemas.FormatTime(t0)}, nil
}
func (s *cutShortLedger) State(context.Context, []connector.StateRef) ([][]byte, error) {
	return nil, nil
}
func (s *cutShortLedger) LastRun(context.Context) (string, error) {
	s.reads++
	if s.reads == 1 {
		return "", nil
	}
	return "before", nil
}
