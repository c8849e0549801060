package connector_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// memKeyTable is memTable that can also be read in key order (id order,
// as strings), split into key ranges: connector.RangeLoader.
type memKeyTable struct {
	*memTable
	lmu      sync.Mutex
	loads    int                             // LoadPage calls so far
	onLoad   func(n int)                     // called before serving LoadPage call n (1-based)
	failAt   int                             // LoadPage call that fails (0 = none)
	requests map[connector.KeyRange][]string // cursors asked for, per range
	splits   []int                           // the n of each SplitKeys call
	limits   map[int]bool                    // the page limits asked for
}

func newMemKeyTable() *memKeyTable {
	return &memKeyTable{memTable: newMemTable(), requests: map[connector.KeyRange][]string{}}
}

func (m *memKeyTable) SplitKeys(_ context.Context, n int) ([]connector.KeyRange, error) {
	m.lmu.Lock()
	m.splits = append(m.splits, n)
	m.lmu.Unlock()
	m.mu.Lock()
	ids := make([]string, 0, len(m.rows))
	for id := range m.rows {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	slices.Sort(ids)
	var out []connector.KeyRange
	lo := ""
	for i := 1; i < n && len(ids) > 0; i++ {
		hi := ids[i*len(ids)/n]
		if hi <= lo {
			continue
		}
		out = append(out, connector.KeyRange{Lo: lo, Hi: hi})
		lo = hi
	}
	return append(out, connector.KeyRange{Lo: lo}), nil
}

func (m *memKeyTable) LoadPage(ctx context.Context, req connector.LoadRequest) (connector.Page, error) {
	m.lmu.Lock()
	m.loads++
	n, hook, fail := m.loads, m.onLoad, m.failAt == m.loads
	m.requests[req.Range] = append(m.requests[req.Range], req.Cursor)
	if m.limits == nil {
		m.limits = map[int]bool{}
	}
	m.limits[req.Limit] = true
	m.lmu.Unlock()
	if hook != nil {
		hook(n)
	}
	if fail {
		return connector.Page{}, errors.New("connection reset (injected)")
	}
	if err := ctx.Err(); err != nil {
		return connector.Page{}, err
	}
	after := req.Range.Lo
	if req.Cursor != "" {
		after = req.Cursor
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []string
	for id := range m.rows {
		if id > after && (req.Range.Hi == "" || id <= req.Range.Hi) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	if len(ids) > req.Limit {
		ids = ids[:req.Limit]
	}
	var p connector.Page
	for _, id := range ids {
		r := m.rows[id]
		row := connector.Row{ID: id, UpdatedAt: r.ts, Deleted: r.deleted}
		if !r.deleted {
			row.Value = []byte(fmt.Sprintf(`{"id":%q,"v":%q}`, id, r.val))
		}
		p.Rows = append(p.Rows, row)
	}
	if len(ids) == 0 {
		p.End = true
	} else {
		p.Next = ids[len(ids)-1]
		p.Last = len(ids) < req.Limit
	}
	return p, nil
}

// seedRandom fills the table with n rows whose updated_at is random with
// respect to their id order.
func seedRandom(m *memKeyTable, rng *rand.Rand, n int) {
	for i := range n {
		m.set(fmt.Sprintf("k%05d", i), t0.Add(time.Duration(rng.IntN(3600_000_000))*time.Microsecond), "v0", false)
	}
}

// A load in key order with four workers while the table changes under it
// (updates of rows already read and not yet read, inserts below and above
// every range's cursor, soft deletes): once `run --once` is done (the
// load, and the pass after it that reads what changed meanwhile), the
// topic holds exactly the table, and no record was published twice.
func TestKeyLoadUnderMutationsIsExactlyOnce(t *testing.T) {
	r := newRig(t)
	rng := rand.New(rand.NewPCG(1, 2))
	m := newMemKeyTable()
	seedRandom(m, rng, 2000)
	var mrng sync.Mutex
	m.onLoad = func(n int) {
		if n%5 != 0 {
			return
		}
		mrng.Lock()
		defer mrng.Unlock()
		now := time.Now()
		id := fmt.Sprintf("k%05d", rng.IntN(2000))
		switch rng.IntN(4) {
		case 0:
			m.set(id, now, fmt.Sprint("u", n), false)
		case 1:
			m.set(fmt.Sprintf("a%05d", n), now, "new", false) // below every range
		case 2:
			m.set(fmt.Sprintf("z%05d", n), now, "new", false) // above every range
		case 3:
			m.set(id, now, "gone", true)
		}
	}
	cfg := connector.Config{PageSize: 7, TxnMaxRecords: 60, Margin: -1, LoadWorkers: 4} // no margin: W must be the clock at the start of the load
	c := r.once(m, cfg)
	if c.Published < 2000 {
		t.Errorf("the load published %d records, want at least the 2000 rows", c.Published)
	}
	// One run --once is caught up: the load and the pass after it, which
	// reads what changed while the load ran.
	r.assertOnce(m.expected(), "")
	cp, err := r.store().Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cp.Phase != schemas.PhaseIdle || cp.Load != nil || cp.Watermark == "" {
		t.Errorf("after the load and a pass: phase %s, load %+v, watermark %q", cp.Phase, cp.Load, cp.Watermark)
	}
	m.onLoad = nil
	if c := r.once(m, cfg); c.Published != 0 {
		t.Errorf("a run on the unchanged table published %d records", c.Published)
	}
	// A transient failure before the load's first commit (the in-process
	// broker sometimes answers OUT_OF_ORDER_SEQUENCE_NUMBER) starts it over
	// with a new split of the changed table: then more ranges were read.
	for _, n := range m.splits {
		if n != 16 {
			t.Errorf("the load split the key space into %d ranges, want 16 (4 per worker)", n)
		}
	}
	if len(m.splits) == 1 && len(m.requests) != 16 {
		t.Errorf("the load read %d key ranges, want 16 (4 per worker)", len(m.requests))
	}
}

// The last key range has no upper end, so rows inserted above every id
// while the load runs land in it; here every page read finds a new one.
// A page with fewer rows than the limit ends its range (docs/design.md,
// "The initial load in key order"), so the load ends although the
// inserts never stop, and the pass after it publishes what they added.
func TestKeyLoadEndsWhileInsertsContinue(t *testing.T) {
	r := newRig(t)
	m := newMemKeyTable()
	seedRandom(m, rand.New(rand.NewPCG(5, 6)), 500)
	m.onLoad = func(n int) { m.set(fmt.Sprintf("z%06d", n), time.Now(), "new", false) }
	cfg := connector.Config{PageSize: 10, TxnMaxRecords: 100, Margin: time.Second, LoadWorkers: 2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, _ := r.engine(m, cfg)
	if _, err := e.Run(ctx, connector.Once); err != nil {
		t.Fatalf("run: %v", err)
	}
	if ctx.Err() != nil {
		m.lmu.Lock()
		t.Fatalf("the load did not end within 10s: %d pages read while rows kept arriving above every id", m.loads)
	}
	m.lmu.Lock()
	m.onLoad = nil
	m.lmu.Unlock()
	r.assertOnce(m.expected(), "")
}

// A load stopped part way (a failed page, then a shutdown) resumes every
// key range at its committed cursor: no range is read from its start
// again once a page of it is committed, and nothing is published twice.
func TestKeyLoadResumesEveryRange(t *testing.T) {
	r := newRig(t)
	m := newMemKeyTable()
	seedRandom(m, rand.New(rand.NewPCG(3, 4)), 6000) // pages of 13 rows: 40 / 3 workers (TestKeyLoadPageSize)
	cfg := connector.Config{PageSize: 10, TxnMaxRecords: 40, Margin: time.Second, LoadWorkers: 3}

	// A failed page: the engine resumes from the last commit by itself.
	m.failAt = 30
	ctx, cancel := context.WithCancel(context.Background())
	m.onLoad = func(n int) {
		if n == 90 {
			cancel() // a shutdown: the open transaction is committed
		}
	}
	e, _ := r.engine(m, cfg)
	if _, err := e.Run(ctx, connector.Once); err != nil {
		t.Fatalf("run: %v", err)
	}
	cp, err := r.store().Load(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if cp.Phase != schemas.PhaseLoad || cp.Load == nil || len(cp.Load.Ranges) != 12 {
		t.Fatalf("after the shutdown: phase %s, load %+v; want an open load of 12 ranges", cp.Phase, cp.Load)
	}
	started := map[connector.KeyRange]schemas.LoadRange{}
	for _, lr := range cp.Load.Ranges {
		if lr.Cursor != "" || lr.Done {
			started[connector.KeyRange{Lo: lr.Lo, Hi: lr.Hi}] = lr
		}
	}
	if len(started) == 0 {
		t.Fatal("no range committed any progress before the shutdown")
	}

	m.lmu.Lock()
	m.onLoad, m.failAt = nil, 0
	m.requests = map[connector.KeyRange][]string{}
	m.lmu.Unlock()
	r.once(m, cfg)
	for kr, lr := range started {
		got := m.requests[kr]
		if lr.Done {
			if len(got) > 0 {
				t.Errorf("range %v was done, and was read again: %q", kr, got)
			}
			continue
		}
		if len(got) == 0 || got[0] != lr.Cursor {
			t.Errorf("range %v: resumed with cursor %q, want its committed cursor %q", kr, strings.Join(got[:min(len(got), 1)], ""), lr.Cursor)
		}
	}
	r.assertOnce(m.expected(), "")
}

// TestKeyLoadPageSize: the load in key order reads pages of five times
// sync.page_size (its page cost is per query, with no ties to resolve and
// no fresh rows to wait for), the workers' pages together no more rows
// than a transaction may hold, and never fewer than a page.
func TestKeyLoadPageSize(t *testing.T) {
	for _, c := range []struct{ page, txn, want int }{
		{10, 1000, 50},
		{10, 40, 20}, // 2 workers
		{100, 50, 100},
	} {
		r := newRig(t)
		m := newMemKeyTable()
		seedRandom(m, rand.New(rand.NewPCG(5, 6)), 300)
		r.once(m, connector.Config{PageSize: c.page, TxnMaxRecords: c.txn, LoadWorkers: 2})
		if len(m.limits) != 1 || !m.limits[c.want] {
			t.Errorf("page_size %d, txn_max_records %d: load pages of %v rows, want %d", c.page, c.txn, m.limits, c.want)
		}
		r.assertFolded(m.expected())
	}
}

// TestKeyLoadSaysWhenFewerRangesThanWorkers: a table too small for its
// sample to split into a range per worker (or a bloated one whose sample
// finds few ids) is loaded on fewer sessions than sync.load_workers asks
// for; the log says so, with the numbers, instead of the load being
// quietly slower than configured. A table that splits says nothing.
func TestKeyLoadSaysWhenFewerRangesThanWorkers(t *testing.T) {
	for _, rows := range []int{1, 200} {
		r := newRig(t)
		m := newMemKeyTable()
		for i := range rows {
			m.set(fmt.Sprintf("k%04d", i), t0, "v1", false)
		}
		var buf harness.SyncBuffer
		r.once(m, connector.Config{LoadWorkers: 4, PageSize: 50, Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))})
		warned := strings.Contains(buf.String(), "fewer key ranges than sync.load_workers")
		if warned != (rows == 1) {
			t.Errorf("%d rows: warned %v\n%s", rows, warned, buf.String())
		}
	}
}
