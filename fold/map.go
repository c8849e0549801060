package fold

import (
	"context"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Entry is the state of one key after folding.
type Entry struct {
	Value     []byte
	Partition int32
	Offset    int64
	Headers   map[string]string
}

// State is a folded topic: live keys and their last values, plus what a
// checker needs to spot anomalies.
type State struct {
	// Live maps key to its last non-tombstone record.
	Live map[string]Entry
	// Publications counts how often each (key, value) was published.
	Publications map[string]map[string]int
	// Records is the number of committed records read.
	Records int
	// Tombstones is the number of tombstones read.
	Tombstones int
}

// Map folds the committed records of topic into memory: last record per key
// wins, a tombstone deletes. Intended for tests and small topics; Publications
// holds every distinct value, so memory grows with the topic.
func Map(ctx context.Context, opts []kgo.Opt, topic string) (*State, error) {
	st := &State{Live: map[string]Entry{}, Publications: map[string]map[string]int{}}
	err := Scan(ctx, opts, topic, func(r *kgo.Record) error {
		st.Records++
		k := string(r.Key)
		if st.Publications[k] == nil {
			st.Publications[k] = map[string]int{}
		}
		if r.Value == nil {
			st.Tombstones++
			st.Publications[k]["\x00tombstone"]++
			delete(st.Live, k)
			return nil
		}
		st.Publications[k][string(r.Value)]++
		h := make(map[string]string, len(r.Headers))
		for _, x := range r.Headers {
			h[x.Key] = string(x.Value)
		}
		st.Live[k] = Entry{Value: r.Value, Partition: r.Partition, Offset: r.Offset, Headers: h}
		return nil
	})
	return st, err
}
