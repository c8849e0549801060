package main

import (
	"context"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// progress prints a line every interval while rows are being read: rows
// read and published, rows/s, and during an initial load the rows to go and
// the time left, from PostgreSQL's cheap row estimate (pg_class.reltuples).
// It prints once when the end of the source is reached, then stays quiet
// until rows arrive again. It is an Observer; its counts are since start.
type progress struct {
	w        io.Writer
	every    time.Duration
	estimate func(context.Context) (int64, error) // nil: no estimate
	now      func() time.Time

	mu            sync.Mutex
	read, pub     int64
	first         time.Time // first page of the current stretch of work
	stretchRead   int64     // read at first
	initial       bool      // the loaded checkpoint has no watermark
	total         int64     // estimate; -1 unknown
	estimated     bool
	caughtUp      bool
	reported      bool // the current caught-up state was printed
	lastRead      int64
	lastAt        time.Time
	cancel        context.CancelFunc
	done          chan struct{}
	initialLoaded bool
	printed       bool // a line was printed in the current stretch
}

var _ connector.Observer = (*progress)(nil)

func newProgress(w io.Writer, every time.Duration) *progress {
	return &progress{w: w, every: every, now: time.Now, total: -1}
}

// start runs the reporter until stop.
func (p *progress) start(ctx context.Context) {
	ctx, p.cancel = context.WithCancel(context.WithoutCancel(ctx))
	p.done = make(chan struct{})
	p.lastAt = p.now()
	go func() {
		defer close(p.done)
		t := time.NewTicker(p.every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p.tick(ctx)
			}
		}
	}()
}

func (p *progress) stop() {
	if p.cancel != nil {
		p.cancel()
		<-p.done
	}
}

// checkpoint is called with the checkpoint the engine loaded.
func (p *progress) checkpoint(cp *schemas.Checkpoint) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.initial = cp == nil || cp.Watermark == ""
}

func (p *progress) tick(ctx context.Context) {
	p.mu.Lock()
	needEstimate := p.initial && !p.estimated && p.estimate != nil
	p.mu.Unlock()
	if needEstimate {
		n, err := p.estimate(ctx) // outside the lock: it queries PostgreSQL
		p.mu.Lock()
		p.estimated = true
		if err == nil {
			p.total = n
		}
		p.mu.Unlock()
	}
	if line := p.line(); line != "" {
		fmt.Fprintln(p.w, line)
	}
}

// line is the progress line due now, or "".
func (p *progress) line() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	delta := p.read - p.lastRead
	elapsed := now.Sub(p.lastAt)
	p.lastRead, p.lastAt = p.read, now
	if p.caughtUp {
		if p.reported {
			return ""
		}
		p.reported = true
		if !p.printed && !(p.initial && !p.initialLoaded) {
			return "" // a short stretch (a re-read of the margin): no news
		}
		took := now.Sub(p.first)
		what := "caught up"
		if p.initial && !p.initialLoaded {
			what = "initial load done"
			p.initialLoaded = true
		}
		n := p.read - p.stretchRead
		return fmt.Sprintf("progress: %s: %d rows read in %s (%s rows/s); %d read, %d published since start",
			what, n, took.Round(time.Second), rate(n, took), p.read, p.pub)
	}
	if delta == 0 {
		return ""
	}
	p.printed = true
	s := fmt.Sprintf("progress: %d rows read, %d published, %s rows/s", p.read, p.pub, rate(delta, elapsed))
	if p.initial && !p.initialLoaded && p.total > 0 {
		left := p.total - p.read
		if left > 0 {
			avg := float64(p.read-p.stretchRead) / now.Sub(p.first).Seconds()
			s += fmt.Sprintf("; about %d to go of about %d (table estimate)", left, p.total)
			if avg > 0 {
				s += fmt.Sprintf(", about %s left", time.Duration(float64(left)/avg*float64(time.Second)).Round(time.Second))
			}
		} else {
			s += fmt.Sprintf("; past the table estimate of %d rows (rows changed during the load are read again)", p.total)
		}
	}
	return s
}

func rate(n int64, d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", float64(n)/d.Seconds())
}

// ObservePage implements connector.Observer.
func (p *progress) ObservePage(_ time.Duration, rows int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if rows == 0 {
		p.caughtUp = true
		return
	}
	if p.caughtUp || p.first.IsZero() {
		p.first, p.stretchRead = p.now(), p.read
		p.caughtUp, p.reported, p.printed = false, false, false
	}
	p.read += int64(rows)
}

// ObserveCommit implements connector.Observer.
func (p *progress) ObserveCommit(c connector.CommitInfo) {
	p.mu.Lock()
	p.pub += c.Published
	p.mu.Unlock()
}

// ObserveAbort implements connector.Observer; the engine logs failures.
func (p *progress) ObserveAbort() {}

// ObserveRetry implements connector.Observer.
func (p *progress) ObserveRetry(string) {}

// ObserveStop implements connector.Observer.
func (p *progress) ObserveStop(string) {}

func (p *progress) ObserveSweep(connector.SweepResult) {}
