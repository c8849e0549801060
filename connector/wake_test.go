package connector_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
)

// TestWakeStartsAPassAtOnce: with a long poll interval, a wake-up starts
// the next pass at once, and a row written just before it is published
// well before the poll interval would have passed.
func TestWakeStartsAPassAtOnce(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v1", false)
	wake := make(chan struct{}, 1)
	e, _ := r.engine(m, connector.Config{PollInterval: time.Hour, Wake: wake})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	waitSeq(t, r, 1)
	m.set("b", time.Now(), "v1", false)
	at := time.Now()
	wake <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := r.assertFoldedQuiet()
		if _, ok := st["b"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the row written before the wake-up was not published within 10s (poll interval 1h)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("published %s after the wake-up", time.Since(at).Round(time.Millisecond))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// assertFoldedQuiet folds the topic and returns its live keys.
func (r *rig) assertFoldedQuiet() map[string]string {
	r.t.Helper()
	st, err := fold.Map(context.Background(), r.opts, r.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range st.Live {
		out[k] = fmt.Sprint(string(v.Value))
	}
	return out
}

// TestPassAfterAFailureIsFull: a pass that a wake-up started and that
// failed before it read anything (the source's clock did not answer) is
// retried as a full pass, as every pass after a failure is, not as a head
// pass (docs/design.md, "Head passes").
func TestPassAfterAFailureIsFull(t *testing.T) {
	r := newRig(t)
	m := &flakyClock{memTable: newMemTable()}
	m.set("a", t0, "v1", false)
	wake := make(chan struct{}, 1)
	obs := &passObserver{}
	e, _ := r.engine(m, connector.Config{PollInterval: time.Hour, Wake: wake, Observer: obs})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	waitSeq(t, r, 1) // the first (full) pass
	m.fail.Store(true)
	m.set("b", time.Now(), "v1", false)
	wake <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for obs.ends.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("no pass ended after the failure")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if m.fail.Load() {
		t.Fatal("the clock never failed")
	}
	// The pass after it is a follow-up of the wake-up, which may be a
	// head pass (TestWokenPassIsFollowedUp): only the retried one counts.
	if obs.headAt(2) {
		t.Error("the pass retried after a failure was a head pass")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// flakyClock is a memTable whose clock fails once when fail is set.
type flakyClock struct {
	*memTable
	fail atomic.Bool
}

func (f *flakyClock) Now(context.Context) (time.Time, error) {
	if f.fail.CompareAndSwap(true, false) {
		return time.Time{}, errors.New("the clock did not answer (injected)")
	}
	return time.Now().UTC(), nil
}

// passObserver counts the committed ends of passes, and of head passes,
// and notes which ends were head passes'.
type passObserver struct {
	connector.NopObserver
	ends, heads atomic.Int64
	mu          sync.Mutex
	head        []bool
}

func (o *passObserver) ObserveCommit(c connector.CommitInfo) {
	if c.PassEnded {
		o.mu.Lock()
		o.head = append(o.head, c.HeadPass)
		o.mu.Unlock()
		o.ends.Add(1)
		if c.HeadPass {
			o.heads.Add(1)
		}
	}
}

// headAt reports whether the nth pass end (from 1) was a head pass's.
func (o *passObserver) headAt(n int) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return n <= len(o.head) && o.head[n-1]
}

// TestFullPassWithinAPollIntervalOfTheLast: head passes do not put off the
// next full pass. Wake-ups that keep coming until just before a poll
// interval has gone by since the last full pass ended, then stop, leave it
// due at that poll interval (docs/design.md, "Head passes": a late commit
// reaches Kafka with the full pass that begins within a poll interval of
// the end of the last one); the timer started after the last head pass
// put it off by almost another interval.
func TestFullPassWithinAPollIntervalOfTheLast(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v1", false)
	wake := make(chan struct{}, 1)
	obs := &timedPasses{}
	const poll = time.Second
	e, _ := r.engine(m, connector.Config{PollInterval: poll, Wake: wake, MinPassGap: time.Millisecond, Observer: obs})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	// Wait for a full pass to end, then wake until just before a poll
	// interval has gone by.
	deadline := time.Now().Add(10 * time.Second)
	var full time.Time
	for full = obs.lastFull(); full.IsZero(); full = obs.lastFull() {
		if time.Now().After(deadline) {
			t.Fatal("no full pass ended")
		}
		time.Sleep(5 * time.Millisecond)
	}
	for time.Since(full) < poll*90/100 {
		select {
		case wake <- struct{}{}:
		default:
		}
		time.Sleep(20 * time.Millisecond)
	}
	if obs.heads.Load() == 0 {
		t.Fatal("the wake-ups started no head pass")
	}
	for {
		if next := obs.fullAfter(full); !next.IsZero() {
			// Put off, it came after the last head pass and a whole
			// interval more (1.9 s and later); on time, at 1 s and the
			// pass's own time.
			if d := next.Sub(full); d > poll*16/10 {
				t.Errorf("the next full pass ended %s after the last one (poll interval %s): head passes put it off", d.Round(time.Millisecond), poll)
			} else {
				t.Logf("the next full pass ended %s after the last one", d.Round(time.Millisecond))
			}
			break
		}
		if time.Since(full) > 5*poll {
			t.Fatal("no full pass within 5 poll intervals")
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// timedPasses notes when full passes ended, and counts head passes.
type timedPasses struct {
	passObserver
	mu    sync.Mutex
	fulls []time.Time
}

func (o *timedPasses) ObserveCommit(c connector.CommitInfo) {
	o.passObserver.ObserveCommit(c)
	if c.PassEnded && !c.HeadPass {
		o.mu.Lock()
		o.fulls = append(o.fulls, time.Now())
		o.mu.Unlock()
	}
}

func (o *timedPasses) lastFull() time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.fulls) == 0 {
		return time.Time{}
	}
	return o.fulls[len(o.fulls)-1]
}

func (o *timedPasses) fullAfter(t time.Time) time.Time {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, f := range o.fulls {
		if f.After(t) {
			return f
		}
	}
	return time.Time{}
}

// TestHeadLookbackIsAtMostTheMargin: a head pass reads from W less
// Config.HeadLookback, never further below W than the margin (the dedupe
// set's floor may be the margin below it), and from W itself with a
// negative lookback (docs/design.md, "Head passes").
func TestHeadLookbackIsAtMostTheMargin(t *testing.T) {
	for _, tc := range []struct {
		name                   string
		margin, lookback, want time.Duration
	}{
		{"default", time.Second, 0, connector.DefaultHeadLookback},
		{"set", time.Second, 300 * time.Millisecond, 300 * time.Millisecond},
		{"above_the_margin", 50 * time.Millisecond, time.Second, 50 * time.Millisecond},
		{"none", time.Second, -1, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			src := &requestLog{memTable: newMemTable()}
			src.set("a", t0, "v1", false)
			wake := make(chan struct{}, 1)
			obs := &passObserver{}
			e, _ := r.engine(src, connector.Config{PollInterval: time.Hour, Wake: wake, Margin: tc.margin, HeadLookback: tc.lookback, Observer: obs})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
			for deadline := time.Now().Add(10 * time.Second); obs.ends.Load() < 1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the first pass did not end")
				}
			}
			cp, err := r.store().Load(ctx)
			if err != nil || cp == nil || cp.Watermark == "" {
				t.Fatalf("checkpoint after the first pass: %v, %+v", err, cp)
			}
			w, err := time.Parse(time.RFC3339Nano, cp.Watermark)
			if err != nil {
				t.Fatal(err)
			}
			src.set("b", time.Now(), "v1", false)
			wake <- struct{}{}
			for deadline := time.Now().Add(10 * time.Second); obs.heads.Load() < 1; time.Sleep(5 * time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("no head pass ended after the wake-up")
				}
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			src.mu.Lock()
			defer src.mu.Unlock()
			var firsts []time.Time
			for _, q := range src.reqs {
				if q.Cursor == "" && q.From.IsZero() {
					firsts = append(firsts, q.Since)
				}
			}
			if len(firsts) < 2 {
				t.Fatalf("%d passes read, want a full pass and a head pass", len(firsts))
			}
			if got := w.Sub(firsts[1]); got != tc.want {
				t.Errorf("the head pass read from %s below the watermark, want %s", got, tc.want)
			}
		})
	}
}

// requestLog is a memTable that keeps every page request.
type requestLog struct {
	*memTable
	mu   sync.Mutex
	reqs []connector.PageRequest
}

func (l *requestLog) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	l.mu.Lock()
	l.reqs = append(l.reqs, req)
	l.mu.Unlock()
	return l.memTable.Page(ctx, req)
}

// passStarts is a memTable that records when each pass began (its first
// page: no cursor) and can make every pass take a while.
type passStarts struct {
	*memTable
	mu     sync.Mutex
	starts []time.Time
	slow   time.Duration
}

func (p *passStarts) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	if req.Cursor == "" {
		p.mu.Lock()
		p.starts = append(p.starts, time.Now())
		slow := p.slow
		p.mu.Unlock()
		time.Sleep(slow)
	}
	return p.memTable.Page(ctx, req)
}

