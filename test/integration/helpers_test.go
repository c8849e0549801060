package integration

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
	"github.com/tidemark/tidemark/test/rig"
)

func TestMain(m *testing.M) { harness.Main(m) }

// newRig is this suite's world (rig.New): ddl (mostly rig.ItemsDDL) run in
// the test's schema, the source on table, connector "it", no ledger.
func newRig(t *testing.T, ddl, table string) *rig.Rig {
	t.Helper()
	return rig.New(t, rig.Options{DDL: ddl, Table: table, Name: "it"})
}

// hooked wraps the PostgreSQL source to act between pages. Pages are
// numbered from 1 over the wrapper's life (across passes and runs), and
// pages read inside a consistent-load snapshot count too. Horizon and
// Snapshot pass through (Snapshot wraps the view so its pages are hooked).
type hooked struct {
	*postgres.Source
	mu    sync.Mutex
	pages int
	// before runs before page n is read; an error is returned as the
	// page's error.
	before func(ctx context.Context, n int) error
	// after runs after page n was read, before the engine sees it.
	after func(n int, p connector.Page)
}

var (
	_ connector.Source      = (*hooked)(nil)
	_ connector.Horizoner   = (*hooked)(nil)
	_ connector.Snapshotter = (*hooked)(nil)
)

func (h *hooked) next() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pages++
	return h.pages
}

func (h *hooked) around(ctx context.Context, req connector.PageRequest, page func(context.Context, connector.PageRequest) (connector.Page, error)) (connector.Page, error) {
	n := h.next()
	if h.before != nil {
		if err := h.before(ctx, n); err != nil {
			return connector.Page{}, err
		}
	}
	p, err := page(ctx, req)
	if err == nil && h.after != nil {
		h.after(n, p)
	}
	return p, err
}

func (h *hooked) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	return h.around(ctx, req, h.Source.Page)
}

func (h *hooked) Snapshot(ctx context.Context) (connector.SnapshotSource, error) {
	s, err := h.Source.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	return &hookedSnap{SnapshotSource: s, h: h}, nil
}

type hookedSnap struct {
	connector.SnapshotSource
	h *hooked
}

func (s *hookedSnap) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	return s.h.around(ctx, req, s.SnapshotSource.Page)
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
