package replica_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/replica"
	"github.com/tidemark/tidemark/test/harness"
)

func TestCompactKeepsLastPerKey(t *testing.T) {
	in := []replica.Change{{Key: "a", Value: []byte("1")}, {Key: "b", Value: []byte("1")}, {Key: "a"}, {Key: "c", Value: []byte("1")}, {Key: "b", Value: []byte("2")}}
	got := replica.Compact(in)
	want := []string{"a:", "c:1", "b:2"}
	if len(got) != len(want) {
		t.Fatalf("got %v", got)
	}
	for i, c := range got {
		if c.Key+":"+string(c.Value) != want[i] {
			t.Errorf("%d: %s:%s, want %s", i, c.Key, c.Value, want[i])
		}
	}
}

// world is a kfake cluster with a 2-partition topic.
func world(t *testing.T) []kgo.Opt {
	t.Helper()
	k := harness.NewKafka(t)
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 2, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, "data"); err != nil {
		t.Fatal(err)
	}
	return opts
}

// txn produces recs in one transaction and commits or aborts it.
func txn(t *testing.T, opts []kgo.Opt, commit bool, recs ...*kgo.Record) {
	t.Helper()
	cl, err := kgo.NewClient(append(opts, kgo.TransactionalID("test-producer"), kgo.DefaultProduceTopic("data"))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	if err := cl.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if err := cl.EndTransaction(ctx, kgo.TransactionEndTry(commit)); err != nil {
		t.Fatal(err)
	}
}

func rec(p int32, key, value string) *kgo.Record {
	r := &kgo.Record{Key: []byte(key), Partition: p}
	if value != "" {
		r.Value = []byte(value)
	}
	return r
}

func consumer(t *testing.T, opts []kgo.Opt, st replica.Store) *replica.Consumer {
	t.Helper()
	c, err := replica.NewConsumer(replica.Config{Topic: "data", Opts: append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner())), BatchRecords: 2,
		Logger: slog.New(slog.DiscardHandler)}, st)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestConsumerSkipsAbortedAndReachesTheEnd: aborted records are never
// applied, transaction markers advance the positions, Once stops at the end
// observed at start, and a second Once applies nothing.
func TestConsumerSkipsAbortedAndReachesTheEnd(t *testing.T) {
	opts := world(t)
	popts := append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	txn(t, popts, true, rec(0, "1", `{"v":1}`), rec(1, "2", `{"v":2}`), rec(0, "3", `{"v":3}`))
	txn(t, popts, false, rec(0, "1", `{"v":"aborted"}`), rec(1, "4", `{"v":4}`))
	txn(t, popts, true, rec(0, "3", ""), rec(1, "5", `{"v":5}`), rec(1, "2", `{"v":22}`))
	mem := replica.NewMemory()
	st, err := consumer(t, opts, mem).Run(context.Background(), replica.Once)
	if err != nil {
		t.Fatal(err)
	}
	rows := mem.Rows()
	want := map[string]string{"1": `{"v":1}`, "2": `{"v":22}`, "5": `{"v":5}`}
	got := map[string]string{}
	for k, v := range rows {
		got[k] = string(v)
	}
	if !maps.Equal(got, want) {
		t.Errorf("memory %v, want %v", got, want)
	}
	if st.TotalLag() != 0 || st.Upserts != 5 || st.Tombstones != 1 {
		t.Errorf("stats %+v", st)
	}
	pos, _ := mem.Positions(context.Background())
	// p0: 1,3, commit, 1(aborted), abort, 3(tombstone), commit = 7; p1: 2, commit, 4, abort, 5, 2, commit = 7.
	if !maps.Equal(pos, map[int32]int64{0: 7, 1: 7}) {
		t.Errorf("positions %v", pos)
	}
	st, err = consumer(t, opts, mem).Run(context.Background(), replica.Once)
	if err != nil || st.Records != 0 {
		t.Errorf("second run: %+v, %v", st, err)
	}
	// A position past the end (topic recreated) is refused, not guessed.
	_ = mem.Apply(context.Background(), nil, map[int32]int64{1: 100})
	if _, err := consumer(t, opts, mem).Run(context.Background(), replica.Once); !errors.Is(err, replica.ErrPosition) {
		t.Errorf("position past the end: %v, want ErrPosition", err)
	}
	if err := replica.Reset(context.Background(), mem); err != nil || mem.Len() != 0 {
		t.Fatalf("reset: %v, %d rows left", err, mem.Len())
	}
	if _, err := consumer(t, opts, mem).Run(context.Background(), replica.Once); err != nil || mem.Len() != 3 {
		t.Errorf("rebuild after reset: %v, %d rows", err, mem.Len())
	}
}

