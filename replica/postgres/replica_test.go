package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	source "github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/replica"
	"github.com/tidemark/tidemark/replica/postgres"
	"github.com/tidemark/tidemark/verify"
)

// TestReplicaMatchesMutatingSource: the connector syncs a table that keeps
// changing (updates, soft deletes, revivals) and the replica follows; after
// every round the replica equals the source's live rows, column by column,
// and the in-memory store holds the same keys.
func TestReplicaMatchesMutatingSource(t *testing.T) {
	r := newRig(t)
	tg := r.target("items_replica")
	mem := replica.NewMemory()
	r.insert(40)
	for round := range 4 {
		r.sync()
		r.replicate(tg, 13)
		r.replicate(mem, 13)
		r.assertSame("items_replica")
		var live int
		if err := r.db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM items WHERE deleted_at IS NULL").Scan(&live); err != nil {
			t.Fatal(err)
		}
		if mem.Len() != live {
			t.Fatalf("round %d: memory store has %d keys, source %d live rows", round, mem.Len(), live)
		}
		r.mutate(round)
		r.insert(5)
	}
	r.sync()
	r.replicate(tg, 13)
	r.assertSame("items_replica")
	pos, err := tg.Positions(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if ends := r.ends(); !maps.Equal(pos, ends) {
		t.Errorf("stored positions %v, topic ends %v", pos, ends)
	}

	// `tidemark verify` reads the replica table with the source's own
	// encoder: the created table re-encodes to the very same values.
	rs, err := source.New(context.Background(), source.Config{DSN: r.db.URL, Schema: r.db.Schema, Table: "items_replica"})
	if err != nil {
		t.Fatalf("open the replica as a source: %v", err)
	}
	defer rs.Close()
	rep, err := verify.Compare(context.Background(), r.src, verify.Scanned{LiveScanner: rs}, "items_replica")
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.SourceRows == 0 {
		t.Errorf("verify source vs replica: %+v", rep)
	}
}

