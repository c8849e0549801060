package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	source "github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/replica"
	"github.com/tidemark/tidemark/replica/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// itemsDDL is the source table: one column of every encoding the value
// format has (docs/design.md, "Records"), so the replica's inverse mapping is exercised
// for each.
const itemsDDL = `CREATE TABLE items (
	id bigint PRIMARY KEY,
	updated_at timestamptz NOT NULL,
	deleted_at timestamptz,
	v text,
	n numeric(20,6),
	f double precision,
	r real,
	b boolean,
	i integer,
	j jsonb,
	js json,
	raw bytea,
	u uuid,
	ts timestamp,
	d date,
	iv interval,
	tags text[],
	nums integer[],
	blobs bytea[]
);
CREATE INDEX items_updated_at_id ON items (updated_at, id)`

// itemCols are the columns compared between source and replica.
const itemCols = `id, updated_at, deleted_at, v, n, f, r, b, i, j, js, raw, u, ts, d, iv, tags, nums, blobs`

// rig is a source table synced by the real engine into kfake, and the
// replica's target in the same test schema.
type rig struct {
	t     *testing.T
	db    *harness.DB
	opts  []kgo.Opt
	topic string
	src   *source.Source
	cols  []postgres.Column
	seq   int
}

func newRig(t *testing.T) *rig {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, itemsDDL)
	k := harness.NewKafka(t)
	r := &rig{t: t, db: db, opts: []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, topic: "data"}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: r.topic, Partitions: 3, ReplicationFactor: -1, Offsets: "tidemark-offsets"}); err != nil {
		t.Fatal(err)
	}
	r.src, err = source.New(context.Background(), source.Config{DSN: db.URL, Schema: db.Schema, Table: "items", DeletedAtColumn: "deleted_at"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.src.Close)
	r.cols, err = postgres.DescribeSource(context.Background(), db.Pool, db.Schema, "items", nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) exec(sql string, args ...any) { r.t.Helper(); r.db.Exec(r.t, sql, args...) }

// insert adds n rows with a value in every column (and NULLs in some).
func (r *rig) insert(n int) {
	r.t.Helper()
	for range n {
		r.seq++
		id := r.seq
		if id%7 == 0 { // a row of NULLs
			r.exec(`INSERT INTO items (id, updated_at) VALUES ($1, clock_timestamp())`, id)
			continue
		}
		r.exec(`INSERT INTO items (id, updated_at, v, n, f, r, b, i, j, js, raw, u, ts, d, iv, tags, nums, blobs) VALUES
			($1::bigint, clock_timestamp(), $2, $3::numeric, $4, 1.5, $1::bigint % 2 = 0, $1::bigint * 3, $5::jsonb, $6::json, $7::bytea,
			 md5($1::bigint::text)::uuid, '2024-05-01 12:00:00.000001'::timestamp + $1::bigint * interval '1 microsecond', '2024-02-29',
			 '1 day 02:03:04.5', $8::text[], ARRAY[$1::int, NULL, 3], ARRAY['\x00ff'::bytea, NULL])`,
			id, fmt.Sprintf("row %d \"quoted\" \\ back\nslash, {brace}", id), fmt.Sprintf("%d.000100", id*1000), float64(id)/3,
			fmt.Sprintf(`{"k": %d, "nested": {"a": [1, "x"]}}`, id), fmt.Sprintf(`{"b":1,  "a": %d}`, id),
			[]byte{0, byte(id), 255, '\\'}, []string{"a", "b,c", `q"uote`, "NULL"})
	}
}

// mutate updates, soft-deletes and revives a few rows.
func (r *rig) mutate(round int) {
	r.t.Helper()
	r.exec(`UPDATE items SET v = v || ' u' || $1::int, n = n + 1, updated_at = clock_timestamp() WHERE id % 5 = $2`, round, round%5)
	r.exec(`UPDATE items SET deleted_at = clock_timestamp(), updated_at = clock_timestamp() WHERE id % 11 = $1 AND deleted_at IS NULL`, round%11)
	r.exec(`UPDATE items SET deleted_at = NULL, v = 'revived', updated_at = clock_timestamp() WHERE id % 11 = $1 AND deleted_at IS NOT NULL`, (round+3)%11)
}

// sync runs the connector once: everything in the table is in the topic.
func (r *rig) sync() {
	r.t.Helper()
	w, err := producer.New(context.Background(), producer.Config{Name: "c1", Topic: r.topic, OffsetsTopic: "tidemark-offsets", Opts: r.opts, Logger: quietLogger(r.t)})
	if err != nil {
		r.t.Fatal(err)
	}
	defer w.Close()
	e, err := connector.New(connector.Config{
		Name: "c1", PageSize: 7, TxnMaxRecords: 20, Logger: quietLogger(r.t),
		Fingerprint: "0123456789abcdef0123456789abcdef", FingerprintFields: map[string]string{"source.table": "items"},
	}, r.src, w, offsets.NewStore(r.opts, "tidemark-offsets", "c1"))
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := e.Run(context.Background(), connector.Once); err != nil {
		r.t.Fatalf("sync: %v", err)
	}
}

// target opens a PostgreSQL target on table, created from the source's
// columns.
func (r *rig) target(table string) *postgres.Target {
	r.t.Helper()
	tg, err := postgres.Open(context.Background(), postgres.Config{DSN: r.db.URL, Table: table, Topic: r.topic, Columns: r.cols})
	if err != nil {
		r.t.Fatalf("open target: %v", err)
	}
	r.t.Cleanup(tg.Close)
	return tg
}

func (r *rig) consumer(st replica.Store, batch int) *replica.Consumer {
	r.t.Helper()
	c, err := replica.NewConsumer(replica.Config{Topic: r.topic, Opts: r.opts, BatchRecords: batch, Logger: quietLogger(r.t)}, st)
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

func (r *rig) replicate(st replica.Store, batch int) replica.Stats {
	r.t.Helper()
	s, err := r.consumer(st, batch).Run(context.Background(), replica.Once)
	if err != nil {
		r.t.Fatalf("replica: %v", err)
	}
	return s
}

// dump renders a table's rows, ORDER BY id, one text row per line.
func (r *rig) dump(table, where string) string {
	r.t.Helper()
	rows, err := r.db.Pool.Query(context.Background(), `SELECT ROW(`+itemCols+`)::text FROM `+table+` `+where+` ORDER BY id`)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			r.t.Fatal(err)
		}
		b.WriteString(s)
		b.WriteByte('\n')
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	return b.String()
}

// assertSame compares the live source rows with the replica, row by row.
func (r *rig) assertSame(table string) {
	r.t.Helper()
	want := strings.Split(r.dump("items", "WHERE deleted_at IS NULL"), "\n")
	got := strings.Split(r.dump(table, ""), "\n")
	if slices.Equal(want, got) {
		return
	}
	wm, gm := map[string]bool{}, map[string]bool{}
	for _, l := range want {
		wm[l] = true
	}
	for _, l := range got {
		gm[l] = true
	}
	n := 0
	for _, l := range want {
		if !gm[l] && n < 5 {
			r.t.Errorf("source row missing from or different in %s: %s", table, l)
			n++
		}
	}
	for _, l := range got {
		if !wm[l] && n < 10 {
			r.t.Errorf("row in %s not in the source: %s", table, l)
			n++
		}
	}
	r.t.Fatalf("%s differs from the source (%d vs %d rows)", table, len(got)-1, len(want)-1)
}

// ends lists the committed end offset of every partition.
func (r *rig) ends() map[int32]int64 {
	r.t.Helper()
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		r.t.Fatal(err)
	}
	defer cl.Close()
	l, err := kadm.NewClient(cl).ListCommittedOffsets(context.Background(), r.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[int32]int64{}
	l.Each(func(o kadm.ListedOffset) { out[o.Partition] = o.Offset })
	return out
}

// foldUpTo folds the committed records below pos (per partition) into
// key -> value: what a store at pos must hold.
func (r *rig) foldUpTo(pos map[int32]int64) map[string]string {
	r.t.Helper()
	out := map[string]string{}
	from := map[int32]kgo.Offset{}
	remaining := map[int32]int64{}
	for p, o := range pos {
		if o > 0 {
			from[p] = kgo.NewOffset().At(0)
			remaining[p] = o - 1
		}
	}
	if len(from) == 0 {
		return out
	}
	cl, err := kgo.NewClient(append(slices.Clone(r.opts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.KeepControlRecords())...)
	if err != nil {
		r.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			r.t.Fatalf("fold up to %v: %v (remaining %v)", pos, ctx.Err(), remaining)
		}
		fs.EachRecord(func(rec *kgo.Record) {
			last, ok := remaining[rec.Partition]
			if !ok || rec.Offset > last {
				return
			}
			if rec.Offset == last {
				delete(remaining, rec.Partition)
			}
			if rec.Attrs.IsControl() {
				return
			}
			if rec.Value == nil {
				delete(out, string(rec.Key))
			} else {
				out[string(rec.Key)] = string(rec.Value)
			}
		})
	}
	return out
}

// assertMatchesPositions checks that the target holds exactly the fold of
// the topic up to its stored positions: same keys, same v and n per key.
func (r *rig) assertMatchesPositions(tg *postgres.Target, table string) map[int32]int64 {
	r.t.Helper()
	pos, err := tg.Positions(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	want := map[string]string{}
	for k, v := range r.foldUpTo(pos) {
		var m struct {
			V *string `json:"v"`
			N *string `json:"n"`
		}
		if err := json.Unmarshal([]byte(v), &m); err != nil {
			r.t.Fatal(err)
		}
		want[k] = fmt.Sprintf("%v|%v", deref(m.V), deref(m.N))
	}
	rows, err := r.db.Pool.Query(context.Background(), `SELECT id::text, coalesce(v, '<nil>'), coalesce(n::text, '<nil>') FROM `+table)
	if err != nil {
		r.t.Fatal(err)
	}
	got := map[string]string{}
	var id, v, n string
	for rows.Next() {
		if err := rows.Scan(&id, &v, &n); err != nil {
			r.t.Fatal(err)
		}
		got[id] = v + "|" + n
	}
	if err := rows.Err(); err != nil {
		r.t.Fatal(err)
	}
	if !maps.Equal(want, got) {
		for k, w := range want {
			if got[k] != w {
				r.t.Errorf("id %s: target has %q, topic up to %v has %q", k, got[k], pos, w)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				r.t.Errorf("id %s in target, not in the topic up to %v", k, pos)
			}
		}
		r.t.FailNow()
	}
	return pos
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}

func quietLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
