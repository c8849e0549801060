package fold_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/test/harness"
)

// viewTopic is a topic "v" with 10 records in partition 0 and 4 in
// partition 1, written without transactions, on a kfake cluster.
func viewTopic(t *testing.T) (*harness.Kafka, []kgo.Opt) {
	t.Helper()
	k := harness.NewKafka(t)
	k.RequireKfake(t, "a control hook on ListOffsets")
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), manualPartitioner()}
	createTopic(t, opts, "v", 2)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for p, n := range []int{10, 4} {
		for i := range n {
			r := &kgo.Record{Topic: "v", Partition: int32(p), Key: []byte(fmt.Sprintf("p%d-%d", p, i)), Value: []byte("v")}
			if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
	}
	return k, opts
}

// lagLSO makes the broker answer a read_committed ListOffsets (latest) of
// topic "v" with lso while lagging() holds: what Apache Kafka answers
// after EndTxn has returned and before the transaction's markers are
// written. It returns how many such requests were answered.
func lagLSO(k *harness.Kafka, lso map[int32]int64, lagging func() bool) *atomic.Int64 {
	var calls atomic.Int64
	c := k.Cluster
	c.ControlKey(int16(kmsg.ListOffsets), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		req := kreq.(*kmsg.ListOffsetsRequest)
		if req.IsolationLevel != 1 || !lagging() {
			return nil, nil, false
		}
		resp := req.ResponseKind().(*kmsg.ListOffsetsResponse)
		for _, rt := range req.Topics {
			if rt.Topic != "v" {
				return nil, nil, false
			}
			st := kmsg.NewListOffsetsResponseTopic()
			st.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				if rp.Timestamp != -1 {
					return nil, nil, false
				}
				sp := kmsg.NewListOffsetsResponseTopicPartition()
				sp.Partition, sp.Offset = rp.Partition, lso[rp.Partition]
				st.Partitions = append(st.Partitions, sp)
			}
			resp.Topics = append(resp.Topics, st)
		}
		calls.Add(1)
		return resp, nil, true
	})
	return &calls
}

// for1s is a lag that ends a second after it is armed.
func for1s() func() bool {
	until := time.Now().Add(time.Second)
	return func() bool { return time.Now().Before(until) }
}

// reports collects OpenTxn reports.
type reports struct {
	mu  sync.Mutex
	all []fold.OpenTxn
}

func (r *reports) add(o fold.OpenTxn) { r.mu.Lock(); r.all = append(r.all, o); r.mu.Unlock() }

func (r *reports) take() []fold.OpenTxn {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.all
	r.all = nil
	return out
}

