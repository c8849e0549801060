package producer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/test/harness"
)

// murmur2 is Kafka's Java client hash (org.apache.kafka.common.utils.Utils
// .murmur2), written out from the specification so the test does not trust
// the code under test; the default partitioner takes
// (murmur2(key) & 0x7fffffff) % partitions.
func murmur2(data []byte) int32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	switch rest := n % 4; rest {
	case 3:
		h ^= uint32(data[n-3+2]) << 16
		fallthrough
	case 2:
		h ^= uint32(data[n-rest+1]) << 8
		fallthrough
	case 1:
		h ^= uint32(data[n-rest])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return int32(h)
}

func TestMurmur2KnownValues(t *testing.T) {
	// Values from Kafka's UtilsTest.testMurmur2.
	for in, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := murmur2([]byte(in)); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", in, got, want)
		}
	}
}

func newWriter(t *testing.T, parts int32) ([]kgo.Opt, *producer.Writer) {
	t.Helper()
	k := harness.NewKafka(t)
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: "data", Partitions: parts, ReplicationFactor: -1, Offsets: "off"}); err != nil {
		t.Fatal(err)
	}
	w, err := producer.New(context.Background(), producer.Config{Name: "c", Topic: "data", OffsetsTopic: "off", Opts: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return opts, w
}

// Every key lands where a Java client would put it.
func TestPartitioningIsJavaCompatible(t *testing.T) {
	const parts = 7
	opts, w := newWriter(t, parts)
	ctx := context.Background()
	if err := w.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	keys := []string{"", "0", "1", "42", "order-7", "3f0c2a4e-8d1b-4c7e-9a55-0a8f6b2c1d9e", "ünïcödé", strings.Repeat("k", 100)}
	for i := range 500 {
		keys = append(keys, fmt.Sprint(i*7919))
	}
	for _, k := range keys {
		if err := w.Publish(ctx, &connector.Row{ID: k, UpdatedAt: time.Unix(0, 0), Value: []byte(`{}`)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Commit(ctx, &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return []byte(`{}`), nil }}); err != nil {
		t.Fatal(err)
	}
	n := 0
	err := fold.Scan(ctx, opts, "data", func(r *kgo.Record) error {
		n++
		want := (murmur2(r.Key) & 0x7fffffff) % parts
		if r.Partition != want {
			t.Errorf("key %q in partition %d; the Java client's default partitioner says %d", r.Key, r.Partition, want)
		}
		return nil
	})
	if err != nil || n != len(keys) {
		t.Fatalf("scan: %v, %d records of %d", err, n, len(keys))
	}
}

// An aborted transaction leaves nothing visible to read_committed.
func TestAbortLeavesNothing(t *testing.T) {
	opts, w := newWriter(t, 3)
	ctx := context.Background()
	if err := w.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		_ = w.Publish(ctx, &connector.Row{ID: fmt.Sprint(i), UpdatedAt: time.Unix(0, 0), Value: []byte(`{}`)})
	}
	if err := w.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	st, err := fold.Map(ctx, opts, "data")
	if err != nil || st.Records != 0 {
		t.Fatalf("after abort: %v, %d records visible", err, st.Records)
	}
}

func TestEnsureTopicsRefusesWhatCannotRebuildState(t *testing.T) {
	k := harness.NewKafka(t)
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 3, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("delete")}, "plain"); err != nil {
		t.Fatal(err)
	}
	if _, err := adm.CreateTopic(ctx, 2, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact")}, "off2"); err != nil {
		t.Fatal(err)
	}
	_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: "plain", Partitions: 3, ReplicationFactor: -1, Offsets: "off"})
	if !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), "allow_non_compacted") {
		t.Errorf("non-compacted data topic: %v", err)
	}
	if _, err := producer.EnsureTopics(ctx, cl, producer.Topics{Data: "plain", Partitions: 3, ReplicationFactor: -1, AllowNonCompacted: true, Offsets: "off"}); err != nil {
		t.Errorf("allowed explicitly: %v", err)
	}
	// compact,delete also expires records: a data topic so is refused
	// unless allowed, an offsets topic so always (its checkpoints expire).
	for _, name := range []string{"cd-data", "cd-off"} {
		if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact,delete")}, name); err != nil {
			t.Fatal(err)
		}
	}
	_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: "cd-data", Partitions: 1, ReplicationFactor: -1, Offsets: "off"})
	if !errors.Is(err, connector.ErrPermanent) || !errors.Is(err, producer.ErrTopicConfig) || !strings.Contains(err.Error(), "allow_non_compacted") {
		t.Errorf("compact,delete data topic: %v", err)
	}
	_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: "d", Partitions: 3, ReplicationFactor: -1, Offsets: "cd-off"})
	if !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), "cleanup.policy=compact,delete") {
		t.Errorf("compact,delete offsets topic: %v", err)
	}
	_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: "d", Partitions: 3, ReplicationFactor: -1, Offsets: "off2"})
	if err == nil || !strings.Contains(err.Error(), "exactly 1") {
		t.Errorf("offsets topic with 2 partitions: %v", err)
	}
	lines, err := producer.EnsureTopics(ctx, cl, producer.Topics{Data: "fresh", Partitions: 4, ReplicationFactor: -1, Offsets: "off3", Ledger: "led"})
	if err != nil || len(lines) != 3 {
		t.Fatalf("create: %v %v", lines, err)
	}
	cfgs, err := adm.DescribeTopicConfigs(ctx, "fresh", "off3", "led")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"fresh": "compact", "off3": "compact", "led": "delete"}
	for _, rc := range cfgs {
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && c.MaybeValue() != want[rc.Name] {
				t.Errorf("%s: cleanup.policy=%s, want %s", rc.Name, c.MaybeValue(), want[rc.Name])
			}
		}
	}
	if !strings.Contains(lines[2], "led: created") || !strings.Contains(lines[2], "cleanup.policy=delete") {
		t.Errorf("the ledger's line does not say what was created: %q", lines[2])
	}
}

