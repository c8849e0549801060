package offsets

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// Store reads a connector's committed checkpoint.
type Store struct {
	opts      []kgo.Opt
	topic     string
	connector string
}

var _ connector.CheckpointStore = (*Store)(nil)

// NewStore returns a Store for connector's checkpoint on topic. opts
// configure the connection (brokers, TLS, SASL).
func NewStore(opts []kgo.Opt, topic, connectorName string) *Store {
	return &Store{opts: opts, topic: topic, connector: connectorName}
}

// Load returns the latest committed checkpoint, or nil when the connector
// has none (or was reset to scratch with a tombstone). Only committed
// records are read (read_committed).
func (s *Store) Load(ctx context.Context) (*schemas.Checkpoint, error) {
	cps, err := s.History(ctx)
	if err != nil || len(cps) == 0 {
		return nil, err
	}
	return cps[len(cps)-1], nil
}

// History returns every committed checkpoint of the connector still in the
// topic, oldest first; a tombstone (reset to scratch) clears what came
// before it. Compaction may have removed older ones.
func (s *Store) History(ctx context.Context) ([]*schemas.Checkpoint, error) {
	var out []*schemas.Checkpoint
	err := fold.Scan(ctx, s.opts, s.topic, func(r *kgo.Record) error {
		if string(r.Key) != s.connector {
			return nil
		}
		if r.Value == nil {
			out = out[:0]
			return nil
		}
		cp, err := schemas.DecodeCheckpoint(r.Value)
		if err != nil {
			return &connector.StopError{
				Reason: fmt.Sprintf("the checkpoint at %s/%d offset %d cannot be read", s.topic, r.Partition, r.Offset),
				Hint:   "check that every writer of this offsets topic runs a compatible tidemark release; `tidemark reset` decides explicitly",
				Err:    err,
			}
		}
		out = append(out, cp)
		return nil
	})
	if errors.Is(err, fold.ErrNoTopic) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read checkpoints of %q from %s: %w", s.connector, s.topic, err)
	}
	return out, nil
}