func readPin(t *testing.T, pin interface {
	Read(context.Context, []int32, func(k, v, at []byte) error) error
}) int {
	t.Helper()
	n := 0
	if err := pin.Read(context.Background(), nil, func(_, _, _ []byte) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	return n
}

// The last stable offset lags the high watermark for a second, then
// catches up: every way of fixing a view waits for it and reads it all.
func TestViewWaitsForMarkersAfterCommit(t *testing.T) {
	k, opts := viewTopic(t)
	full := map[int32]int64{0: 10, 1: 4}
	stale := map[int32]int64{0: 5, 1: 4}
	var rep reports

	lag := for1s()
	calls := lagLSO(k, stale, func() bool { return lag() })
	start := time.Now()
	pin, err := fold.Topic{Opts: opts, Topic: "v", Wait: fold.ViewWait{Timeout: 5 * time.Second, Report: rep.add}}.Pin(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if got := pin.End(); !maps.Equal(got, full) || took < 900*time.Millisecond {
		t.Errorf("Pin: end %v after %s; want %v after the lag (1s)", got, took.Round(time.Millisecond), full)
	}
	if o := pin.(*fold.Pinned).Open(); len(o) != 0 || len(rep.take()) != 0 {
		t.Errorf("Pin: open %v; want none", o)
	}
	if n := readPin(t, pin); n != 14 {
		t.Errorf("Read: %d records, want 14", n)
	}
	if n := calls.Load(); n < 3 || n > 40 {
		t.Errorf("%d lagging ListOffsets answered in a second; want a poll with backoff", n)
	}
	t.Logf("waited %s, %d lagging answers", took.Round(time.Millisecond), calls.Load())

	// Scan and Live, with the default wait.
	lag = for1s()
	var g got
	if err := fold.Scan(context.Background(), opts, "v", collect(t, &g)); err != nil || len(g) != 14 {
		t.Errorf("Scan: %d records, %v; want 14", len(g), err)
	}
	lag = for1s()
	_, st, err := fold.Topic{Opts: opts, Topic: "v"}.Live(context.Background())
	if err != nil || st.Records != 14 || !maps.Equal(st.End, full) {
		t.Errorf("Live: %+v, %v; want 14 records up to %v", st, err, full)
	}
}

// The last stable offset never catches up: the view stops at it after the
// wait, and says so.
func TestViewStopsBeforeATransactionThatStaysOpen(t *testing.T) {
	k, opts := viewTopic(t)
	stale := map[int32]int64{0: 5, 1: 4}
	lagLSO(k, stale, func() bool { return true })
	wantOpen := []fold.OpenTxn{{Topic: "v", Partition: 0, Offset: 5, HighWatermark: 10}}
	var rep reports

	start := time.Now()
	pin, err := fold.Topic{Opts: opts, Topic: "v", Wait: fold.ViewWait{Timeout: 500 * time.Millisecond, Report: rep.add}}.Pin(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if got := pin.End(); !maps.Equal(got, stale) || took < 500*time.Millisecond || took > 2*time.Second {
		t.Errorf("Pin: end %v after %s; want %v after the 500ms wait", got, took.Round(time.Millisecond), stale)
	}
	if o := pin.(*fold.Pinned).Open(); !slices.Equal(o, wantOpen) {
		t.Errorf("Open: %v; want %v", o, wantOpen)
	}
	if r := rep.take(); !slices.Equal(r, wantOpen) {
		t.Errorf("reported %v; want %v", r, wantOpen)
	} else if s := r[0].String(); !strings.Contains(s, "partition 0: a transaction is still open at offset 5; the view stops before it") {
		t.Errorf("report reads %q", s)
	}
	if n := readPin(t, pin); n != 9 {
		t.Errorf("Read: %d records, want 9 (5 of partition 0, 4 of partition 1)", n)
	}

	// Scan and ScanTail take the wait from the context.
	ctx := fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: 300 * time.Millisecond, Report: rep.add})
	var g got
	start = time.Now()
	if err := fold.Scan(ctx, opts, "v", collect(t, &g)); err != nil || len(g) != 9 || time.Since(start) < 300*time.Millisecond {
		t.Errorf("Scan: %d records, %v after %s; want 9 after the wait", len(g), err, time.Since(start).Round(time.Millisecond))
	}
	if r := rep.take(); !slices.Equal(r, wantOpen) {
		t.Errorf("Scan reported %v; want %v", r, wantOpen)
	}
	// A Topic's own wait goes first; a negative one does not wait (here
	// against a context that would wait 3s: a margin wide enough for a
	// loaded machine).
	start = time.Now()
	long := fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: 3 * time.Second, Report: rep.add})
	_, st, err := fold.Topic{Opts: opts, Topic: "v", Wait: fold.ViewWait{Timeout: -1}}.Live(long)
	if err != nil || st.Records != 9 || time.Since(start) > 1500*time.Millisecond {
		t.Errorf("Live without a wait: %+v, %v after %s", st, err, time.Since(start).Round(time.Millisecond))
	}
	if r := rep.take(); !slices.Equal(r, wantOpen) {
		t.Errorf("Live reported %v; want %v", r, wantOpen)
	}

	// The wait honours its context.
	cctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start = time.Now()
	if _, err := (fold.Topic{Opts: opts, Topic: "v"}).Pin(cctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > time.Second {
		t.Errorf("Pin with a 200ms context: %v after %s", err, time.Since(start).Round(time.Millisecond))
	}
}

