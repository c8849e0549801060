package integration

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// t0 is the base of the explicit updated_at values: far enough in the past
// that no real clock reading interferes with it.
var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// tombstone is how fold.State.Publications counts a tombstone.
const tombstone = "\x00tombstone"

// itemsDDL is the default test table: bigint id, soft deletes, one payload.
const itemsDDL = `CREATE TABLE items (
	id bigint PRIMARY KEY,
	updated_at timestamptz NOT NULL,
	deleted_at timestamptz,
	v text
);
CREATE INDEX items_updated_at_id ON items (updated_at, id)`

// rig is one test's world: its own schema on the shared PostgreSQL, its own
// kfake cluster with the topics created, and the PostgreSQL source.
type rig struct {
	t       *testing.T
	db      *harness.DB
	kafka   *harness.Kafka
	opts    []kgo.Opt
	name    string
	topic   string
	offsets string
	pgcfg   postgres.Config
	src     *postgres.Source
}

// newRig creates the schema, runs ddl in it, starts Kafka, creates the
// topics and opens the PostgreSQL source on table (soft deletes on
// deleted_at when the table has that column).
func newRig(t *testing.T, ddl, table string) *rig {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, ddl)
	k := harness.NewKafka(t)
	r := &rig{
		t: t, db: db, kafka: k,
		opts:    []kgo.Opt{kgo.SeedBrokers(k.Brokers...)},
		name:    "it",
		topic:   "data",
		offsets: "tidemark-offsets",
	}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: r.topic, Partitions: 3, ReplicationFactor: -1, Offsets: r.offsets}); err != nil {
		t.Fatal(err)
	}
	r.pgcfg = postgres.Config{DSN: db.URL, Schema: db.Schema, Table: table}
	var hasDeleted bool
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 AND column_name = 'deleted_at')`,
		db.Schema, table).Scan(&hasDeleted); err != nil {
		t.Fatal(err)
	}
	if hasDeleted {
		r.pgcfg.DeletedAtColumn = "deleted_at"
	}
	r.src = r.open(r.pgcfg)
	return r
}

func (r *rig) open(cfg postgres.Config) *postgres.Source {
	r.t.Helper()
	src, err := postgres.New(context.Background(), cfg)
	if err != nil {
		r.t.Fatalf("postgres.New: %v", err)
	}
	r.t.Cleanup(src.Close)
	return src
}

func (r *rig) exec(sql string, args ...any) { r.t.Helper(); r.db.Exec(r.t, sql, args...) }

// testLogger logs Warn and above into the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// engine builds an engine over src with a fresh producer session (which
// fences any earlier one of the same connector name).
func (r *rig) engine(src connector.Source, cfg connector.Config) *connector.Engine {
	r.t.Helper()
	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, Opts: r.opts, Logger: testLogger(r.t)})
	if err != nil {
		r.t.Fatalf("producer.New: %v", err)
	}
	r.t.Cleanup(w.Close)
	cfg.Name = r.name
	if cfg.Fingerprint == "" {
		// A fingerprint in the real format (16 bytes of SHA-256, hex).
		cfg.Fingerprint = "0123456789abcdef0123456789abcdef"
		cfg.FingerprintFields = map[string]string{"source.table": r.pgcfg.Table}
	}
	if cfg.Logger == nil {
		cfg.Logger = testLogger(r.t)
	}
	e, err := connector.New(cfg, src, w, r.store())
	if err != nil {
		r.t.Fatalf("connector.New: %v", err)
	}
	return e
}

func (r *rig) store() *offsets.Store { return offsets.NewStore(r.opts, r.offsets, r.name) }

// once runs the engine over src until it is caught up and fails the test on
// any error.
func (r *rig) once(src connector.Source, cfg connector.Config) *connector.Completion {
	r.t.Helper()
	c, err := r.engine(src, cfg).Run(context.Background(), connector.Once)
	if err != nil {
		r.t.Fatalf("run: %v", err)
	}
	if c == nil {
		r.t.Fatal("run: nil completion")
	}
	return c
}

// expected walks the table from scratch with the PostgreSQL source itself
// (Page from Since zero) and returns id -> encoded value of the live rows,
// skipping soft-deleted ones: exactly what a consumer must rebuild.
func (r *rig) expected() map[string]string {
	r.t.Helper()
	out := map[string]string{}
	for _, row := range r.walk() {
		if !row.Deleted {
			out[row.ID] = string(row.Value)
		}
	}
	return out
}

// walk reads one whole pass of the table from minus infinity.
func (r *rig) walk() []connector.Row {
	r.t.Helper()
	var all []connector.Row
	req := connector.PageRequest{Limit: 1000}
	for i := 0; ; i++ {
		if i > 10000 {
			r.t.Fatal("walk of the table did not end")
		}
		p, err := r.src.Page(context.Background(), req)
		if err != nil {
			r.t.Fatalf("walk the table: %v", err)
		}
		if p.End {
			return all
		}
		all = append(all, p.Rows...)
		req.Cursor = p.Next
	}
}

// fold folds the data topic read_committed.
func (r *rig) fold() *fold.State {
	r.t.Helper()
	st, err := fold.Map(context.Background(), r.opts, r.topic)
	if err != nil {
		r.t.Fatalf("fold %s: %v", r.topic, err)
	}
	return st
}

// assertFolded folds the topic and compares its live keys and values with
// want. It returns the folded state.
func (r *rig) assertFolded(want map[string]string) *fold.State {
	r.t.Helper()
	st := r.fold()
	diffState(r.t, st, want)
	return st
}

func diffState(t *testing.T, st *fold.State, want map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		got, ok := st.Live[k]
		if !ok {
			t.Errorf("key %s: missing from the topic; the table has %s", k, want[k])
		} else if string(got.Value) != want[k] {
			t.Errorf("key %s: the topic has %s, the table has %s", k, got.Value, want[k])
		}
	}
	for _, k := range slices.Sorted(maps.Keys(st.Live)) {
		if _, ok := want[k]; !ok {
			t.Errorf("key %s: live in the topic (%s) but not in the table", k, st.Live[k].Value)
		}
	}
}

// assertTable is assertFolded against the table as it is now.
func (r *rig) assertTable() *fold.State {
	r.t.Helper()
	return r.assertFolded(r.expected())
}

// assertNoDupes fails when any (id, value) was published more than once.
func assertNoDupes(t *testing.T, st *fold.State) {
	t.Helper()
	var out []string
	for k, vs := range st.Publications {
		for v, n := range vs {
			if n > 1 {
				if v == tombstone {
					v = "<tombstone>"
				}
				out = append(out, fmt.Sprintf("%s=%s x%d", k, v, n))
			}
		}
	}
	slices.Sort(out)
	if len(out) > 0 {
		t.Errorf("published more than once: %s", strings.Join(out, "; "))
	}
}

// assertTombstoned checks that id is absent from the live state and that a
// tombstone was published for it.
func assertTombstoned(t *testing.T, st *fold.State, id string) {
	t.Helper()
	if _, ok := st.Live[id]; ok {
		t.Errorf("key %s: still live in the topic, want it deleted", id)
	}
	if st.Publications[id][tombstone] == 0 {
		t.Errorf("key %s: no tombstone record in the topic", id)
	}
}

// hooked wraps the PostgreSQL source to act between pages. Pages are
// numbered from 1 over the wrapper's life (across passes and runs), and
// pages read inside a consistent-load snapshot count too. Horizon and
// Snapshot pass through (Snapshot wraps the view so its pages are hooked).
type hooked struct {
	*postgres.Source
	mu    sync.Mutex
	pages int
	// before runs before page n is read; an error is returned as the
	// page's error.
	before func(ctx context.Context, n int) error
	// after runs after page n was read, before the engine sees it.
	after func(n int, p connector.Page)
}

var (
	_ connector.Source      = (*hooked)(nil)
	_ connector.Horizoner   = (*hooked)(nil)
	_ connector.Snapshotter = (*hooked)(nil)
)

func (h *hooked) next() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pages++
	return h.pages
}

func (h *hooked) around(ctx context.Context, req connector.PageRequest, page func(context.Context, connector.PageRequest) (connector.Page, error)) (connector.Page, error) {
	n := h.next()
	if h.before != nil {
		if err := h.before(ctx, n); err != nil {
			return connector.Page{}, err
		}
	}
	p, err := page(ctx, req)
	if err == nil && h.after != nil {
		h.after(n, p)
	}
	return p, err
}

func (h *hooked) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	return h.around(ctx, req, h.Source.Page)
}

func (h *hooked) Snapshot(ctx context.Context) (connector.SnapshotSource, error) {
	s, err := h.Source.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return &hookedSnap{SnapshotSource: s, h: h}, nil
}

type hookedSnap struct {
	connector.SnapshotSource
	h *hooked
}

func (s *hookedSnap) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	return s.h.around(ctx, req, s.SnapshotSource.Page)
}

// insert adds rows (id, updated_at = t0 + offsets[i], v = "v<id>").
func (r *rig) insertAt(id int, ts time.Time, v string) {
	r.t.Helper()
	r.exec(`INSERT INTO items (id, updated_at, v) VALUES ($1, $2, $3)`, id, ts, v)
}

// seed inserts ids 1..n, row i at t0 + i*step.
func (r *rig) seed(n int, step time.Duration) {
	r.t.Helper()
	for i := 1; i <= n; i++ {
		r.insertAt(i, t0.Add(time.Duration(i)*step), fmt.Sprintf("v%d", i))
	}
}

// checkpoint loads the committed checkpoint, failing the test when there is
// none.
func (r *rig) checkpoint() *schemas.Checkpoint {
	r.t.Helper()
	cp, err := r.store().Load(context.Background())
	if err != nil {
		r.t.Fatalf("load checkpoint: %v", err)
	}
	if cp == nil {
		r.t.Fatal("no committed checkpoint")
	}
	return cp
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