// TestEnsureTopicsRefusesASmallOffsetsTopic: an offsets topic created
// beforehand (as the ACL guide suggests) with a max.message.bytes below
// what tidemark writes there would fail every commit with MessageTooLarge;
// it is refused up front, naming the setting and the value to set.
func TestEnsureTopicsRefusesASmallOffsetsTopic(t *testing.T) {
	k := harness.NewKafka(t)
	ctx := context.Background()
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.Brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	if _, err := adm.CreateTopic(ctx, 1, -1, map[string]*string{"cleanup.policy": kadm.StringPtr("compact"), "max.message.bytes": kadm.StringPtr("100000")}, "small-off"); err != nil {
		t.Fatal(err)
	}
	_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: "d", Partitions: 3, ReplicationFactor: -1, Offsets: "small-off"})
	if !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), "max.message.bytes") || !strings.Contains(err.Error(), "1000012") {
		t.Errorf("offsets topic with max.message.bytes 100000: %v", err)
	}
}

// TestRecoverClassification: what a recovery's re-initialisation answers.
// kgo keeps a non-retriable broker answer to EndTxn for good, and every
// later ProducerID returns it: a recovery that takes it for transient
// retries forever (TestEngineZombieIsFenced hung so, once in about twenty
// runs under load, when the embedded broker answered the fenced session's
// commit INVALID_TXN_STATE rather than PRODUCER_FENCED).
func TestRecoverClassification(t *testing.T) {
	for _, c := range []struct {
		err               error
		fenced, permanent bool
	}{
		{kerr.InvalidProducerEpoch, true, false},
		{kerr.ProducerFenced, true, false},
		{kerr.InvalidTxnState, true, false},
		{kerr.InvalidProducerIDMapping, true, false},
		{kerr.UnsupportedVersion, false, true},
		{kerr.CoordinatorNotAvailable, false, false},
		{kerr.UnknownServerError, false, false},
		{errors.New("dial tcp: connection refused"), false, false},
	} {
		err := producer.ClassifyRecover(fmt.Errorf("re-initialise: %w", c.err))
		if errors.Is(err, connector.ErrFenced) != c.fenced || errors.Is(err, connector.ErrPermanent) != c.permanent {
			t.Errorf("%v: classified %v; want fenced %v, permanent %v", c.err, err, c.fenced, c.permanent)
		}
	}
}

