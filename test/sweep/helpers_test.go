package sweep

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
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
	"github.com/tidemark/tidemark/verify"
)

func TestMain(m *testing.M) { harness.Main(m) }

// t0 is the base of explicit updated_at values, far in the past.
var t0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// tombstone is how fold.State.Publications counts a tombstone.
const tombstone = "\x00tombstone"

// itemsDDL: bigint id, soft deletes, one payload; updated_at defaults to the
// statement's clock so that concurrent writers need not set it.
const itemsDDL = `CREATE TABLE items (
	id bigint PRIMARY KEY,
	updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	deleted_at timestamptz,
	v text
);
CREATE INDEX items_updated_at_id ON items (updated_at, id)`

// rig is one test's world: a schema on the shared PostgreSQL, a kfake
// cluster with the topics, and the PostgreSQL source on items.
type rig struct {
	t       *testing.T
	db      *harness.DB
	kafka   *harness.Kafka
	opts    []kgo.Opt
	name    string
	topic   string
	offsets string
	ledger  string
	pgcfg   postgres.Config
	src     *postgres.Source
}

func newRig(t *testing.T) *rig {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, itemsDDL)
	k := harness.NewKafka(t)
	r := &rig{
		t: t, db: db, kafka: k,
		opts: []kgo.Opt{kgo.SeedBrokers(k.Brokers...)},
		name: "sw", topic: "data", offsets: "tidemark-offsets", ledger: "tidemark-ledger",
	}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: r.topic, Partitions: 3, ReplicationFactor: -1, Offsets: r.offsets, Ledger: r.ledger}); err != nil {
		t.Fatal(err)
	}
	r.pgcfg = postgres.Config{DSN: db.URL, Schema: db.Schema, Table: "items", DeletedAtColumn: "deleted_at"}
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

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// topicView reads the data topic's live keys, as the sweep and verify do.
func (r *rig) topicView() fold.Topic { return fold.Topic{Opts: r.opts, Topic: r.topic} }

func (r *rig) store() *offsets.Store {
	return offsets.NewStore(r.opts, r.offsets, r.name).FailClosed(offsets.NewLedger(r.opts, r.ledger, r.name), r.topic)
}

// engine builds an engine over src on a fresh producer session (fencing any
// earlier one). cfg.Topic defaults to the data topic.
func (r *rig) engine(src connector.Source, cfg connector.Config) *connector.Engine {
	r.t.Helper()
	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: r.offsets, LedgerTopic: r.ledger, Opts: r.opts, Logger: testLogger(r.t)})
	if err != nil {
		r.t.Fatalf("producer.New: %v", err)
	}
	r.t.Cleanup(w.Close)
	cfg.Name = r.name
	cfg.Fingerprint = "0123456789abcdef0123456789abcdef"
	cfg.FingerprintFields = map[string]string{"source.table": "items"}
	if cfg.Topic == nil {
		cfg.Topic = r.topicView()
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

// once is `tidemark run --once`: a pass (and a sweep when one is due or
// unfinished).
func (r *rig) once(cfg connector.Config) *connector.Completion {
	r.t.Helper()
	c, err := r.engine(r.src, cfg).Run(context.Background(), connector.Once)
	if err != nil {
		r.t.Fatalf("run --once: %v", err)
	}
	return c
}

// sweep is `tidemark sweep`.
func (r *rig) sweep(cfg connector.Config) connector.SweepResult {
	r.t.Helper()
	res, err := r.engine(r.src, cfg).SweepOnce(context.Background(), r.topicView())
	if err != nil {
		r.t.Fatalf("sweep: %v", err)
	}
	r.t.Log(res.String())
	return res
}

// verify compares the source with the data topic.
func (r *rig) verify() *verify.Report {
	r.t.Helper()
	rep, err := verify.Compare(context.Background(), r.src, r.topicView(), "topic "+r.topic)
	if err != nil {
		r.t.Fatalf("verify: %v", err)
	}
	return rep
}

// expected is id -> encoded value of the table's live rows, as the source
// itself encodes them (one snapshot).
func (r *rig) expected() map[string]string {
	r.t.Helper()
	out := map[string]string{}
	if _, err := r.src.ScanLive(context.Background(), func(row *connector.Row) error {
		out[row.ID] = string(row.Value)
		return nil
	}); err != nil {
		r.t.Fatalf("scan the table: %v", err)
	}
	return out
}

func (r *rig) fold() *fold.State {
	r.t.Helper()
	st, err := fold.Map(context.Background(), r.opts, r.topic)
	if err != nil {
		r.t.Fatalf("fold %s: %v", r.topic, err)
	}
	return st
}

// assertTable folds the topic and compares its live keys and values with
// the table as it is now. It returns the folded state.
func (r *rig) assertTable() *fold.State {
	r.t.Helper()
	st := r.fold()
	if d := diffState(st, r.expected()); len(d) > 0 {
		r.t.Errorf("the folded topic differs from the table:\n  %s", strings.Join(d, "\n  "))
	}
	return st
}

func diffState(st *fold.State, want map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		got, ok := st.Live[k]
		switch {
		case !ok && st.Publications[k][tombstone] > 0:
			out = append(out, fmt.Sprintf("key %s: live in the table (%s) but its last record is a TOMBSTONE", k, want[k]))
		case !ok:
			out = append(out, fmt.Sprintf("key %s: missing from the topic; the table has %s", k, want[k]))
		case string(got.Value) != want[k]:
			out = append(out, fmt.Sprintf("key %s: the topic has %s, the table has %s", k, got.Value, want[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(st.Live)) {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("key %s: live in the topic (%s) but not in the table", k, st.Live[k].Value))
		}
	}
	return out
}

// tombstoned lists the keys that have at least one tombstone record.
func tombstoned(st *fold.State) []string {
	var out []string
	for k, vs := range st.Publications {
		if vs[tombstone] > 0 {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (r *rig) checkpoint() *schemas.Checkpoint {
	r.t.Helper()
	cp, err := offsets.NewStore(r.opts, r.offsets, r.name).Load(context.Background())
	if err != nil {
		r.t.Fatalf("load checkpoint: %v", err)
	}
	if cp == nil {
		r.t.Fatal("no committed checkpoint")
	}
	return cp
}

// seed inserts ids from..to, row i at t0 + i*step, v = "v<i>".
func (r *rig) seed(from, to int, step time.Duration) {
	r.t.Helper()
	for i := from; i <= to; i++ {
		r.exec(`INSERT INTO items (id, updated_at, v) VALUES ($1, $2, $3)`, i, t0.Add(time.Duration(i)*step), fmt.Sprintf("v%d", i))
	}
}

// produceRaw writes records straight into the data topic, behind
// tidemark's back (non-transactional, default murmur2 partitioner); a nil
// value is a tombstone.
func (r *rig) produceRaw(kvs ...[2]*string) {
	r.t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, r.opts...), kgo.DefaultProduceTopic(r.topic), kgo.DisableIdempotentWrite())...)
	if err != nil {
		r.t.Fatal(err)
	}
	defer cl.Close()
	for _, kv := range kvs {
		rec := &kgo.Record{Key: []byte(*kv[0])}
		if kv[1] != nil {
			rec.Value = []byte(*kv[1])
		}
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			r.t.Fatalf("produce %s: %v", *kv[0], err)
		}
	}
}

func ptr(s string) *string { return &s }

func contains(s []string, v string) bool { return slices.Contains(s, v) }
