package fold_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/test/harness"
)

// prompt bounds every read of these tests: a scan that waits for a record
// read_committed never delivers fails here instead of hanging.
const prompt = 10 * time.Second

// newTopic creates a topic with parts partitions on a fresh broker; the
// options it returns produce to Record.Partition.
func newTopic(t *testing.T, parts int32) ([]kgo.Opt, string) {
	t.Helper()
	k := harness.NewKafka(t)
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), manualPartitioner()}
	createTopic(t, opts, "shared", parts)
	return opts, "shared"
}

func createTopic(t *testing.T, opts []kgo.Opt, topic string, parts int32) {
	t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), parts, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
}

// writer is one transactional producer (its own transactional id), as
// each connector sharing a topic is.
type writer struct {
	t     *testing.T
	cl    *kgo.Client
	topic string
}

func newWriter(t *testing.T, opts []kgo.Opt, topic, txnID string) *writer {
	t.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), kgo.TransactionalID(txnID), kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &writer{t: t, cl: cl, topic: topic}
}

func (w *writer) begin() *writer {
	w.t.Helper()
	if err := w.cl.BeginTransaction(); err != nil {
		w.t.Fatal(err)
	}
	return w
}

// put produces key=value to partition p and returns its offset.
func (w *writer) put(p int32, key string) int64 {
	w.t.Helper()
	r := &kgo.Record{Topic: w.topic, Partition: p, Key: []byte(key), Value: []byte("v-" + key)}
	if err := w.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
		w.t.Fatal(err)
	}
	return r.Offset
}

func (w *writer) end(commit bool) {
	w.t.Helper()
	if err := w.cl.EndTransaction(context.Background(), kgo.TransactionEndTry(commit)); err != nil {
		w.t.Fatal(err)
	}
}

// committed produces one committed transaction of keys to partition p.
func committed(t *testing.T, opts []kgo.Opt, topic string, p int32, keys ...string) {
	t.Helper()
	w := newWriter(t, opts, topic, "committer-"+keys[0]).begin()
	for _, k := range keys {
		w.put(p, k)
	}
	w.end(true)
}

// manualPartitioner routes by Record.Partition.
func manualPartitioner() kgo.Opt { return kgo.RecordPartitioner(kgo.ManualPartitioner()) }

// got is what a read delivered: partition/offset key, in delivery order.
type got []string

// collect returns a callback that records each record and checks that no
// control record is ever passed and offsets grow within a partition.
func collect(t *testing.T, into *got) func(*kgo.Record) error {
	last := map[int32]int64{}
	return func(r *kgo.Record) error {
		if r.Attrs.IsControl() {
			t.Errorf("control record at %d/%d passed to the callback", r.Partition, r.Offset)
		}
		if l, ok := last[r.Partition]; ok && r.Offset <= l {
			t.Errorf("partition %d: offset %d after %d", r.Partition, r.Offset, l)
		}
		last[r.Partition] = r.Offset
		*into = append(*into, fmt.Sprintf("%d:%s", r.Partition, r.Key))
		return nil
	}
}

// shortWait is the view wait of these tests: their open transactions stay
// open, and the view stops before them after this long.
var shortWait = fold.ViewWait{Timeout: 200 * time.Millisecond}

// read runs one read with the prompt bound and reports how long it took.
func read(t *testing.T, what string, fn func(ctx context.Context, cb func(*kgo.Record) error) error) got {
	t.Helper()
	ctx, cancel := context.WithTimeout(fold.WithViewWait(context.Background(), shortWait), prompt)
	defer cancel()
	var out got
	start := time.Now()
	if err := fn(ctx, collect(t, &out)); err != nil {
		t.Fatalf("%s: %v after %s", what, err, time.Since(start).Round(time.Millisecond))
	}
	return out
}

func want(t *testing.T, what string, g got, w ...string) {
	t.Helper()
	if w == nil {
		w = got{}
	}
	if g == nil {
		g = got{}
	}
	if !slices.Equal(g, got(w)) {
		t.Errorf("%s: got %q, want %q", what, g, w)
	}
}