// gaps waits for n more passes to start, then returns the times between
// the starts of those passes.
func (p *passStarts) gaps(t *testing.T, n int, slow time.Duration) []time.Duration {
	t.Helper()
	p.mu.Lock()
	p.slow = slow
	from := len(p.starts) + 1 // the pass in flight may have begun before slow
	p.mu.Unlock()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		p.mu.Lock()
		if len(p.starts) >= from+n+1 {
			var out []time.Duration
			for i := from + 1; i <= from+n; i++ {
				out = append(out, p.starts[i].Sub(p.starts[i-1]))
			}
			p.mu.Unlock()
			return out
		}
		p.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("%d passes did not start within 20s of wake-ups", n)
		}
	}
}

// medianDuration is the median of ds.
func medianDuration(ds []time.Duration) time.Duration {
	ds = slices.Clone(ds)
	slices.Sort(ds)
	return ds[len(ds)/2]
}

// TestMinPassGapSpacesPassStarts: under a steady stream of wake-ups, passes
// start at most once per MinPassGap, and a pass longer than that is followed
// by the next at once: the gap is between the starts of two passes, so it
// never adds to a pass that already took that long (waiting it out after
// every pass's end added it to every change's latency at high rates).
func TestMinPassGapSpacesPassStarts(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v1", false)
	src := &passStarts{memTable: m}
	wake := make(chan struct{}, 1)
	const gap = 100 * time.Millisecond
	e, _ := r.engine(src, connector.Config{PollInterval: time.Hour, Wake: wake, MinPassGap: gap})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	go keepWaking(ctx, wake)
	// Quick passes: one per gap, never sooner. The first page of a pass
	// is read a moment after the pass began, and that moment varies (by
	// more than the gap's tenth on a loaded machine): so the span of six
	// passes is checked, in which the delays of the passes between cancel
	// out, and the median.
	quick := src.gaps(t, 6, 0)
	var span time.Duration
	for _, d := range quick {
		span += d
	}
	if span < 6*gap-20*time.Millisecond || medianDuration(quick) < gap-10*time.Millisecond {
		t.Errorf("passes started %v apart under wake-ups (%s for six), below MinPassGap %s", quick, span, gap)
	}
	// Passes that take longer than the gap: back to back (a pass's
	// commit and the rest take some milliseconds besides the slow page;
	// counted from the end, the gap would make it 300 ms and more).
	const slow = 200 * time.Millisecond
	long := src.gaps(t, 6, slow)
	if d := medianDuration(long); d > slow+gap*7/10 {
		t.Errorf("passes of %s started a median %s apart (%v): the gap of %s was added after each pass's end", slow, d, long, gap)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// windowedTable is a memTable that bounds pages to windows
// (connector.Windower) and records the page requests.
type windowedTable struct {
	*memTable
	mu   sync.Mutex
	reqs []connector.PageRequest
}

func (w *windowedTable) Windows() bool { return true }

func (w *windowedTable) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	w.mu.Lock()
	w.reqs = append(w.reqs, req)
	w.mu.Unlock()
	return w.memTable.Page(ctx, req)
}

// TestFullPassWindowsScaleWithItsRows: a full pass that head passes may
// interrupt is cut into more windows the more rows its range holds (one
// per 2,000 entries of the dedupe set, at least 16), so that no window's
// statement, during which no head pass can run, reads much more than
// 2,000 rows; and the windows together read every row once.
func TestFullPassWindowsScaleWithItsRows(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	const rows = 40_000
	now := time.Now().UTC().Truncate(time.Microsecond)
	for i := range rows {
		m.set(fmt.Sprintf("k%05d", i), now.Add(-30*time.Second+time.Duration(i)*time.Millisecond/2), "v1", false)
	}
	src := &windowedTable{memTable: m}
	wake := make(chan struct{}, 1)
	e, _ := r.engine(src, connector.Config{PollInterval: 200 * time.Millisecond, Margin: time.Minute, PageSize: 1000, Wake: wake})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	// The first pass (no watermark: not windowed) publishes the rows;
	// the poll then starts full passes from W - margin, in windows.
	var windows map[time.Time]bool
	for deadline := time.Now().Add(30 * time.Second); windows == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			src.mu.Lock()
			t.Fatalf("no full pass was read in windows within 30s: %d page requests", len(src.reqs))
		}
		// The windows of a full pass that ended: its requests share
		// its lower bound; its last window is open above (Before
		// zero) and starts at a From.
		src.mu.Lock()
		byPass := map[time.Time]map[time.Time]bool{}
		for _, req := range src.reqs {
			if req.Since.IsZero() {
				continue
			}
			if byPass[req.Since] == nil {
				byPass[req.Since] = map[time.Time]bool{}
			}
			byPass[req.Since][req.From] = true
			if req.Before.IsZero() && !req.From.IsZero() {
				windows = byPass[req.Since]
				break
			}
		}
		src.mu.Unlock()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := len(windows); n < rows/2000 {
		t.Errorf("a full pass over %d rows was read in %d windows; want at least %d (one per 2,000 rows)", rows, n, rows/2000)
	}
	if d := dupes(r.assertFolded(m.expected())); len(d) > 0 {
		t.Errorf("published twice: %v", d)
	}
}