// TestReplicaKilledAtRandomPoints stops the replica at random moments, by
// cancelling its context or by failing the transaction between the COPY and
// the COMMIT, while the source keeps changing. After every stop the target
// holds exactly the fold of the topic up to its stored positions; at the end
// it equals the source.
func TestReplicaKilledAtRandomPoints(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("TIDEMARK_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	t.Logf("seed %d (rerun with TIDEMARK_SEED=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	r := newRig(t)
	tg := r.target("items_replica")
	r.insert(60)
	r.sync()
	const kills = 24
	var injected, cancelled int
	for i := range kills {
		if i%4 == 3 {
			r.mutate(i)
			r.insert(3)
			r.sync()
		}
		ctx, cancel := context.WithCancel(context.Background())
		var fail atomic.Int64
		if rng.IntN(2) == 0 {
			// Fail the n-th transaction after its COPY and merge.
			fail.Store(int64(1 + rng.IntN(4)))
			tg.SetBeforeCommit(func(context.Context) error {
				if fail.Add(-1) == 0 {
					injected++
					return errors.New("injected failure before COMMIT")
				}
				return nil
			})
		} else {
			tg.SetBeforeCommit(nil)
			d := time.Duration(rng.IntN(40_000)) * time.Microsecond
			time.AfterFunc(d, cancel)
		}
		_, err := r.consumer(tg, 1+rng.IntN(9)).Run(ctx, replica.Once)
		switch {
		case err != nil && strings.Contains(err.Error(), "injected failure"):
		case err != nil:
			t.Fatalf("kill %d: unexpected error: %v", i, err)
		case ctx.Err() != nil:
			cancelled++
		}
		cancel()
		tg.SetBeforeCommit(nil)
		pos := r.assertMatchesPositions(tg, "items_replica")
		t.Logf("stop %d: positions %v", i, pos)
	}
	t.Logf("%d stops: %d injected failures before COMMIT, %d cancellations mid-run", kills, injected, cancelled)
	r.replicate(tg, 5)
	r.assertSame("items_replica")
	pos := r.assertMatchesPositions(tg, "items_replica")
	if ends := r.ends(); !maps.Equal(pos, ends) {
		t.Errorf("stored positions %v, topic ends %v", pos, ends)
	}
}

// TestReplayFromBeginningIsIdentical: rebuilding from the beginning (Reset,
// then consume) twice, and replaying into a fresh table, all give
// byte-identical dumps.
func TestReplayFromBeginningIsIdentical(t *testing.T) {
	r := newRig(t)
	r.insert(30)
	r.sync()
	r.mutate(1)
	r.sync()
	tg := r.target("items_replica")
	r.replicate(tg, 11)
	first := r.dump("items_replica", "")
	for range 2 {
		r.exec(`UPDATE items_replica SET v = 'local drift'`) // a rebuild must not keep it
		if err := replica.Reset(context.Background(), tg); err != nil {
			t.Fatal(err)
		}
		if n := r.dump("items_replica", ""); n != "" {
			t.Fatalf("after Reset the target still has rows:\n%s", n)
		}
		st := r.replicate(tg, 7)
		if st.Records == 0 {
			t.Fatal("replay applied nothing")
		}
		if again := r.dump("items_replica", ""); again != first {
			t.Fatalf("replay differs:\nfirst:\n%s\nreplay:\n%s", first, again)
		}
	}
	fresh := r.target("items_fresh")
	r.replicate(fresh, 1000)
	if d := r.dump("items_fresh", ""); d != first {
		t.Fatalf("replay into a fresh table differs:\nfirst:\n%s\nfresh:\n%s", first, d)
	}
	r.assertSame("items_replica")
}

// produce writes raw records (non-transactional: read_committed sees them).
func produce(t *testing.T, opts []kgo.Opt, topic string, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, -1, nil, topic); err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(context.Background(), recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

func rec(key, value string) *kgo.Record {
	r := &kgo.Record{Key: []byte(key), Partition: 0}
	if value != "" {
		r.Value = []byte(value)
	}
	return r
}

// TestTombstonesForUnknownIDsAreNoops: deleting an id the replica never saw
// changes nothing and still advances the positions, in memory and in
// PostgreSQL.
func TestTombstonesForUnknownIDsAreNoops(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE t_known (id bigint PRIMARY KEY, v text)`)
	produce(t, r.opts, r.topic, rec("1", `{"id":1,"v":"a"}`), rec("999", ""), rec("2", `{"id":2,"v":"b"}`), rec("1000", ""))
	tg, err := postgres.Open(context.Background(), postgres.Config{DSN: r.db.URL, Table: "t_known", Topic: r.topic})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	mem := replica.NewMemory()
	for _, st := range []replica.Store{tg, mem} {
		s := r.replicate(st, 100)
		if s.Tombstones != 2 || s.Upserts != 2 {
			t.Errorf("%T: stats %+v", st, s)
		}
	}
	if got := r.dump2("t_known"); got != "(1,a)\n(2,b)\n" {
		t.Errorf("target after tombstones for unknown ids:\n%s", got)
	}
	if got := mem.Rows(); len(got) != 2 || string(got["1"]) != `{"id":1,"v":"a"}` {
		t.Errorf("memory after tombstones for unknown ids: %q", got)
	}
	pos, _ := tg.Positions(context.Background())
	if ends := r.ends(); !maps.Equal(pos, ends) {
		t.Errorf("positions %v, ends %v", pos, ends)
	}
	// A tombstone-only batch into a table not created yet is a no-op too.
	produce(t, r.opts, "only-tombstones", rec("5", ""))
	tg2, err := postgres.Open(context.Background(), postgres.Config{DSN: r.db.URL, Table: "t_never", Topic: "only-tombstones"})
	if err != nil {
		t.Fatal(err)
	}
	defer tg2.Close()
	c, _ := replica.NewConsumer(replica.Config{Topic: "only-tombstones", Opts: r.opts, Logger: quietLogger(t)}, tg2)
	if _, err := c.Run(context.Background(), replica.Once); err != nil {
		t.Fatal(err)
	}
}

func (r *rig) dump2(table string) string {
	r.t.Helper()
	rows, err := r.db.Pool.Query(context.Background(), `SELECT t::text FROM `+table+` t ORDER BY 1`)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var s string
		_ = rows.Scan(&s)
		b.WriteString(s + "\n")
	}
	return b.String()
}

// TestValueRejectedByTargetType: a value the target column's type rejects
// fails the run with an error naming the id and the column, and nothing of
// that batch (rows or positions) is applied.
func TestValueRejectedByTargetType(t *testing.T) {
	cases := []struct {
		name, value, column, msg string
	}{
		{"cast", `{"id":2,"n":"not a number","raw":null}`, "n", "invalid input syntax for type integer"},
		{"base64", `{"id":2,"n":1,"raw":"@@@"}`, "raw", "base64"},
		{"unknown column", `{"id":2,"n":1,"extra":true}`, "extra", "no such column"},
		{"overflow", `{"id":2,"n":99999999999,"raw":null}`, "n", "out of range"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			r.exec(`CREATE TABLE typed (id bigint PRIMARY KEY, n integer, raw bytea)`)
			produce(t, r.opts, r.topic, rec("1", `{"id":1,"n":1,"raw":"AAE="}`), rec("2", tc.value), rec("3", `{"id":3,"n":3,"raw":null}`))
			tg, err := postgres.Open(context.Background(), postgres.Config{DSN: r.db.URL, Table: "typed", Topic: r.topic})
			if err != nil {
				t.Fatal(err)
			}
			defer tg.Close()
			_, err = r.consumer(tg, 100).Run(context.Background(), replica.Once)
			var ve *postgres.ValueError
			if !errors.As(err, &ve) {
				t.Fatalf("error %v (%T), want a *postgres.ValueError", err, err)
			}
			if ve.ID != "2" || ve.Column != tc.column || !strings.Contains(err.Error(), tc.msg) ||
				!strings.Contains(err.Error(), `id "2"`) || !strings.Contains(err.Error(), `column "`+tc.column+`"`) {
				t.Errorf("error %q: want id 2, column %s, %q", err, tc.column, tc.msg)
			}
			// The fetch may have split the records before id 2 into an
			// earlier batch; the failed batch (id 2 onwards) left nothing.
			pos, _ := tg.Positions(context.Background())
			got := r.dump2("typed")
			switch {
			case len(pos) == 0 && got == "":
			case maps.Equal(pos, map[int32]int64{0: 1}) && got == "(1,1,\"\\\\x0001\")\n":
			default:
				t.Errorf("after the failed batch: positions %v, rows:\n%s", pos, got)
			}
		})
	}
}

// TestTargetSchemaChecked: an existing table that does not fit the source
// is refused with every problem named; a missing one is created from the
// source's column types.
func TestTargetSchemaChecked(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE bad (id text, v integer, n numeric, extra text NOT NULL)`)
	_, err := postgres.Open(context.Background(), postgres.Config{DSN: r.db.URL, Table: "bad", Topic: r.topic, Columns: r.cols})
	if !errors.Is(err, postgres.ErrSchema) {
		t.Fatalf("error %v, want ErrSchema", err)
	}
	for _, want := range []string{
		`no unique index`, `column "v": source type text does not fit target type integer`,
		`missing column "raw" (source type bytea)`, `column "extra" is NOT NULL`, `ADD COLUMN "tags" text[]`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	r.target("created")
	var types string
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = 'created'::regclass AND attnum > 0`).Scan(&types); err != nil {
		t.Fatal(err)
	}
	if want := "id bigint, updated_at timestamp with time zone, deleted_at timestamp with time zone, v text, n numeric(20,6), f double precision, r real, b boolean, i integer, j jsonb, js json, raw bytea, u uuid, ts timestamp without time zone, d date, iv interval, tags text[], nums integer[], blobs bytea[]"; types != want {
		t.Errorf("created table:\n got %s\nwant %s", types, want)
	}
}

// TestTargetInferredFromRecords: without source columns, the table is
// created from the first batch's JSON types (docs/replica.md).
func TestTargetInferredFromRecords(t *testing.T) {
	r := newRig(t)
	r.insert(8)
	r.sync()
	tg, err := postgres.Open(context.Background(), postgres.Config{DSN: r.db.URL, Table: "inferred", Topic: r.topic})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	r.replicate(tg, 100)
	var types string
	if err := r.db.Pool.QueryRow(context.Background(), `SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
		FROM pg_attribute WHERE attrelid = 'inferred'::regclass AND attnum > 0`).Scan(&types); err != nil {
		t.Fatal(err)
	}
	want := "id bigint, updated_at timestamp with time zone, deleted_at text, v text, n text, f double precision, r double precision, b boolean, i bigint, j jsonb, js jsonb, raw text, u uuid, ts timestamp with time zone, d text, iv text, tags jsonb, nums jsonb, blobs jsonb"
	if types != want {
		t.Errorf("inferred table:\n got %s\nwant %s", types, want)
	}
	var n int
	_ = r.db.Pool.QueryRow(context.Background(), `SELECT count(*) FROM inferred`).Scan(&n)
	if n != 8 {
		t.Errorf("%d rows, want 8", n)
	}
}

// TestResetByAnotherReplicaIsAConflict: a second replica process that
// rebuilds the table (--from-beginning: it empties the table and forgets
// the positions) while the first one runs makes the first one's next batch
// a conflict; it used to find no positions, store its own past the gap,
// and leave a table of only the records applied since.
func TestResetByAnotherReplicaIsAConflict(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE t_two (id bigint PRIMARY KEY, v text)`)
	ctx := context.Background()
	open := func() *postgres.Target {
		tg, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_two", Topic: r.topic})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tg.Close)
		if _, err := tg.Positions(ctx); err != nil {
			t.Fatal(err)
		}
		return tg
	}
	change := func(off int64) replica.Change {
		return replica.Change{Key: strconv.FormatInt(off, 10), Value: fmt.Appendf(nil, `{"id":%d,"v":"x"}`, off), Partition: 0, Offset: off}
	}
	a, b := open(), open()
	if err := a.Apply(ctx, []replica.Change{change(0), change(1)}, map[int32]int64{0: 2}); err != nil {
		t.Fatal(err)
	}
	if err := b.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	err := a.Apply(ctx, []replica.Change{change(2)}, map[int32]int64{0: 3})
	if !errors.Is(err, postgres.ErrConflict) {
		t.Fatalf("a batch after another replica's reset: %v, want ErrConflict", err)
	}
	if got := r.dump2("t_two"); got != "" {
		t.Errorf("the conflicting batch was applied:\n%s", got)
	}
	// The rebuilding replica goes on; the first one, reopened, follows it.
	if err := b.Apply(ctx, []replica.Change{change(0), change(1), change(2)}, map[int32]int64{0: 3}); err != nil {
		t.Fatalf("the rebuild: %v", err)
	}
	a = open()
	if err := a.Apply(ctx, []replica.Change{change(3)}, map[int32]int64{0: 4}); err != nil {
		t.Fatalf("after reopening: %v", err)
	}
	if got := r.dump2("t_two"); got != "(0,x)\n(1,x)\n(2,x)\n(3,x)\n" {
		t.Errorf("table:\n%s", got)
	}
}

// TestNarrowTargetColumnsRefuseInsteadOfCutting: a target column narrower
// than a value (varchar(n), char(n)) refuses it with a *ValueError naming
// the record; PostgreSQL's explicit casts would cut it silently, and a cut
// id would overwrite, or let a tombstone delete, another id's row.
func TestNarrowTargetColumnsRefuseInsteadOfCutting(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE t_narrow (id varchar(8) PRIMARY KEY, v varchar(5), c char(3), b bit(3))`)
	r.exec(`INSERT INTO t_narrow VALUES ('order-00', 'keep', 'k', B'101')`)
	ctx := context.Background()
	tg, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_narrow", Topic: r.topic})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Positions(ctx); err != nil {
		t.Fatal(err)
	}
	off := int64(0)
	apply := func(key, value string) error {
		c := replica.Change{Key: key, Partition: 0, Offset: off}
		if value != "" {
			c.Value = []byte(value)
		}
		err := tg.Apply(ctx, []replica.Change{c}, map[int32]int64{0: off + 1})
		if err == nil {
			off++
		}
		return err
	}
	for _, tc := range []struct{ key, value, column string }{
		{"order-000001", `{"v":"new"}`, "id"},
		{"a", `{"v":"toolongvalue"}`, "v"},
		{"a", `{"c":"abcd"}`, "c"},
		{"a", `{"b":"1011"}`, "b"},
	} {
		err := apply(tc.key, tc.value)
		var ve *postgres.ValueError
		if !errors.As(err, &ve) || ve.ID != tc.key {
			t.Errorf("%s %s: %v, want a *ValueError naming the record", tc.key, tc.value, err)
		}
	}
	// A tombstone for a long id leaves the row of the id it would be cut to.
	if err := apply("order-000001", ""); err != nil {
		t.Fatalf("tombstone: %v", err)
	}
	if err := apply("a", `{"v":"fits","c":"ab","b":"110"}`); err != nil {
		t.Fatalf("values that fit: %v", err)
	}
	if got := r.dump2("t_narrow"); got != "(a,fits,\"ab \",110)\n(order-00,keep,\"k  \",101)\n" {
		t.Errorf("table:\n%s", got)
	}
}

// TestTargetOnlyColumnsLeftAlone: without the source's columns (an HTTP
// source, --infer), a column of the target that no record names is left
// alone: an update keeps its value, an insert gets its default.
func TestTargetOnlyColumnsLeftAlone(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE t_extra (id bigint PRIMARY KEY, v text, note text, loaded_at timestamptz NOT NULL DEFAULT '2030-01-01Z')`)
	r.exec(`INSERT INTO t_extra VALUES (1, 'a', 'operator note', '2020-01-01Z')`)
	ctx := context.Background()
	tg, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_extra", Topic: r.topic})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Positions(ctx); err != nil {
		t.Fatal(err)
	}
	batch := []replica.Change{
		{Key: "1", Value: []byte(`{"id":1,"v":"b"}`), Offset: 0},
		{Key: "2", Value: []byte(`{"id":2,"v":null}`), Offset: 1},
	}
	if err := tg.Apply(ctx, batch, map[int32]int64{0: 2}); err != nil {
		t.Fatalf("apply: %v", err)
	}
	want := "(1,b,\"operator note\",\"2020-01-01 00:00:00+00\")\n(2,,,\"2030-01-01 00:00:00+00\")\n"
	if got := r.dump2("t_extra"); got != want {
		t.Errorf("table:\n%swant:\n%s", got, want)
	}
}

