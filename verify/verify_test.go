package verify_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
	"github.com/tidemark/tidemark/verify"
)

// rows is a source of live rows.
type rows map[string]string

func (r rows) ScanLive(_ context.Context, fn func(*connector.Row) error) (time.Time, error) {
	for k, v := range r {
		if err := fn(&connector.Row{ID: k, Value: []byte(v)}); err != nil {
			return time.Time{}, err
		}
	}
	return time.Now(), nil
}

// topic writes recs, each to the partition it names, to a fresh
// two-partition data topic and returns it.
func topic(t *testing.T, recs ...*kgo.Record) fold.Topic {
	t.Helper()
	k := harness.NewKafka(t)
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	cl, err := kgo.NewClient(append(opts, kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	name := "data-" + strings.ToLower(strings.ReplaceAll(t.Name(), "/", "-"))
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: name, Partitions: 2, ReplicationFactor: -1, Offsets: name + "-offsets"}); err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		r.Topic = name
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	return fold.Topic{Opts: opts, Topic: name}
}

// home is the partition of a two-partition topic that the producer's
// partitioner gives key.
func home(key string) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic("").Partition(&kgo.Record{Key: []byte(key)}, 2))
}

// at is the updated_at header of a record of version ts.
func at(ts string) []kgo.RecordHeader {
	return []kgo.RecordHeader{{Key: schemas.HeaderUpdatedAt, Value: []byte(ts)}}
}

