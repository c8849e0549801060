package connector

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

// TestWindowLayout: the number of windows follows the dedupe set's size
// within its bounds, no window is narrower than minWindow, and the windows
// tile the range: each one starts where the one before ends, the first
// from the pass's own lower bound and the last open above.
func TestWindowLayout(t *testing.T) {
	for _, c := range []struct{ rows, want int }{
		{0, 16}, {32_000, 16}, {32_001, 17}, {77_000, 39}, {512_000, 256}, {10_000_000, 256},
	} {
		if got := windowCount(c.rows); got != c.want {
			t.Errorf("windowCount(%d) = %d; want %d", c.rows, got, c.want)
		}
	}
	lo := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		span time.Duration
		n    int
		want int
	}{
		{15 * time.Millisecond, 16, 0},   // narrower than 16 windows of minWindow: no windows
		{16 * time.Millisecond, 16, 16},  // exactly
		{20 * time.Millisecond, 256, 20}, // as many as minWindow allows
		{11 * time.Second, 39, 39},
		{60 * 24 * time.Hour, 256, 256}, // a long outage
	} {
		w := newWindows(lo, lo.Add(c.span), c.n)
		if w.n != c.want {
			t.Errorf("newWindows(%s, %d): %d windows; want %d", c.span, c.n, w.n, c.want)
			continue
		}
		if w.n == 0 {
			if !w.from().IsZero() || !w.before().IsZero() || !w.last() {
				t.Errorf("newWindows(%s, %d): no windows, but bounds %v %v", c.span, c.n, w.from(), w.before())
			}
			continue
		}
		if w.width < minWindow {
			t.Errorf("newWindows(%s, %d): windows of %s", c.span, c.n, w.width)
		}
		var prev time.Time
		for i := 0; i < w.n; i++ {
			from, before := w.from(), w.before()
			switch {
			case i == 0 && !from.IsZero():
				t.Errorf("newWindows(%s, %d): the first window starts at %v, not at the pass's lower bound", c.span, c.n, from)
			case i > 0 && !from.Equal(prev):
				t.Errorf("newWindows(%s, %d): window %d starts at %v, the one before ended at %v", c.span, c.n, i, from, prev)
			case w.last() != (i == w.n-1) || w.last() != before.IsZero():
				t.Errorf("newWindows(%s, %d): window %d of %d: last %t, upper bound %v", c.span, c.n, i, w.n, w.last(), before)
			case !before.IsZero() && !before.After(from) && i > 0:
				t.Errorf("newWindows(%s, %d): window %d is empty: [%v, %v)", c.span, c.n, i, from, before)
			}
			prev = before
			w.advance()
		}
	}
}

// The poll jitter only ever shortens the interval: the interval is what a
// change may wait for the next pass to start (docs/design.md, "Polling").
func TestPollJitterOnlyShortens(t *testing.T) {
	e := &Engine{cfg: Config{PollInterval: time.Second, PollJitter: 0.2}}
	lo, hi := time.Second, time.Duration(0)
	for range 10000 {
		d := e.pollDelay()
		lo, hi = min(lo, d), max(hi, d)
	}
	if hi > time.Second || lo < 800*time.Millisecond {
		t.Errorf("intervals of 1s with jitter 0.2 ranged %s to %s; want within 800ms to 1s", lo, hi)
	}
	if hi-lo < 150*time.Millisecond {
		t.Errorf("intervals ranged %s to %s only: no jitter", lo, hi)
	}
}

// A wake-up that came while a pass ran longer than the poll interval is
// taken, not left to race the poll timer, which is already due then: the
// next pass is the one the notification asked for (a head pass), not a
// full pass by the toss of select.
func TestIdleTakesAWaitingWakeUp(t *testing.T) {
	wake := make(chan struct{}, 1)
	e := &Engine{cfg: Config{PollInterval: 100 * time.Millisecond, Wake: wake}, cp: &schemas.Checkpoint{},
		lookAt: time.Now().Add(time.Hour)}
	for i := range 200 {
		e.woke, e.wokeAt, e.passStarted = false, time.Now().Add(-time.Second), time.Now().Add(-time.Second)
		wake <- struct{}{}
		if ok, err := e.idle(context.Background(), false); !ok || err != nil {
			t.Fatalf("idle: %v, %v", ok, err)
		}
		if !e.woke {
			t.Fatalf("round %d: the poll timer ended the wait with a wake-up waiting", i)
		}
	}
}