// A real open transaction (no control hook): a view fixed while it is
// open waits for it and includes it once it commits; one that stays open
// is reported. Offsets: c0@0, its marker@1, b@2.
func TestViewAndARealOpenTransaction(t *testing.T) {
	opts, topic := newTopic(t, 1)
	committed(t, opts, topic, 0, "c0")
	b := newWriter(t, opts, topic, "B").begin()
	b.put(0, "b")

	var rep reports
	pin, err := fold.Topic{Opts: opts, Topic: topic, Wait: fold.ViewWait{Timeout: 300 * time.Millisecond, Report: rep.add}}.Pin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	wantOpen := []fold.OpenTxn{{Topic: topic, Partition: 0, Offset: 2, HighWatermark: 3}}
	if o := pin.(*fold.Pinned).Open(); !slices.Equal(o, wantOpen) || pin.End()[0] != 2 || !slices.Equal(rep.take(), wantOpen) {
		t.Errorf("open for good: end %v, open %v; want end 2, open %v", pin.End(), o, wantOpen)
	}

	go func() {
		time.Sleep(500 * time.Millisecond)
		b.end(true) // marker@3
	}()
	start := time.Now()
	pin, err = fold.Topic{Opts: opts, Topic: topic, Wait: fold.ViewWait{Timeout: 5 * time.Second, Report: rep.add}}.Pin(context.Background())
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if o := pin.(*fold.Pinned).Open(); len(o) != 0 || pin.End()[0] != 4 || took < 400*time.Millisecond {
		t.Errorf("committed during the wait: end %v, open %v after %s; want end 4, none open", pin.End(), o, took.Round(time.Millisecond))
	}
	if n := readPin(t, pin); n != 2 {
		t.Errorf("Read: %d records, want c0 and b", n)
	}
}

// TestPinnedReadsAgreeOrFail: the comparisons read a pinned partition more
// than once; when compaction removes records between two reads, the
// second read fails, naming the partition, instead of disagreeing with the
// first unnoticed.
func TestPinnedReadsAgreeOrFail(t *testing.T) {
	k := harness.NewKafka(t)
	k.RequireKfake(t, "Cluster.Compact")
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...), manualPartitioner()}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	compact := "compact"
	if _, err := kadm.NewClient(cl).CreateTopic(context.Background(), 1, 1, map[string]*string{"cleanup.policy": &compact}, "c"); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "a", "a", "b"} {
		if err := cl.ProduceSync(context.Background(), &kgo.Record{Topic: "c", Key: []byte(key), Value: []byte("v")}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	// Verify's counts (duplicates, repeats) need every read to see the same
	// records; a sweep's fold of live keys and last values does not, since
	// compaction keeps the last record of every key, and must not fail
	// because the cleaner ran during a long comparison.
	strict, err := fold.Topic{Opts: opts, Topic: "c", SameRecords: true}.Pin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	loose, err := fold.Topic{Opts: opts, Topic: "c"}.Pin(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	count := func(pin connector.PinnedTopic) (int, error) {
		n := 0
		err := pin.Read(context.Background(), nil, func(_, _, _ []byte) error { n++; return nil })
		return n, err
	}
	for range 2 {
		for _, pin := range []connector.PinnedTopic{strict, loose} {
			if n, err := count(pin); n != 4 || err != nil {
				t.Fatalf("read before compaction: %d records, %v", n, err)
			}
		}
	}
	k.Cluster.Compact()
	n, err := count(strict)
	if err == nil || !strings.Contains(err.Error(), "partition 0 of c gave 4 records, then") {
		t.Fatalf("read after compaction: %d records, error %v; want the partition named", n, err)
	}
	if n, err := count(loose); err != nil || n >= 4 {
		t.Fatalf("a read without SameRecords after compaction: %d records, %v; want fewer records and no error", n, err)
	}
}
