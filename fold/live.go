package fold

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
)

// Topic reads a data topic's live keys for the sweep and verify.
type Topic struct {
	Opts  []kgo.Opt
	Topic string
}

var _ connector.TopicView = Topic{}

// Live folds the topic read_committed into a compact key set: every live key
// with the digest of its last value (connector.Digest, so it compares with
// source rows directly). Memory grows with the live keys, not the records.
func (t Topic) Live(ctx context.Context) (*connector.KeySet, connector.TopicStats, error) {
	ks := connector.NewKeySet(1 << 16)
	st := connector.TopicStats{End: map[int32]int64{}}
	var row connector.Row
	err := Scan(ctx, t.Opts, t.Topic, func(r *kgo.Record) error {
		st.Records++
		if r.Offset+1 > st.End[r.Partition] {
			st.End[r.Partition] = r.Offset + 1
		}
		if r.Value == nil {
			st.Tombstones++
			ks.Delete(string(r.Key))
			return nil
		}
		row = connector.Row{Value: r.Value}
		same, err := ks.Put(string(r.Key), connector.Digest(&row))
		if same {
			st.Duplicates++
		}
		return err
	})
	return ks, st, err
}
