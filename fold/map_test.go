package fold_test

import (
	"context"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// Map names every record older, by its updated_at header, than a record
// of its key read before it (a tombstone included), and only those: a
// stale version published once after a newer one is visible nowhere else.
func TestMapNamesRecordsThatGoBackInTime(t *testing.T) {
	opts, topic := newTopic(t, 2)
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), kgo.DefaultProduceTopic(topic))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	put := func(p int32, key, value, at string) {
		r := &kgo.Record{Partition: p, Key: []byte(key)}
		if value != "" {
			r.Value = []byte(value)
		}
		if at != "" {
			r.Headers = []kgo.RecordHeader{{Key: schemas.HeaderUpdatedAt, Value: []byte(at)}}
		}
		if err := cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	const t1, t2, t3 = "2026-12-01T10:00:00.000001Z", "2026-12-01T10:00:00.000002Z", "2026-12-01T10:00:01.000000Z"
	put(0, "a", "a1", t1)
	put(0, "a", "a2", t2)
	put(0, "a", "a1-stale", t1) // back in time, a value never published before
	put(0, "a", "a3", t3)
	put(1, "b", "b1", t1)
	put(1, "b", "b1-again", t1) // same updated_at: not earlier
	put(1, "b", "", t2)         // a tombstone
	put(1, "b", "b0", t1)       // back behind the tombstone
	put(1, "c", "c2", t2)
	put(1, "c", "c-raw", "") // no header: not compared
	put(1, "c", "c3", t3)
	st, err := fold.Map(context.Background(), opts, topic)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"key a at 0/2: updated_at " + t1 + " after " + t2,
		"key b at 1/3: updated_at " + t1 + " after " + t2,
	}
	if !slices.Equal(st.Backwards, want) {
		t.Errorf("backwards:\n  %q\nwant\n  %q", st.Backwards, want)
	}
}