// failing fails Apply n times.
type failing struct {
	*replica.Memory
	n int
}

func (f *failing) Apply(ctx context.Context, b []replica.Change, p map[int32]int64) error {
	if f.n > 0 {
		f.n--
		return errors.New("disk full")
	}
	return f.Memory.Apply(ctx, b, p)
}

func TestConsumerStopsOnApplyError(t *testing.T) {
	opts := world(t)
	txn(t, append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner())), true, rec(0, "1", `{}`))
	st := &failing{Memory: replica.NewMemory(), n: 1}
	if _, err := consumer(t, opts, st).Run(context.Background(), replica.Once); err == nil || st.Len() != 0 {
		t.Fatalf("apply error: %v, %d rows", err, st.Len())
	}
	if _, err := consumer(t, opts, st).Run(context.Background(), replica.Once); err != nil || st.Len() != 1 {
		t.Fatalf("after the error: %v, %d rows", err, st.Len())
	}
}

// TestConsumerFollows: in Follow mode records committed after the start are
// applied, and cancelling the context is a clean stop.
func TestConsumerFollows(t *testing.T) {
	opts := world(t)
	popts := append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))
	mem := replica.NewMemory()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := consumer(t, opts, mem).Run(ctx, replica.Follow)
		done <- err
	}()
	txn(t, popts, true, rec(1, "7", `{"v":7}`))
	deadline := time.Now().Add(10 * time.Second)
	for mem.Len() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // polling a condition with a deadline
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("follow: %v", err)
	}
	if string(mem.Rows()["7"]) != `{"v":7}` {
		t.Fatalf("record committed while following was not applied: %v", mem.Rows())
	}
}

// gate holds the first Apply until release is closed.
type gate struct {
	*replica.Memory
	once    sync.Once
	held    chan struct{}
	release chan struct{}
}

func (g *gate) Apply(ctx context.Context, b []replica.Change, p map[int32]int64) error {
	g.once.Do(func() {
		close(g.held)
		<-g.release
	})
	return g.Memory.Apply(ctx, b, p)
}

// TestConsumerStopsWhenRecordsAreDeletedUnderIt: records deleted (retention,
// DeleteRecords) between two fetches of a running replica, before it
// applied them, stop it with ErrPosition; the client does not jump to the
// new log start and skip them.
func TestConsumerStopsWhenRecordsAreDeletedUnderIt(t *testing.T) {
	k := harness.NewKafka(t)
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	cl, err := kgo.NewClient(append(opts, kgo.DefaultProduceTopic("data"), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact,delete")}, "data"); err != nil {
		t.Fatal(err)
	}
	for i := range 10 { // one batch each
		if err := cl.ProduceSync(ctx, rec(0, strconv.Itoa(i), `{}`)).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	g := &gate{Memory: replica.NewMemory(), held: make(chan struct{}), release: make(chan struct{})}
	// One record batch per fetch: what is deleted has not been fetched.
	c, err := replica.NewConsumer(replica.Config{Topic: "data", Opts: append(opts, kgo.FetchMaxBytes(1), kgo.FetchMaxPartitionBytes(1)), BatchRecords: 1,
		Logger: slog.New(slog.DiscardHandler)}, g)
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := c.Run(rctx, replica.Follow)
		done <- err
	}()
	select {
	case <-g.held:
	case err := <-done:
		t.Fatalf("the replica stopped before applying anything: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the replica applied nothing")
	}
	if _, err := adm.DeleteRecords(ctx, kadm.Offsets{"data": {0: {Topic: "data", Partition: 0, At: 6}}}); err != nil {
		t.Fatal(err)
	}
	close(g.release)
	select {
	case err := <-done:
		if !errors.Is(err, replica.ErrPosition) || !strings.Contains(err.Error(), "--from-beginning") {
			t.Fatalf("after records were deleted under it: %v, want ErrPosition naming --from-beginning", err)
		}
	case <-time.After(20 * time.Second):
		cancel()
		<-done
		t.Fatalf("the replica went on after records were deleted under it; it holds keys %v of 0..9 (2..5 skipped silently)", slices.Sorted(maps.Keys(g.Rows())))
	}
}
