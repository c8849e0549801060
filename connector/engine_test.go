package connector_test

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// memTable is an in-memory upstream ordered by (updated_at, id) with the
// same keyset contract as the PostgreSQL source. It lets the engine's unit
// tests mutate the upstream between pages; the PostgreSQL suites in test/
// repeat the scenarios against the real thing.
type memTable struct {
	mu       sync.Mutex
	rows     map[string]memRow
	onPage   func(n int) // called before serving page n (1-based)
	pages    int
	failNext error
}

type memRow struct {
	ts      time.Time
	val     string
	deleted bool
}

func newMemTable() *memTable { return &memTable{rows: map[string]memRow{}} }

func (m *memTable) set(id string, ts time.Time, val string, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows[id] = memRow{ts: ts.UTC().Truncate(time.Microsecond), val: val, deleted: deleted}
}

func (m *memTable) del(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.rows, id)
}

type key struct {
	ts time.Time
	id string
}

func cmpKey(a, b key) int {
	if c := a.ts.Compare(b.ts); c != 0 {
		return c
	}
	return cmp.Compare(a.id, b.id)
}

func (m *memTable) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	m.mu.Lock()
	m.pages++
	n, hook := m.pages, m.onPage
	m.mu.Unlock()
	if hook != nil {
		hook(n)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.failNext; err != nil {
		m.failNext = nil
		return connector.Page{}, err
	}
	var after *key
	if req.Cursor != "" {
		us, id, _ := strings.Cut(req.Cursor, "|")
		v, err := strconv.ParseInt(us, 10, 64)
		if err != nil {
			return connector.Page{}, fmt.Errorf("bad cursor %q", req.Cursor)
		}
		after = &key{time.UnixMicro(v).UTC(), id}
	}
	var ks []key
	for id, r := range m.rows {
		k := key{r.ts, id}
		if !req.Since.IsZero() && r.ts.Before(req.Since) {
			continue
		}
		// A window of a full pass (only for a source that is a
		// connector.Windower): its first page reads from From, and
		// every page below Before.
		if req.Cursor == "" && !req.From.IsZero() && r.ts.Before(req.From) {
			continue
		}
		if !req.Before.IsZero() && !r.ts.Before(req.Before) {
			continue
		}
		if after != nil && cmpKey(k, *after) <= 0 {
			continue
		}
		ks = append(ks, k)
	}
	slices.SortFunc(ks, cmpKey)
	if len(ks) > req.Limit {
		ks = ks[:req.Limit]
	}
	var p connector.Page
	for _, k := range ks {
		r := m.rows[k.id]
		row := connector.Row{ID: k.id, UpdatedAt: k.ts, Deleted: r.deleted}
		if !r.deleted {
			row.Value = []byte(fmt.Sprintf(`{"id":%q,"v":%q}`, k.id, r.val))
		}
		p.Rows = append(p.Rows, row)
	}
	if len(ks) == 0 {
		p.End = true
	} else {
		last := ks[len(ks)-1]
		p.Next = fmt.Sprintf("%d|%s", last.ts.UnixMicro(), last.id)
	}
	return p, nil
}

// expected is the live state a consumer must rebuild.
func (m *memTable) expected() map[string]string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]string{}
	for id, r := range m.rows {
		if !r.deleted {
			out[id] = fmt.Sprintf(`{"id":%q,"v":%q}`, id, r.val)
		}
	}
	return out
}

type rig struct {
	t       *testing.T
	kafka   *harness.Kafka
	opts    []kgo.Opt
	name    string
	topic   string
	offsets string
	ledger  string
}

func (r *rig) store() *offsets.Store {
	return offsets.NewStore(r.opts, r.offsets, r.name).FailClosed(offsets.NewLedger(r.opts, r.ledger, r.name), r.topic)
}

func newRig(t *testing.T) *rig {
	k := harness.NewKafka(t)
	r := &rig{t: t, kafka: k, opts: []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, name: "c1", topic: "data", offsets: "tidemark-offsets", ledger: "tidemark-ledger"}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: r.topic, Partitions: 3, ReplicationFactor: -1, Offsets: r.offsets, Ledger: r.ledger}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) engine(src connector.Source, cfg connector.Config) (*connector.Engine, *producer.Writer) {
	r.t.Helper()
	return r.engineTimeout(src, cfg, 0)
}