// TestRecreatedTopicIsRefused: positions belong to one topic, by its Kafka
// topic id, not its name. A topic deleted and created again under the same
// name, with at least as many offsets as the positions (a reset connector
// republishing every live row), stops the replica (ErrPosition) instead of
// skipping the new topic's first offsets and keeping rows deleted since.
// Positions stored before topic ids were kept take the topic's id.
func TestRecreatedTopicIsRefused(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE t_rt (id bigint PRIMARY KEY, v text)`)
	ctx := context.Background()
	produce(t, r.opts, "rt", rec("1", `{"id":1,"v":"a"}`), rec("2", `{"id":2,"v":"b"}`), rec("3", `{"id":3,"v":"c"}`))
	open := func() *postgres.Target {
		tg, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_rt", Topic: "rt"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(tg.Close)
		return tg
	}
	run := func() error {
		c, err := replica.NewConsumer(replica.Config{Topic: "rt", Opts: r.opts, Logger: quietLogger(t)}, open())
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Run(ctx, replica.Once)
		return err
	}
	if err := run(); err != nil {
		t.Fatal(err)
	}
	// As stored by a version without topic ids: adopted.
	r.exec(`UPDATE tidemark_replica_offsets SET topic_id = NULL`)
	if err := run(); err != nil {
		t.Fatalf("positions without a topic id: %v", err)
	}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).DeleteTopics(ctx, "rt"); err != nil {
		t.Fatal(err)
	}
	// Row 2 was deleted meanwhile: the new topic has no record of it.
	produce(t, r.opts, "rt", rec("1", `{"id":1,"v":"a"}`), rec("3", `{"id":3,"v":"c"}`), rec("4", `{"id":4,"v":"d"}`), rec("5", `{"id":5,"v":"e"}`))
	err = run()
	if !errors.Is(err, replica.ErrPosition) || !strings.Contains(err.Error(), "recreated") {
		t.Fatalf("after the topic was recreated: %v, want ErrPosition saying it was recreated", err)
	}
}

// TestConstraintViolationIsNamed: a batch that violates a constraint of the
// target the source does not have (a CHECK, a foreign key, another unique
// index) fails with ErrConstraint naming the constraint, so the CLI stops
// (exit 3) instead of retrying a batch that fails the same way every run;
// nothing of it is applied. A deferrable unique index on the id cannot
// serve ON CONFLICT and is refused when the table is opened.
func TestConstraintViolationIsNamed(t *testing.T) {
	r := newRig(t)
	r.exec(`CREATE TABLE t_chk (id bigint PRIMARY KEY, v text CONSTRAINT v_short CHECK (length(v) < 5), email text UNIQUE)`)
	ctx := context.Background()
	tg, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_chk", Topic: r.topic})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Positions(ctx); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct{ value, constraint string }{
		{`{"id":1,"v":"toolong"}`, "v_short"},
		{`{"id":2,"v":"a","email":"x@y"},{"id":3,"v":"b","email":"x@y"}`, "t_chk_email_key"},
	} {
		var batch []replica.Change
		for j, v := range strings.Split(tc.value, "},{") {
			v = "{" + strings.Trim(v, "{}") + "}"
			batch = append(batch, replica.Change{Key: strconv.Itoa(10*i + j), Value: []byte(v), Offset: int64(j)})
		}
		err := tg.Apply(ctx, batch, map[int32]int64{0: int64(len(batch))})
		if !errors.Is(err, postgres.ErrConstraint) || !strings.Contains(err.Error(), tc.constraint) {
			t.Errorf("%s: %v, want ErrConstraint naming %s", tc.value, err, tc.constraint)
		}
		if _, err := tg.Positions(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := r.dump2("t_chk"); got != "" {
		t.Errorf("rows applied:\n%s", got)
	}
	r.exec(`CREATE TABLE t_defer (id bigint, v text, CONSTRAINT t_defer_pk PRIMARY KEY (id) DEFERRABLE INITIALLY DEFERRED)`)
	if _, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_defer", Topic: r.topic}); !errors.Is(err, postgres.ErrSchema) || !strings.Contains(err.Error(), "deferrable") {
		t.Errorf("a deferrable primary key: %v, want ErrSchema saying it is deferrable", err)
	}
}

// TestBCDatesReplicate: timestamps and dates before year 1 (astronomical
// year 0 and below, which the records write as year 0000 or -0043) are
// stored as the same instants and days, BC.
func TestBCDatesReplicate(t *testing.T) {
	r := newRig(t)
	tg := r.target("items_replica")
	r.exec(`INSERT INTO items (id, updated_at, ts, d) VALUES
		(1, clock_timestamp(), '0044-03-15 12:00:00.000001 BC', '0044-03-15 BC'),
		(2, clock_timestamp(), '0001-12-31 23:59:59 BC', '0001-01-01 BC'),
		(3, clock_timestamp(), '0001-01-01 00:00:00', '0001-01-01')`)
	r.sync()
	if _, err := r.consumer(tg, 100).Run(context.Background(), replica.Once); err != nil {
		t.Fatalf("replica: %v", err)
	}
	r.assertSame("items_replica")
}

// TestOffsetsTableOfAnotherOwner: a replica role that may write the offsets
// table but does not own it opens its target: the topic_id column, once
// there, is not added again (ALTER TABLE needs ownership even with IF NOT
// EXISTS, and would lock the table shared by every target at each start).
func TestOffsetsTableOfAnotherOwner(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	if _, err := postgres.Open(ctx, postgres.Config{DSN: r.db.URL, Table: "t_owner", Topic: r.topic, Columns: []postgres.Column{{Name: "id", Type: "bigint"}, {Name: "v", Type: "text"}}}); err != nil {
		t.Fatal(err)
	}
	role := "rep_" + r.db.Schema
	r.exec(`CREATE ROLE ` + role + ` LOGIN`)
	t.Cleanup(func() {
		r.exec(`DROP OWNED BY ` + role)
		r.exec(`DROP ROLE ` + role)
	})
	r.exec(`GRANT USAGE, CREATE ON SCHEMA ` + r.db.Schema + ` TO ` + role)
	r.exec(`GRANT SELECT, INSERT, UPDATE, DELETE ON tidemark_replica_offsets, t_owner TO ` + role)
	dsn := strings.Replace(r.db.URL, "://postgres@", "://"+role+"@", 1)
	tg, err := postgres.Open(ctx, postgres.Config{DSN: dsn, Schema: r.db.Schema, Table: "t_owner", Topic: r.topic})
	if err != nil {
		t.Fatalf("open as a role that does not own the offsets table: %v", err)
	}
	tg.Close()
}