// TestVerifyTombstoneTwice: a delete published twice is a row version
// published twice, as a value is; two deletes of two versions (an insert
// between them that no pass saw) are not.
func TestVerifyTombstoneTwice(t *testing.T) {
	p, m := home("k"), home("m")
	tp := topic(t,
		&kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`), Partition: p, Headers: at("2026-01-01T00:00:01.000000Z")},
		&kgo.Record{Key: []byte("k"), Partition: p, Headers: at("2026-01-01T00:00:02.000000Z")},
		&kgo.Record{Key: []byte("k"), Partition: p, Headers: at("2026-01-01T00:00:02.000000Z")},
		&kgo.Record{Key: []byte("m"), Partition: m, Headers: at("2026-01-01T00:00:01.000000Z")},
		&kgo.Record{Key: []byte("m"), Partition: m, Headers: at("2026-01-01T00:00:03.000000Z")},
	)
	for _, budget := range []int{0, -1} { // in memory, by buckets
		rep, err := verify.Options{MaxKeysInMemory: budget}.Compare(context.Background(), rows{}, tp, "t")
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() || rep.Duplicates != 1 {
			t.Errorf("budget %d: a tombstone published twice: OK %v, %d duplicates\n%s", budget, rep.OK(), rep.Duplicates, rep.Text())
		}
	}
}

// TestVerifyKeyOutsideItsPartition: a record in a partition its key does
// not hash to (the partition count changed, or another producer wrote it)
// can leave a key live in two partitions, whose order no consumer knows:
// verify fails, whatever the fold shows.
func TestVerifyKeyOutsideItsPartition(t *testing.T) {
	k, j := home("k"), home("j")
	tp := topic(t,
		&kgo.Record{Key: []byte("k"), Value: []byte(`{"v":"old"}`), Partition: 1 - k},
		&kgo.Record{Key: []byte("k"), Value: []byte(`{"v":"new"}`), Partition: k},
		&kgo.Record{Key: []byte("j"), Value: []byte(`{"v":"live"}`), Partition: 1 - j},
		&kgo.Record{Key: []byte("j"), Partition: j},
	)
	for _, budget := range []int{0, -1} {
		rep, err := verify.Options{MaxKeysInMemory: budget}.Compare(context.Background(), rows{"k": `{"v":"new"}`}, tp, "t")
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() || rep.Misplaced != 2 || !strings.Contains(rep.Text(), "partition") {
			t.Errorf("budget %d: keys in partitions they do not hash to: OK %v, misplaced %d\n%s", budget, rep.OK(), rep.Misplaced, rep.Text())
		}
	}
}

// TestVerifyTouchedRowIsNotADuplicate: with source.columns leaving out
// updated_at, a row updated only in columns the record leaves out is a new
// version with the same value. The engine may publish it (a settled row is
// not in the dedupe set), and that is not a version published twice: the
// record's updated_at differs. The same version twice still is.
func TestVerifyTouchedRowIsNotADuplicate(t *testing.T) {
	k, j := home("k"), home("j")
	tp := topic(t,
		&kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`), Partition: k, Headers: at("2026-01-01T00:00:01.000000Z")},
		&kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`), Partition: k, Headers: at("2026-01-01T00:00:02.000000Z")},
		&kgo.Record{Key: []byte("j"), Value: []byte(`{"v":2}`), Partition: j, Headers: at("2026-01-01T00:00:01.000000Z")},
		&kgo.Record{Key: []byte("j"), Value: []byte(`{"v":2}`), Partition: j, Headers: at("2026-01-01T00:00:02.000000Z")},
		&kgo.Record{Key: []byte("j"), Value: []byte(`{"v":2}`), Partition: j, Headers: at("2026-01-01T00:00:02.000000Z")},
	)
	for _, budget := range []int{0, -1} { // in memory, by buckets
		rep, err := verify.Options{MaxKeysInMemory: budget}.Compare(context.Background(), rows{"k": `{"v":1}`, "j": `{"v":2}`}, tp, "t")
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Matches() || rep.Duplicates != 1 {
			t.Errorf("budget %d: a touched row and one version of j twice: matches %v, %d duplicates (want 1)\n%s", budget, rep.Matches(), rep.Duplicates, rep.Text())
		}
	}
}

// TestVerifyViewCutShortIsNotAMatch: a topic view that stops before a
// transaction still open (another producer's, a hanging one) hides every
// record after it; verify must not call what it did not read a match (a
// duplicate publication there would go unseen).
func TestVerifyViewCutShortIsNotAMatch(t *testing.T) {
	k := home("k")
	tp := topic(t, &kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`), Partition: k, Headers: at("2026-01-01T00:00:01.000000Z")})
	open, err := kgo.NewClient(append(tp.Opts, kgo.TransactionalID("open"), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer open.Close()
	if err := open.BeginTransaction(); err != nil {
		t.Fatal(err)
	}
	if err := open.ProduceSync(context.Background(), &kgo.Record{Topic: tp.Topic, Key: []byte("k"), Value: []byte(`{"v":1}`), Partition: k, Headers: at("2026-01-01T00:00:01.000000Z")}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	tp.Wait = fold.ViewWait{Timeout: 200 * time.Millisecond}
	for _, budget := range []int{0, -1} {
		rep, err := verify.Options{MaxKeysInMemory: budget}.Compare(context.Background(), rows{"k": `{"v":1}`}, tp, "t")
		if err != nil {
			t.Fatal(err)
		}
		if rep.OK() || rep.CutShort != 1 || !strings.Contains(rep.Text(), "open") {
			t.Errorf("budget %d: a view cut short by an open transaction: OK %v, cut short %d\n%s", budget, rep.OK(), rep.CutShort, rep.Text())
		}
	}
}

// TestVerifyRecordWithoutUpdatedAtIsReported: tidemark writes an
// updated_at header on every record, so a record without one, or with one
// that is not a time, is another producer's. The version published after
// it (A, X, A: the sweep repairing a key another producer overwrote)
// restores the source's state and is not a repeat; but verify says that
// such records are there (it said nothing), since the repeat counts of
// their keys rest on that reading.
func TestVerifyRecordWithoutUpdatedAtIsReported(t *testing.T) {
	k := home("k")
	a := &kgo.Record{Key: []byte("k"), Value: []byte(`{"v":1}`), Partition: k, Headers: at("2026-01-01T00:00:01.000000Z")}
	for _, hdr := range [][]kgo.RecordHeader{nil, at("garbage")} {
		x := &kgo.Record{Key: []byte("k"), Value: []byte(`{"v":"x"}`), Partition: k, Headers: hdr}
		a2 := *a
		tp := topic(t, a, x, &a2)
		for _, budget := range []int{0, -1} {
			rep, err := verify.Options{MaxKeysInMemory: budget}.Compare(context.Background(), rows{"k": `{"v":1}`}, tp, "t")
			if err != nil {
				t.Fatal(err)
			}
			if !rep.OK() || rep.Undated != 1 || !strings.Contains(rep.Text(), "without an updated_at header: 1") {
				t.Errorf("header %v, budget %d: OK %v, undated %d\n%s", hdr, budget, rep.OK(), rep.Undated, rep.Text())
			}
		}
	}
}
