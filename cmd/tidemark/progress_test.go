package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
)

func TestProgressLines(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var out bytes.Buffer
	p := newProgress(&out, time.Hour)
	p.now = func() time.Time { return now }
	p.estimate = func(context.Context) (int64, error) { return 100, nil }
	p.lastAt = now
	p.checkpoint(nil) // fresh start: an initial load

	for range 3 {
		p.ObservePage(time.Millisecond, 10)
	}
	p.ObserveCommit(connector.CommitInfo{Published: 30})
	now = now.Add(5 * time.Second)
	p.tick(context.Background())
	got := out.String()
	for _, want := range []string{"30 rows read, 30 published, 6 rows/s", "about 70 to go of about 100 (table estimate)", "about 12s left"} {
		if !strings.Contains(got, want) {
			t.Errorf("progress line lacks %q: %q", want, got)
		}
	}
	out.Reset()
	p.ObservePage(time.Millisecond, 0)
	p.tick(context.Background())
	if !strings.Contains(out.String(), "initial load done: 30 rows read in 5s") {
		t.Errorf("no end-of-load line: %q", out.String())
	}
	out.Reset()
	p.tick(context.Background())
	// A short re-read of the margin, caught up before the next tick: quiet.
	p.ObservePage(time.Millisecond, 2)
	p.ObservePage(time.Millisecond, 0)
	p.tick(context.Background())
	if out.Len() != 0 {
		t.Errorf("idle or short work printed: %q", out.String())
	}
}