// A scan that waited for the record at LSO-1 hung here: it is an aborted
// data record whose abort marker lies after another producer's open
// transaction, so read_committed never delivers it. Every read must still
// end, with exactly the committed records before the open transaction.
func TestScanEndsBeforeAnOpenTransactionAfterAnAbortedRecord(t *testing.T) {
	opts, topic := newTopic(t, 1)
	committed(t, opts, topic, 0, "c0") // c0@0, marker@1
	a := newWriter(t, opts, topic, "A").begin()
	aOff := a.put(0, "a") // @2
	b := newWriter(t, opts, topic, "B").begin()
	bOff := b.put(0, "b") // @3
	a.end(false)          // abort marker @4, after B's open transaction
	if aOff != 2 || bOff != 3 {
		t.Fatalf("setup: a@%d b@%d", aOff, bOff)
	}

	want(t, "Scan", read(t, "Scan", func(ctx context.Context, cb func(*kgo.Record) error) error {
		return fold.Scan(ctx, opts, topic, cb)
	}), "0:c0")
	for n, w := range map[int64][]string{-1: {"0:c0"}, 0: nil, 1: nil, 2: nil, 3: {"0:c0"}, 100: {"0:c0"}} {
		what := fmt.Sprintf("ScanTail(%d)", n)
		want(t, what, read(t, what, func(ctx context.Context, cb func(*kgo.Record) error) error {
			return fold.ScanTail(ctx, opts, topic, n, cb)
		}), w...)
	}
	for _, r := range []struct {
		from, to int64
		want     []string
	}{{0, 2, []string{"0:c0"}}, {2, 2, nil}, {1, 2, nil}, {0, 0, []string{"0:c0"}}} {
		what := fmt.Sprintf("ScanRange(%d, %d)", r.from, r.to)
		want(t, what, read(t, what, func(ctx context.Context, cb func(*kgo.Record) error) error {
			return fold.ScanRange(ctx, opts, topic, 0, r.from, r.to, cb)
		}), r.want...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), prompt)
	defer cancel()
	ks, st, err := fold.Topic{Opts: opts, Topic: topic, Wait: shortWait}.Live(ctx)
	if err != nil {
		t.Fatalf("Live: %v", err)
	}
	if ks.Len() != 1 || st.Records != 1 || st.End[0] != 3 {
		t.Errorf("Live: %d keys, %+v; want 1 key, 1 record, end 3", ks.Len(), st)
	}

	// Once B commits, the same reads go on to its record.
	b.end(true)
	want(t, "Scan after B commits", read(t, "Scan", func(ctx context.Context, cb func(*kgo.Record) error) error {
		return fold.Scan(ctx, opts, topic, cb)
	}), "0:c0", "0:b")
}