// Keys survive the writer's key slabs (a key longer than a slab, keys that
// span slabs; the empty id is the empty key, never a null key), and a
// record's timestamp is when it was produced, also after a pause inside its
// transaction (the engine fetches the next page with the transaction open).
func TestRecordKeysAndTimestamps(t *testing.T) {
	opts, w := newWriter(t, 3)
	ctx := context.Background()
	commit := func() {
		t.Helper()
		if err := w.Commit(ctx, &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return []byte(`{}`), nil }}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]string{}
	publish := func(id string) {
		t.Helper()
		v := fmt.Sprintf(`{"id":%q}`, id)
		want[id] = v
		if err := w.Publish(ctx, &connector.Row{ID: id, UpdatedAt: time.Unix(0, 0), Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		publish(fmt.Sprint("first-", i))
	}
	commit()
	time.Sleep(50 * time.Millisecond)
	second := time.Now().Truncate(time.Millisecond) // Kafka timestamps are milliseconds
	if err := w.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 3000 {
		id := fmt.Sprint("second-", i)
		switch i {
		case 1000:
			id += strings.Repeat("x", 40_000) // longer than a key slab
		case 2000:
			id = "" // the empty key is a key
		}
		publish(id)
	}
	time.Sleep(50 * time.Millisecond)
	third := time.Now().Truncate(time.Millisecond)
	for i := range 10 {
		publish(fmt.Sprint("third-", i))
	}
	commit()
	end := time.Now()
	got := map[string]string{}
	err := fold.Scan(ctx, opts, "data", func(r *kgo.Record) error {
		k := string(r.Key)
		if r.Key == nil {
			t.Errorf("a record has a null key (value %q)", r.Value)
		}
		got[k] = string(r.Value)
		switch ts := r.Timestamp; {
		case strings.HasPrefix(k, "third-"):
			if ts.Before(third) || ts.After(end) {
				t.Errorf("record %q, produced after a pause in its transaction, has timestamp %v, before the pause ended (%v)", k, ts, third)
			}
		case strings.HasPrefix(k, "second-") || k == "":
			if ts.Before(second) || ts.After(end) {
				t.Errorf("record %.20q of the second transaction has timestamp %v, outside the transaction (%v to %v)", k, ts, second, end)
			}
		case !ts.Before(second):
			t.Errorf("record %q of the first transaction has timestamp %v, after the second began (%v)", k, ts, second)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(want) {
		t.Fatalf("%d keys read back, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("key %.20q: value %q, want %q", k, got[k], v)
		}
	}
}

// A session that a newer one fenced cannot end a transaction, or commit
// one after that, whatever it tries: the broker answers PRODUCER_FENCED
// (docs/design.md, "One writer"). The in-process broker with Kafka's
// transaction protocol version 2 answered the old session's abort with
// success and the new session's epoch, after which both sessions wrote at
// one producer id and epoch: the older one could commit, and the newer one
// failed with OUT_OF_ORDER_SEQUENCE_NUMBER.
func TestAFencedSessionCannotEndATransaction(t *testing.T) {
	opts, old := newWriter(t, 3)
	ctx := context.Background()
	row := func(id string) *connector.Row {
		return &connector.Row{ID: id, UpdatedAt: time.Unix(0, 0), Value: []byte(`{"id":"` + id + `"}`)}
	}
	commit := &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return []byte(`{}`), nil }}
	if err := old.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := old.Publish(ctx, row("old-1")); err != nil {
		t.Fatal(err)
	}
	// Until its record reaches the broker, the old session's transaction
	// is only in its client, which ends it without asking the broker.
	adm := kadm.NewClient(old.Client())
	for deadline := time.Now().Add(10 * time.Second); ; {
		d, err := adm.DescribeTransactions(ctx, producer.TransactionalID("c"))
		if err == nil && d["tidemark-c"].State == "Ongoing" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the old session's transaction is not open on the broker: %v %+v", err, d)
		}
		time.Sleep(5 * time.Millisecond)
	}

	// A second instance starts: its session fences the old one.
	cur, err := producer.New(ctx, producer.Config{Name: "c", Topic: "data", OffsetsTopic: "off", Opts: opts})
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()

	if err := old.Abort(ctx); !errors.Is(err, connector.ErrFenced) {
		t.Errorf("the fenced session's abort: %v; want it fenced", err)
	}
	if err := old.Recover(ctx); !errors.Is(err, connector.ErrFenced) {
		t.Errorf("the fenced session's recovery: %v; want it fenced", err)
	}
	// The old session tries once more (a misbehaving caller), while the new
	// one commits, with state records in the offsets topic.
	if err := old.Begin(ctx); err == nil {
		_ = old.Publish(ctx, row("old-2"))
		if err := old.Commit(ctx, &connector.Commit{State: []connector.StateRecord{{Key: "s0", Value: []byte("o")}}, Checkpoint: commit.Checkpoint}); err == nil {
			t.Error("the fenced session committed a transaction")
		}
	}
	if err := cur.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := cur.Publish(ctx, row("new-1")); err != nil {
		t.Fatal(err)
	}
	state := []connector.StateRecord{{Key: "s0", Value: []byte("n")}, {Key: "s1", Value: []byte("n")}}
	if err := cur.Commit(ctx, &connector.Commit{State: state, Checkpoint: commit.Checkpoint}); err != nil {
		t.Fatalf("the current session's commit: %v", err)
	}
	st, err := fold.Map(ctx, opts, "data")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := st.Live["new-1"]; !ok || len(st.Live) != 1 {
		t.Errorf("read_committed holds %d keys %v; want only new-1", len(st.Live), st.Live)
	}
}

// TestTransactionTimeoutAboveTheBrokersMaximum: the broker refuses a
// transaction timeout above its transaction.max.timeout.ms on every
// attempt: a configuration error naming the key, not a transient failure
// waited on for ever at start-up.
func TestTransactionTimeoutAboveTheBrokersMaximum(t *testing.T) {
	err := producer.ClassifyRecover(kerr.InvalidTransactionTimeout)
	if !errors.Is(err, producer.ErrSetting) || !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), "kafka.transaction_timeout") {
		t.Errorf("INVALID_TRANSACTION_TIMEOUT: %v; want a permanent setting error naming kafka.transaction_timeout", err)
	}
}
