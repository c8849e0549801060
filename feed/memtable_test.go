package feed

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tidemark/tidemark/connector"
)

// memTable is an in-memory Table ordered by (updated_at, id), for the
// server's unit tests; the end-to-end tests in connector/httpsrc serve a
// real PostgreSQL table.
type memTable struct {
	mu   sync.Mutex
	rows map[string]memRow
}

type memRow struct {
	ts      time.Time
	deleted bool
}

func newMem() *memTable { return &memTable{rows: map[string]memRow{}} }

func (m *memTable) set(id string, ts time.Time, deleted bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.rows[id] = memRow{ts.UTC().Truncate(time.Microsecond), deleted}
}

func (m *memTable) del(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.rows, id)
}

func (m *memTable) CursorAfter(ts time.Time, id string) string {
	return strconv.FormatInt(ts.UnixMicro(), 10) + "|" + id
}

func (m *memTable) Page(_ context.Context, req connector.PageRequest) (connector.Page, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	type key struct {
		us int64
		id string
	}
	less := func(a, b key) int {
		if c := cmp.Compare(a.us, b.us); c != 0 {
			return c
		}
		return cmp.Compare(a.id, b.id)
	}
	var after *key
	if req.Cursor != "" {
		us, id, _ := strings.Cut(req.Cursor, "|")
		n, err := strconv.ParseInt(us, 10, 64)
		if err != nil {
			return connector.Page{}, fmt.Errorf("bad cursor %q", req.Cursor)
		}
		after = &key{n, id}
	}
	var ks []key
	for id, r := range m.rows {
		k := key{r.ts.UnixMicro(), id}
		if after != nil && less(k, *after) <= 0 || after == nil && !req.Since.IsZero() && r.ts.Before(req.Since) {
			continue
		}
		ks = append(ks, k)
	}
	slices.SortFunc(ks, less)
	ks = ks[:min(len(ks), req.Limit)]
	var p connector.Page
	for _, k := range ks {
		r := m.rows[k.id]
		row := connector.Row{ID: k.id, UpdatedAt: r.ts, Deleted: r.deleted}
		if !r.deleted {
			row.Value = []byte(fmt.Sprintf(`{"id":%q}`, k.id))
		}
		p.Rows = append(p.Rows, row)
	}
	p.End = len(ks) == 0
	return p, nil
}