// The stable end right after a commit marker, right after an abort marker,
// after a committed record followed by an aborted one, and empty ranges.
func TestScanStableEnds(t *testing.T) {
	cases := []struct {
		name  string
		setup func(t *testing.T, opts []kgo.Opt, topic string)
		want  []string
	}{
		{"empty topic", func(*testing.T, []kgo.Opt, string) {}, nil},
		{"only an open transaction", func(t *testing.T, opts []kgo.Opt, topic string) {
			newWriter(t, opts, topic, "B").begin().put(0, "b")
		}, nil},
		{"after a commit marker", func(t *testing.T, opts []kgo.Opt, topic string) {
			committed(t, opts, topic, 0, "c0", "c1")
			newWriter(t, opts, topic, "B").begin().put(0, "b")
		}, []string{"0:c0", "0:c1"}},
		{"after an abort marker", func(t *testing.T, opts []kgo.Opt, topic string) {
			committed(t, opts, topic, 0, "c0")
			a := newWriter(t, opts, topic, "A").begin()
			a.put(0, "a")
			a.end(false)
			newWriter(t, opts, topic, "B").begin().put(0, "b")
		}, []string{"0:c0"}},
		{"a committed record followed by an aborted one", func(t *testing.T, opts []kgo.Opt, topic string) {
			committed(t, opts, topic, 0, "c0")
			a := newWriter(t, opts, topic, "A").begin()
			a.put(0, "a")
			a.end(false)
		}, []string{"0:c0"}},
		{"a committed record followed by an aborted one whose marker is after an open transaction", func(t *testing.T, opts []kgo.Opt, topic string) {
			committed(t, opts, topic, 0, "c0")
			a := newWriter(t, opts, topic, "A").begin()
			a.put(0, "a")
			a.put(0, "a2")
			newWriter(t, opts, topic, "B").begin().put(0, "b")
			a.end(false)
		}, []string{"0:c0"}},
		{"aborted transactions only", func(t *testing.T, opts []kgo.Opt, topic string) {
			a := newWriter(t, opts, topic, "A").begin()
			a.put(0, "a")
			b := newWriter(t, opts, topic, "B").begin()
			b.put(0, "b")
			a.end(false)
			b.end(false)
		}, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			opts, topic := newTopic(t, 1)
			c.setup(t, opts, topic)
			want(t, "Scan", read(t, "Scan", func(ctx context.Context, cb func(*kgo.Record) error) error {
				return fold.Scan(ctx, opts, topic, cb)
			}), c.want...)
			want(t, "ScanTail(1000)", read(t, "ScanTail", func(ctx context.Context, cb func(*kgo.Record) error) error {
				return fold.ScanTail(ctx, opts, topic, 1000, cb)
			}), c.want...)
			want(t, "ScanRange(5, 4)", read(t, "ScanRange", func(ctx context.Context, cb func(*kgo.Record) error) error {
				return fold.ScanRange(ctx, opts, topic, 0, 5, 4, cb)
			}))
		})
	}
}

// Several partitions: each is read to its own stable end; Pinned.Read of
// one partition reads only that one; ErrStop ends a read early.
func TestScanPartitions(t *testing.T) {
	opts, topic := newTopic(t, 3)
	committed(t, opts, topic, 0, "p0a")
	a := newWriter(t, opts, topic, "A").begin()
	a.put(0, "aborted")
	b := newWriter(t, opts, topic, "B").begin()
	b.put(0, "open")
	a.end(false)
	committed(t, opts, topic, 1, "p1a", "p1b")
	committed(t, opts, topic, 2, "p2a")

	g := read(t, "Scan", func(ctx context.Context, cb func(*kgo.Record) error) error {
		return fold.Scan(ctx, opts, topic, cb)
	})
	slices.Sort(g)
	want(t, "Scan", g, "0:p0a", "1:p1a", "1:p1b", "2:p2a")

	ctx, cancel := context.WithTimeout(context.Background(), prompt)
	defer cancel()
	pin, err := fold.Topic{Opts: opts, Topic: topic, Wait: shortWait}.Pin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := pin.Read(ctx, []int32{1}, func(k, _, _ []byte) error { keys = append(keys, string(k)); return nil }); err != nil {
		t.Fatal(err)
	}
	want(t, "Read([1])", keys, "p1a", "p1b")
	keys = nil
	if err := pin.Read(ctx, []int32{0}, func(k, _, _ []byte) error { keys = append(keys, string(k)); return nil }); err != nil {
		t.Fatal(err)
	}
	want(t, "Read([0])", keys, "p0a")

	n := 0
	if err := fold.Scan(fold.WithViewWait(ctx, shortWait), opts, topic, func(*kgo.Record) error { n++; return fold.ErrStop }); err != nil || n != 1 {
		t.Errorf("ErrStop: %v after %d records", err, n)
	}
	if err := fold.Scan(ctx, opts, "no-such-topic", func(*kgo.Record) error { return nil }); !errors.Is(err, fold.ErrNoTopic) {
		t.Errorf("missing topic: %v", err)
	}
}