// engineTimeout is engine with the producer's transaction timeout (0 =
// the default).
func (r *rig) engineTimeout(src connector.Source, cfg connector.Config, txnTimeout time.Duration) (*connector.Engine, *producer.Writer) {
	r.t.Helper()
	ctx := context.Background()
	w, err := producer.New(ctx, producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts, TransactionTimeout: txnTimeout})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(w.Close)
	cfg.Name = r.name
	if cfg.Fingerprint == "" {
		cfg.Fingerprint = "fp1"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	}
	e, err := connector.New(cfg, src, w, r.store())
	if err != nil {
		r.t.Fatal(err)
	}
	return e, w
}

func (r *rig) once(src connector.Source, cfg connector.Config) *connector.Completion {
	r.t.Helper()
	e, _ := r.engine(src, cfg)
	c, err := e.Run(context.Background(), connector.Once)
	if err != nil {
		r.t.Fatalf("run: %v", err)
	}
	return c
}

// assertFolded folds the topic read_committed and compares keys and values.
func (r *rig) assertFolded(want map[string]string) *fold.State {
	r.t.Helper()
	st, err := fold.Map(context.Background(), r.opts, r.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	for k, v := range want {
		got, ok := st.Live[k]
		if !ok {
			r.t.Errorf("key %s missing from topic", k)
		} else if string(got.Value) != v {
			r.t.Errorf("key %s: topic has %s, source has %s", k, got.Value, v)
		}
	}
	for k := range st.Live {
		if _, ok := want[k]; !ok {
			r.t.Errorf("key %s in topic but not live in source", k)
		}
	}
	return st
}

func dupes(st *fold.State) []string {
	var out []string
	for k, vs := range st.Publications {
		for v, n := range vs {
			if n > 1 {
				out = append(out, fmt.Sprintf("%s=%s x%d", k, v, n))
			}
		}
	}
	return out
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestEngineTiesAcrossPagesAndMutationsBetweenPages(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 5 {
		m.set(fmt.Sprintf("a%d", i), t0, "v1", false) // 5 rows, one timestamp
	}
	m.set("b", t0.Add(time.Microsecond), "v1", false) // differs in the 6th decimal
	m.set("c", t0.Add(2*time.Microsecond), "v1", false)
	m.onPage = func(n int) {
		if n == 2 { // between pages: insert behind and ahead, update a read row, soft delete, hard delete the anchor
			m.set("a0", t0.Add(time.Second), "v2", false)
			m.set("z", t0.Add(2*time.Second), "v1", false)
			m.set("c", t0.Add(3*time.Second), "v1", true)
			m.del("a1")
		}
	}
	c := r.once(m, connector.Config{PageSize: 2, Margin: 10 * time.Second})
	// a1 was read before it was hard-deleted: only a reconciliation sweep
	// can tombstone it, so the topic still holds its last state.
	want := m.expected()
	want["a1"] = `{"id":"a1","v":"v1"}`
	st := r.assertOnce(want, "")
	if c.Published == 0 || c.Transactions == 0 {
		t.Errorf("completion: %+v", c)
	}
	// A re-run over the unchanged table publishes nothing.
	before := st.Records
	c2 := r.once(m, connector.Config{PageSize: 2, Margin: 10 * time.Second})
	st2 := r.assertFolded(want)
	if st2.Records != before || c2.Published != 0 {
		t.Errorf("re-run published %d records (completion says %d)", st2.Records-before, c2.Published)
	}
}

func TestEngineResumeAfterFailureNoDuplicates(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 50 {
		m.set(fmt.Sprintf("k%03d", i), t0.Add(time.Duration(i)*time.Millisecond), "v", false)
	}
	m.onPage = func(n int) {
		if n == 7 {
			m.failNext = fmt.Errorf("connection reset (injected)")
		}
	}
	c := r.once(m, connector.Config{PageSize: 3, TxnMaxRecords: 6, Margin: time.Second})
	r.assertOnce(m.expected(), "after the resume")
	if c.Published != 50 {
		t.Errorf("published %d, want 50", c.Published)
	}
}

func TestEngineFingerprintMismatchStops(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v", false)
	r.once(m, connector.Config{FingerprintFields: map[string]string{"source.table": "t1"}})
	e, _ := r.engine(m, connector.Config{Fingerprint: "fp2", FingerprintFields: map[string]string{"source.table": "t2"}})
	_, err := e.Run(context.Background(), connector.Once)
	var stop *connector.StopError
	if !errors.As(err, &stop) || !strings.Contains(err.Error(), `source.table: "t1" -> "t2"`) {
		t.Fatalf("want a safety stop naming the change, got %v", err)
	}
}

func TestEngineZombieIsFenced(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 20 {
		m.set(fmt.Sprintf("k%02d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	e1, _ := r.engine(m, connector.Config{PageSize: 2, TxnMaxRecords: 2})
	var once sync.Once
	m.onPage = func(n int) {
		if n == 3 {
			once.Do(func() { r.engine(m, connector.Config{}) }) // a second instance starts: fences the first
		}
	}
	_, err := e1.Run(context.Background(), connector.Once)
	if !errors.Is(err, connector.ErrFenced) {
		t.Fatalf("first instance: want ErrFenced, got %v", err)
	}
}

func TestValueEnvelopeIsJSON(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "x", false)
	r.once(m, connector.Config{})
	st := r.assertFolded(m.expected())
	e := st.Live["a"]
	if !json.Valid(e.Value) || e.Headers["operation"] != "upsert" || e.Headers["updated_at"] != "2026-01-01T00:00:00.000000Z" || e.Headers["connector"] != "c1" {
		t.Errorf("record: %s %v", e.Value, e.Headers)
	}
}

// A run stopped mid-pass does not claim it caught up.
func TestStopMidPassIsNotCaughtUp(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 20 {
		m.set(fmt.Sprintf("k%02d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.onPage = func(n int) {
		if n == 3 {
			cancel()
		}
	}
	e, _ := r.engine(m, connector.Config{PageSize: 2})
	c, err := e.Run(ctx, connector.Once)
	if err != nil || c == nil || strings.HasPrefix(c.Termination, "caught up") || c.View.EndObservedAt != "" {
		t.Fatalf("completion after a stop mid-pass: %+v, %v", c, err)
	}
	m.onPage = nil
	c = r.once(m, connector.Config{PageSize: 2})
	if !strings.HasPrefix(c.Termination, "caught up") {
		t.Fatalf("the resumed run: %s", c.Termination)
	}
	r.assertFolded(m.expected())
}

// failingCommit fails the nth commit (aborting the transaction) and the
// store fails the mth load, to put a failed recovery right after a failed
// commit.
type failingCommit struct {
	connector.Publisher
	commits, failAt int
}

func (f *failingCommit) Commit(ctx context.Context, c *connector.Commit) error {
	f.commits++
	if f.commits == f.failAt {
		_ = f.Publisher.Abort(ctx)
		return fmt.Errorf("injected commit failure")
	}
	return f.Publisher.Commit(ctx, c)
}

type failingLoad struct {
	connector.CheckpointStore
	loads, failAt int
}

func (f *failingLoad) Load(ctx context.Context) (*schemas.Checkpoint, error) {
	f.loads++
	if f.loads == f.failAt {
		return nil, fmt.Errorf("injected: offsets topic unavailable")
	}
	return f.CheckpointStore.Load(ctx)
}

// After a failed commit, a failed reload must not let the pass continue on
// the uncommitted state (its cursor is past rows that were never committed).
func TestFailedRecoveryNeverContinuesOnUncommittedState(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	for i := range 12 {
		m.set(fmt.Sprintf("k%02d", i), t0.Add(time.Duration(i)*time.Second), "v", false)
	}
	ctx := context.Background()
	w, err := producer.New(ctx, producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	// Commit 1 is the run-start ledger entry, commit 2 the first page's.
	pub := &failingCommit{Publisher: w, failAt: 3}
	store := &failingLoad{CheckpointStore: r.store(), failAt: 2}
	e, err := connector.New(connector.Config{Name: r.name, Fingerprint: "fp1", PageSize: 2, TxnMaxRecords: 2,
		Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))}, m, pub, store)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Run(ctx, connector.Once); err != nil {
		t.Fatal(err)
	}
	r.assertOnce(m.expected(), "")
}

// assertOnce is assertFolded, and no row version published twice; when
// names when (e.g. "after the resume"), for the message.
func (r *rig) assertOnce(want map[string]string, when string) *fold.State {
	r.t.Helper()
	st := r.assertFolded(want)
	if d := dupes(st); len(d) > 0 {
		if when != "" {
			when = " " + when
		}
		r.t.Errorf("%d row versions published twice%s, e.g. %v", len(d), when, d[:min(3, len(d))])
	}
	return st
}
