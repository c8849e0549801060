package rig

import (
	"context"
	"fmt"
	"io"
	"log/slog"
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

// T0 is the base of explicit updated_at values: far enough in the past that
// no real clock reading interferes with it.
var T0 = time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)

// ItemsDDL is the default test table, the one InsertAt and Seed write to:
// bigint id, soft deletes, one payload. updated_at defaults to the
// statement's clock so that concurrent writers need not set it; scenarios
// about time set it explicitly.
const ItemsDDL = `CREATE TABLE items (
	id bigint PRIMARY KEY,
	updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	deleted_at timestamptz,
	v text
);
CREATE INDEX items_updated_at_id ON items (updated_at, id)`

// Fingerprint is the config fingerprint Engine gives a connector.Config
// that has none: one in the real format (16 bytes of SHA-256, hex).
const Fingerprint = "0123456789abcdef0123456789abcdef"

// Options configure New.
type Options struct {
	// DDL is run in the test's schema before anything else; empty means
	// ItemsDDL.
	DDL string
	// Table is the source table; empty means items. Soft deletes are read
	// from deleted_at when the table has that column.
	Table string
	// Name is the connector name.
	Name string
	// Ledger is the ledger topic. Empty means no ledger: the producer
	// writes none and the checkpoint store is not fail-closed.
	Ledger string
}

// Rig is one test's world: its own schema on the shared PostgreSQL, its
// own Kafka cluster with the topics created, and the PostgreSQL source on
// the table. The fields are the world's coordinates, for scenarios that
// build something of their own on it.
type Rig struct {
	T       testing.TB
	DB      *harness.DB
	Kafka   *harness.Kafka
	Opts    []kgo.Opt // client options reaching Kafka
	Name    string    // connector name
	Topic   string    // data topic
	Offsets string    // offsets (checkpoint) topic
	Ledger  string    // ledger topic; "" = none
	PG      postgres.Config
	Src     *postgres.Source
}