// slowWindowedTable is a windowedTable whose every page takes a while.
type slowWindowedTable struct {
	*windowedTable
	slow atomic.Int64 // a time.Duration
}

func (s *slowWindowedTable) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	time.Sleep(time.Duration(s.slow.Load()))
	return s.windowedTable.Page(ctx, req)
}

// TestFullPassReadsBetweenHeadPasses: under a steady stream of wake-ups, a
// full pass that head passes interrupt still reads for MinPassGap between
// two of them, counted from the end of the head pass: counted from its
// start, a head pass that took the gap was followed by the next after one
// page of the full pass, which then took a head pass per page to end (and
// the dedupe set held the margin's rows all the while).
func TestFullPassReadsBetweenHeadPasses(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	now := time.Now().UTC().Truncate(time.Microsecond)
	for i := range 2000 {
		m.set(fmt.Sprintf("k%05d", i), now.Add(-30*time.Second+time.Duration(i)*10*time.Millisecond), "v1", false)
	}
	const page, gap = 30 * time.Millisecond, 50 * time.Millisecond
	src := &slowWindowedTable{windowedTable: &windowedTable{memTable: m}}
	wake := make(chan struct{}, 1)
	e, _ := r.engine(src, connector.Config{PollInterval: 200 * time.Millisecond, Margin: time.Minute, PageSize: 1000, Wake: wake, MinPassGap: gap})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	waitSeq(t, r, 1) // the first pass, not windowed, published the rows
	src.slow.Store(int64(page))
	go keepWaking(ctx, wake)
	// Runs of full-pass pages (a window: From or Before set) between two
	// head passes (no window, Since above the full pass's).
	var runs []int
	for deadline := time.Now().Add(30 * time.Second); len(runs) < 8; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("fewer than 8 head passes interrupted full passes within 30s: %v", runs)
		}
		src.mu.Lock()
		runs = runs[:0]
		n, inFull := 0, false
		for _, req := range src.reqs {
			windowed := !req.From.IsZero() || !req.Before.IsZero()
			switch {
			case windowed:
				n++
				inFull = true
			case inFull && n > 0:
				runs = append(runs, n) // a head pass after n full-pass pages
				n = 0
			}
		}
		src.mu.Unlock()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// Pages of 30 ms and a gap of 50 ms: two pages between head passes
	// (the first run may follow the full pass's start instead).
	ones := 0
	for _, n := range runs[1:] {
		if n < 2 {
			ones++
		}
	}
	if ones > len(runs[1:])/2 {
		t.Errorf("a full pass read one page between most head passes (pages of %s, MinPassGap %s): runs %v", page, gap, runs)
	}
}

