package fold

import (
	"context"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/schemas"
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
	// Backwards describes every record whose updated_at header is earlier
	// than that of a record of its key read before it, tombstones
	// included: the key went back in time for a consumer. Records without
	// the header are not compared.
	Backwards []string
}

// Map folds the committed records of topic into memory: last record per key
// wins, a tombstone deletes. Intended for tests and small topics; Publications
// holds every distinct value, so memory grows with the topic.
func Map(ctx context.Context, opts []kgo.Opt, topic string) (*State, error) {
	st := &State{Live: map[string]Entry{}, Publications: map[string]map[string]int{}}
	newest := map[string]string{} // key -> latest updated_at header read
	err := Scan(ctx, opts, topic, func(r *kgo.Record) error {
		st.Records++
		k := string(r.Key)
		if st.Publications[k] == nil {
			st.Publications[k] = map[string]int{}
		}
		for _, x := range r.Headers {
			if x.Key != schemas.HeaderUpdatedAt {
				continue
			}
			// The header's layout has a fixed width (schemas.TimeLayout),
			// so its text orders as its time does.
			at := string(x.Value)
			if prev := newest[k]; at < prev {
				st.Backwards = append(st.Backwards, fmt.Sprintf("key %s at %d/%d: updated_at %s after %s", k, r.Partition, r.Offset, at, prev))
			} else {
				newest[k] = at
			}
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