// New creates the schema, runs o.DDL in it, starts Kafka, creates the
// topics (the data topic with 3 partitions) and opens the PostgreSQL source
// on o.Table.
func New(t testing.TB, o Options) *Rig {
	t.Helper()
	if o.DDL == "" {
		o.DDL = ItemsDDL
	}
	if o.Table == "" {
		o.Table = "items"
	}
	db := harness.NewDB(t)
	db.Exec(t, o.DDL)
	k := harness.NewKafka(t)
	r := &Rig{
		T: t, DB: db, Kafka: k,
		Opts:    []kgo.Opt{kgo.SeedBrokers(k.Brokers...)},
		Name:    o.Name,
		Topic:   "data",
		Offsets: "tidemark-offsets",
		Ledger:  o.Ledger,
	}
	cl, err := kgo.NewClient(r.Opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: r.Topic, Partitions: 3, ReplicationFactor: -1, Offsets: r.Offsets, Ledger: r.Ledger}); err != nil {
		t.Fatal(err)
	}
	r.PG = postgres.Config{DSN: db.URL, Schema: db.Schema, Table: o.Table}
	var hasDeleted bool
	if err := db.Pool.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = $2 AND column_name = 'deleted_at')`,
		db.Schema, o.Table).Scan(&hasDeleted); err != nil {
		t.Fatal(err)
	}
	if hasDeleted {
		r.PG.DeletedAtColumn = "deleted_at"
	}
	r.Src = r.Open(r.PG)
	return r
}

// Open opens a PostgreSQL source, closed when the test ends.
func (r *Rig) Open(cfg postgres.Config) *postgres.Source {
	r.T.Helper()
	src, err := postgres.New(context.Background(), cfg)
	if err != nil {
		r.T.Fatalf("postgres.New: %v", err)
	}
	r.T.Cleanup(src.Close)
	return src
}

// Exec runs sql in the test's schema.
func (r *Rig) Exec(sql string, args ...any) { r.T.Helper(); r.DB.Exec(r.T, sql, args...) }

// InsertAt adds the row (id, updated_at = ts, v) to items.
func (r *Rig) InsertAt(id int, ts time.Time, v string) {
	r.T.Helper()
	r.Exec(`INSERT INTO items (id, updated_at, v) VALUES ($1, $2, $3)`, id, ts, v)
}

// Seed inserts ids from..to into items, row i at T0 + i*step with
// v = "v<i>".
func (r *Rig) Seed(from, to int, step time.Duration) {
	r.T.Helper()
	for i := from; i <= to; i++ {
		r.InsertAt(i, T0.Add(time.Duration(i)*step), fmt.Sprintf("v%d", i))
	}
}

// LoggerTo logs Info and above as JSON lines to w.
func LoggerTo(w io.Writer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Logger logs Warn and above into the test log.
func Logger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TopicView reads the data topic's live keys, as the sweep and verify do.
func (r *Rig) TopicView() fold.Topic { return fold.Topic{Opts: r.Opts, Topic: r.Topic} }

// asItStands reads the offsets topic as it stands, without waiting for a
// transaction still open on it (a run the test killed mid-commit): the
// test inspects what was committed.
func asItStands() context.Context {
	return fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: -1})
}

// Store is the checkpoint store the engine uses: fail-closed on the ledger
// when the rig has one.
func (r *Rig) Store() *offsets.Store {
	s := offsets.NewStore(r.Opts, r.Offsets, r.Name)
	if r.Ledger != "" {
		s = s.FailClosed(offsets.NewLedger(r.Opts, r.Ledger, r.Name), r.Topic)
	}
	return s
}

// Engine builds an engine over src on a fresh producer session (which
// fences any earlier one of the same connector name). cfg.Name is the
// rig's; an empty cfg.Fingerprint becomes Fingerprint (with the table as
// its field), a nil cfg.Topic the data topic and a nil cfg.Logger the test
// log.
func (r *Rig) Engine(src connector.Source, cfg connector.Config) *connector.Engine {
	r.T.Helper()
	w, err := producer.New(context.Background(), producer.Config{Name: r.Name, Topic: r.Topic, OffsetsTopic: r.Offsets, LedgerTopic: r.Ledger, Opts: r.Opts, Logger: Logger(r.T)})
	if err != nil {
		r.T.Fatalf("producer.New: %v", err)
	}
	r.T.Cleanup(w.Close)
	cfg.Name = r.Name
	if cfg.Fingerprint == "" {
		cfg.Fingerprint = Fingerprint
		cfg.FingerprintFields = map[string]string{"source.table": r.PG.Table}
	}
	if cfg.Topic == nil {
		cfg.Topic = r.TopicView()
	}
	if cfg.Logger == nil {
		cfg.Logger = Logger(r.T)
	}
	e, err := connector.New(cfg, src, w, r.Store())
	if err != nil {
		r.T.Fatalf("connector.New: %v", err)
	}
	return e
}

// Once is `tidemark run --once` over src: passes until caught up (and a
// sweep when one is due or unfinished). It fails the test on any error.
func (r *Rig) Once(src connector.Source, cfg connector.Config) *connector.Completion {
	r.T.Helper()
	c, err := r.Engine(src, cfg).Run(context.Background(), connector.Once)
	if err != nil {
		r.T.Fatalf("run --once: %v", err)
	}
	if c == nil {
		r.T.Fatal("run --once: nil completion")
	}
	return c
}

// Sweep is `tidemark sweep` over the rig's source.
func (r *Rig) Sweep(cfg connector.Config) connector.SweepResult {
	r.T.Helper()
	res, err := r.Engine(r.Src, cfg).SweepOnce(context.Background(), r.TopicView())
	if err != nil {
		r.T.Fatalf("sweep: %v", err)
	}
	r.T.Log(res.String())
	return res
}

// Verify compares the rig's source with the data topic.
func (r *Rig) Verify() *verify.Report {
	r.T.Helper()
	rep, err := verify.Compare(context.Background(), r.Src, r.TopicView(), "topic "+r.Topic)
	if err != nil {
		r.T.Fatalf("verify: %v", err)
	}
	return rep
}

// Checkpoint loads the committed checkpoint, failing the test when there is
// none.
func (r *Rig) Checkpoint() *schemas.Checkpoint {
	r.T.Helper()
	cp, err := offsets.NewStore(r.Opts, r.Offsets, r.Name).Load(asItStands())
	if err != nil {
		r.T.Fatalf("load checkpoint: %v", err)
	}
	if cp == nil {
		r.T.Fatal("no committed checkpoint")
	}
	return cp
}
