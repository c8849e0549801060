package replica

import (
	"context"
	"maps"
	"slices"
)

// Change is one data record's effect on a key.
type Change struct {
	// Key is the record key: the row id as text.
	Key string
	// Value is the record value, a JSON object; nil for a tombstone (the key
	// is deleted).
	Value []byte
	// Partition and Offset locate the record, for messages.
	Partition int32
	Offset    int64
}

// Delete reports whether c is a tombstone.
func (c Change) Delete() bool { return c.Value == nil }

// Store is a fold target. It holds the folded state and the positions that
// state corresponds to, and changes both together.
type Store interface {
	// Positions returns, per partition of the topic, the next offset to
	// read: everything before it is applied. A partition without an entry
	// has nothing applied.
	Positions(ctx context.Context) (map[int32]int64, error)
	// Apply applies batch in order (for each key the last change wins; a
	// tombstone for a key the store lacks is a no-op) and records positions
	// (partition -> next offset to read, for the partitions the batch
	// advanced), atomically: after an error nothing of the batch and none
	// of the positions are applied.
	Apply(ctx context.Context, batch []Change, positions map[int32]int64) error
}

// Resetter is an optional Store capability: Reset empties the store and
// forgets every position, atomically, so the next read starts at the
// beginning of the topic.
type Resetter interface {
	Reset(ctx context.Context) error
}

// Compact returns the last change per key of batch, in the order of those
// last changes. Stores whose bulk operations must not touch a key twice
// use it.
func Compact(batch []Change) []Change {
	last := make(map[string]int, len(batch))
	for i, c := range batch {
		last[c.Key] = i
	}
	if len(last) == len(batch) {
		return batch
	}
	idx := slices.Sorted(maps.Values(last))
	out := make([]Change, len(idx))
	for i, j := range idx {
		out[i] = batch[j]
	}
	return out
}