// A fetch that fails with a retriable error is retried (after a fresh
// look at the leaders) and the read completes; a read that cannot
// progress (a range beyond the stable end) waits without spinning and
// ends with its context.
func TestScanRetriesAndDoesNotSpin(t *testing.T) {
	k := harness.NewKafka(t)
	k.RequireKfake(t, "a control hook on Fetch")
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), manualPartitioner()}
	const topic = "t"
	createTopic(t, opts, topic, 1)
	committed(t, opts, topic, 0, "c0", "c1", "c2")

	var fetches atomic.Int64
	failing := atomic.Int64{}
	failing.Store(3)
	k.Cluster.ControlKey(int16(kmsg.Fetch), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		k.Cluster.KeepControl()
		fetches.Add(1)
		if failing.Add(-1) < 0 {
			return nil, nil, false
		}
		req := kreq.(*kmsg.FetchRequest)
		resp := req.ResponseKind().(*kmsg.FetchResponse)
		for _, rt := range req.Topics {
			st := kmsg.NewFetchResponseTopic()
			st.Topic, st.TopicID = rt.Topic, rt.TopicID
			for _, rp := range rt.Partitions {
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.Partition = rp.Partition
				sp.ErrorCode = kerr.NotLeaderForPartition.Code
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		return resp, nil, true
	})
	want(t, "Scan through 3 failed fetches", read(t, "Scan", func(ctx context.Context, cb func(*kgo.Record) error) error {
		return fold.Scan(ctx, opts, topic, cb)
	}), "0:c0", "0:c1", "0:c2")
	if n := fetches.Load(); n < 4 {
		t.Errorf("%d fetches; want the 3 failed ones retried", n)
	}

	// Offsets 0..3 exist (3 records and a marker); a range up to 9 never
	// becomes stable.
	fetches.Store(0)
	const wait = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	var g got
	err := fold.ScanRange(ctx, opts, topic, 0, 0, 9, collect(t, &g))
	took := time.Since(start)
	if !errors.Is(err, context.DeadlineExceeded) || took > wait+time.Second {
		t.Errorf("a range beyond the stable end: %v after %s; want the context's deadline", err, took.Round(time.Millisecond))
	}
	want(t, "records before the stall", g, "0:c0", "0:c1", "0:c2")
	if n := fetches.Load(); n > 12 {
		t.Errorf("%d fetches in %s without progress: the read spins", n, wait)
	}
	t.Logf("%d fetches in %s without progress", fetches.Load(), took.Round(time.Millisecond))

	if err := fold.ScanRange(context.Background(), opts, "no-such-topic", 0, 0, 5, collect(t, &g)); !errors.Is(err, fold.ErrNoTopic) {
		t.Errorf("ScanRange of a missing topic: %v", err)
	}
}

// An aborted transaction inside a fetch response that is cut short by its
// size limit is still skipped. (kfake leaves the aborted transactions out
// of a response that fills the request-wide byte limit, so a scan whose
// request-wide limit equals its partition limit delivered aborted records
// as committed ones; the chaos suite caught it as duplicates.)
func TestScanSkipsAbortedRecordsInAFullResponse(t *testing.T) {
	opts, topic := newTopic(t, 1)
	w := newWriter(t, opts, topic, "big")
	value := make([]byte, 4<<10) // incompressible, so the response fills up
	if _, err := rand.Read(value); err != nil {
		t.Fatal(err)
	}
	put := func(key string) {
		t.Helper()
		r := &kgo.Record{Topic: topic, Partition: 0, Key: []byte(key), Value: value}
		if err := w.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	var wantKeys got
	w.begin()
	for i := range 5 {
		put(fmt.Sprint("a", i))
		wantKeys = append(wantKeys, fmt.Sprint("0:a", i))
	}
	w.end(true)
	w.begin()
	for i := range 5 {
		put(fmt.Sprint("aborted", i))
	}
	w.end(false)
	// Far more than one response holds, so the first one is cut short
	// after the aborted transaction.
	w.begin()
	for i := range 600 {
		put(fmt.Sprint("c", i))
		wantKeys = append(wantKeys, fmt.Sprint("0:c", i))
	}
	w.end(true)

	g := read(t, "Scan", func(ctx context.Context, cb func(*kgo.Record) error) error {
		return fold.Scan(ctx, opts, topic, cb)
	})
	want(t, "Scan", g, wantKeys...)
}
