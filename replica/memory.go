package replica

import (
	"context"
	"maps"
	"sync"
)

// Memory is an in-memory Store: key -> last value. It is safe for
// concurrent use.
type Memory struct {
	mu   sync.Mutex
	rows map[string][]byte
	pos  map[int32]int64
}

var (
	_ Store    = (*Memory)(nil)
	_ Resetter = (*Memory)(nil)
)

// NewMemory returns an empty Memory.
func NewMemory() *Memory {
	return &Memory{rows: map[string][]byte{}, pos: map[int32]int64{}}
}

// Positions implements Store.
func (m *Memory) Positions(context.Context) (map[int32]int64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.pos), nil
}

// Apply implements Store. It cannot fail.
func (m *Memory) Apply(_ context.Context, batch []Change, positions map[int32]int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range batch {
		if c.Delete() {
			delete(m.rows, c.Key)
			continue
		}
		m.rows[c.Key] = append([]byte(nil), c.Value...)
	}
	maps.Copy(m.pos, positions)
	return nil
}

// Reset implements Resetter.
func (m *Memory) Reset(context.Context) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	clear(m.rows)
	clear(m.pos)
	return nil
}

// Rows returns a copy of the live keys and their values.
func (m *Memory) Rows() map[string][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]byte, len(m.rows))
	for k, v := range m.rows {
		out[k] = append([]byte(nil), v...)
	}
	return out
}

// Len returns the number of live keys.
func (m *Memory) Len() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.rows)
}