// keepWaking offers wake a wake-up every 2 ms until ctx ends: a steady
// stream of notifications.
func keepWaking(ctx context.Context, wake chan<- struct{}) {
	for ctx.Err() == nil {
		select {
		case wake <- struct{}{}:
		default:
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// TestPollIntervalSpacesPassStarts: without wake-ups, the poll interval is
// between the starts of two passes, so that a change waits at most the poll
// interval and one pass to be read; a pass longer than the interval is
// followed by the next at once. (Counted from a pass's end, a change
// committed just after a pass's snapshot would wait for that pass to end,
// the interval and the next pass.) The same holds with source.notify when
// no notification arrives (a quiet table, or notifications lost): polling
// is then the safety net, and a lost notification costs no more than it.
func TestPollIntervalSpacesPassStarts(t *testing.T) {
	for _, notify := range []bool{false, true} {
		t.Run(fmt.Sprintf("notify=%v", notify), func(t *testing.T) {
			r := newRig(t)
			m := newMemTable()
			m.set("a", t0, "v1", false)
			src := &passStarts{memTable: m}
			const poll = 300 * time.Millisecond
			cfg := connector.Config{PollInterval: poll}
			if notify {
				cfg.Wake = make(chan struct{}, 1) // never signalled
			}
			e, _ := r.engine(src, cfg)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
			// Passes shorter than the interval: one per interval (a
			// pass's commit and the rest take some milliseconds besides
			// the slow page: hence the tolerance, half-way to what
			// counting from the end gives).
			const short = 200 * time.Millisecond
			if d := medianDuration(src.gaps(t, 5, short)); d < poll-20*time.Millisecond || d > poll+short/2 {
				t.Errorf("passes of %s started a median %s apart; the poll interval is %s (from the end of a pass it would be %s)", short, d, poll, poll+short)
			}
			// Passes longer than the interval: back to back.
			const slow = 400 * time.Millisecond
			if d := medianDuration(src.gaps(t, 4, slow)); d > slow+poll/2 {
				t.Errorf("passes of %s started a median %s apart: the poll interval was added after each pass's end", slow, d)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestWokenPassIsFollowedUp: a pass that a wake-up started is followed,
// MinPassGap after it started, by one more pass that no wake-up started,
// and that one by another for as long as they publish rows. So a commit
// that sent no notification (the deferred trigger leaves the notifying to
// another committing transaction: docs/design.md, "One notifier at a
// time") and came
// after the woken pass read the table is published at once, not a poll
// interval later. A follow-up that publishes nothing is the last.
func TestWokenPassIsFollowedUp(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v1", false)
	src := &committedAfterRead{passStarts: &passStarts{memTable: m}}
	wake := make(chan struct{}, 1)
	e, _ := r.engine(src, connector.Config{PollInterval: time.Hour, Wake: wake, MinPassGap: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	waitSeq(t, r, 1) // the first (full) pass
	time.Sleep(300 * time.Millisecond)
	before := src.count()
	if before != 1 {
		t.Fatalf("%d passes before the wake-up, want the first one only (no wake-up started it)", before)
	}
	// The woken pass reads b; c commits just after it read, d just after
	// the next pass read.
	src.mu.Lock()
	src.after = []string{"c", "d"}
	src.mu.Unlock()
	m.set("b", time.Now(), "v1", false)
	at := time.Now()
	wake <- struct{}{}
	want := map[string]string{}
	for _, k := range []string{"a", "b", "c", "d"} {
		want[k] = fmt.Sprintf(`{"id":%q,"v":"v1"}`, k)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		got := r.assertFoldedQuiet()
		if maps.Equal(got, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the topic holds %v 5s after the wake-up, want %v (poll interval 1h): rows committed after the woken pass read were left for the poll", got, want)
		}
	}
	t.Logf("c and d published %s after the wake-up", time.Since(at).Round(time.Millisecond))
	// The woken pass, the follow-up that read c, the one that read d,
	// and one that read nothing: then no more.
	time.Sleep(time.Second)
	if n := src.count() - before; n != 4 {
		t.Errorf("%d passes after one wake-up, want 4 (the woken one, two follow-ups that published, one that did not)", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// committedAfterRead is a passStarts that, once a pass has read its last
// page, sets the next row of after: a commit that the pass missed.
type committedAfterRead struct {
	*passStarts
	after []string
}

func (c *committedAfterRead) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	p, err := c.passStarts.Page(ctx, req)
	if err == nil && (p.End || p.Last) {
		c.mu.Lock()
		var id string
		if len(c.after) > 0 {
			id, c.after = c.after[0], c.after[1:]
		}
		c.mu.Unlock()
		if id != "" {
			c.set(id, time.Now(), "v1", false)
		}
	}
	return p, err
}

func (p *passStarts) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.starts)
}

// TestGapTakesAtMostOneWakeUp: before a follow-up, one wake-up that arrives
// during its gap is taken, and no second one, and the follow-up is then
// followed in turn; before a woken pass, none (its own was taken). A
// wake-up left waiting is what lets the listener hold further
// notifications unread (docs/design.md, "Follow-up passes").
func TestGapTakesAtMostOneWakeUp(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v1", false)
	src := &passEnds{passStarts: &passStarts{memTable: m}}
	wake := make(chan struct{}, 1)
	const gap = 3 * time.Second
	e, _ := r.engine(src, connector.Config{PollInterval: time.Hour, Wake: wake, MinPassGap: gap})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	// send puts a wake-up in the channel, as the listener does; takeBack
	// takes one out again.
	send := func(what string) {
		select {
		case wake <- struct{}{}:
		default:
			t.Fatalf("%s: the wake-up channel is full", what)
		}
	}
	takeBack := func() {
		select {
		case <-wake:
		default:
		}
	}
	// sendLook sends a wake-up, and reports whether the wake-ups left in
	// the channel a moment later are want; why says what it means if not.
	sendLook := func(what string, want int, why string) bool {
		t.Helper()
		send(what)
		time.Sleep(150 * time.Millisecond)
		if n := len(wake); n != want {
			t.Errorf("%s: %d wake-ups waiting, want %d: %s", what, n, want, why)
			return false
		}
		return true
	}
	// within fails the test unless pass i (from 1) began less than gap
	// ago, less a margin: the checks before it ran during the gap after it.
	within := func(i int, what string) {
		t.Helper()
		if n, at := src.count(), src.start(i); n != i || time.Since(at) > gap-time.Second {
			t.Fatalf("%d passes, %s after pass %d began: the checks did not run within %s (%s)", n, time.Since(at).Round(time.Millisecond), i, what, gap)
		}
	}

	// The first (full) pass; no wake-up started it. Once it has ended, a
	// wake-up starts the next pass gap after it began; the engine waits for
	// that with the wake-up taken, so it takes no other.
	src.waitEnd(t, 1)
	if !sendLook("the first wake-up", 0, "the idle engine did not take it") {
		t.FailNow()
	}
	sendLook("a second wake-up during the woken pass's gap", 1, "the gap before a woken pass took it")
	within(1, "the woken pass's gap")
	takeBack() // so that the woken pass is the only one

	// The woken pass is followed by one more, gap after it began. One
	// wake-up during that gap is taken (the follow-up reads what it
	// announced), a second is not.
	src.waitEnd(t, 2)
	sendLook("a wake-up during the follow-up's gap", 0, "the follow-up's gap did not take the wake-up that arrived during it")
	sendLook("a second wake-up during the follow-up's gap", 1, "the follow-up's gap took it too")
	within(2, "the follow-up's gap")
	takeBack()

	// The follow-up publishes nothing (no row changed), but it took a
	// wake-up: it is followed in turn.
	src.waitEnd(t, 3)
	for deadline := src.start(3).Add(gap + 2*time.Second); src.count() < 4; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no pass after the follow-up that took a wake-up in its gap (%d passes)", src.count())
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// passEnds is a passStarts that also records when each pass read its last
// page.
type passEnds struct {
	*passStarts
	ends []time.Time
}

func (p *passEnds) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	pg, err := p.passStarts.Page(ctx, req)
	if err == nil && (pg.End || pg.Last) {
		p.mu.Lock()
		p.ends = append(p.ends, time.Now())
		p.mu.Unlock()
	}
	return pg, err
}

// start is when pass i (from 1) began.
func (p *passEnds) start(i int) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.starts[i-1]
}

// waitEnd waits until pass i (from 1) has read its last page, and then a
// moment for its commit: the engine is then between passes.
func (p *passEnds) waitEnd(t *testing.T, i int) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		p.mu.Lock()
		n := len(p.ends)
		p.mu.Unlock()
		if n >= i {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pass %d did not end within 20s", i)
		}
	}
	time.Sleep(300 * time.Millisecond)
}
