package sweep

import (
	"context"
	"slices"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/test/harness"
	"github.com/tidemark/tidemark/test/rig"
)

func TestMain(m *testing.M) { harness.Main(m) }

// newRig is this suite's world (rig.New): the source on items
// (rig.ItemsDDL), connector "sw", and a ledger, so that the checkpoint store
// is fail-closed as in the binary.
func newRig(t *testing.T) *rig.Rig {
	t.Helper()
	return rig.New(t, rig.Options{Name: "sw", Ledger: "tidemark-ledger"})
}

// produceRaw writes records straight into the data topic, behind
// tidemark's back (non-transactional, default murmur2 partitioner); a nil
// value is a tombstone.
func produceRaw(r *rig.Rig, kvs ...[2]*string) {
	r.T.Helper()
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, r.Opts...), kgo.DefaultProduceTopic(r.Topic), kgo.DisableIdempotentWrite())...)
	if err != nil {
		r.T.Fatal(err)
	}
	defer cl.Close()
	for _, kv := range kvs {
		rec := &kgo.Record{Key: []byte(*kv[0])}
		if kv[1] != nil {
			rec.Value = []byte(*kv[1])
		}
		if err := cl.ProduceSync(context.Background(), rec).FirstErr(); err != nil {
			r.T.Fatalf("produce %s: %v", *kv[0], err)
		}
	}
}

func ptr(s string) *string { return &s }

func contains(s []string, v string) bool { return slices.Contains(s, v) }
