package integration

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// Head passes during a full pass (docs/design.md, "Head passes during a
// full pass"): with notifications on, a full pass is read in windows of
// updated_at, and a notification that arrives between two of its pages
// runs a head pass there, so that a change does not wait for the margin's
// index range to be read.

// TestNotifyHeadPassesRunDuringAFullPass: a row written while a full pass
// runs is read by a head pass before the full pass's next page.
func TestNotifyHeadPassesRunDuringAFullPass(t *testing.T) {
	w := newNotifyWorldWith(t, connector.Config{PollInterval: 500 * time.Millisecond, Margin: time.Minute})
	w.insert(0) // a watermark to start from
	w.waitPublished(t, 10*time.Second)
	fired := make(chan connector.PageRequest, 1)
	var once atomic.Bool
	w.src.mu.Lock()
	w.src.onPage = func(_ context.Context, req connector.PageRequest) {
		// A later window of a full pass: a row is written, and its
		// notification is given time to arrive.
		if req.From.IsZero() || req.Cursor != "" || !once.CompareAndSwap(false, true) {
			return
		}
		w.insert(1)
		time.Sleep(300 * time.Millisecond)
		fired <- req
	}
	w.src.mu.Unlock()
	var at connector.PageRequest
	select {
	case at = <-fired:
	case <-time.After(10 * time.Second):
		t.Fatal("no full pass was read in windows of updated_at (PageRequest.From) within 10 s")
	}
	w.waitPublished(t, 10*time.Second)
	w.src.mu.Lock()
	reqs := slices.Clone(w.src.reqs)
	w.src.mu.Unlock()
	i := slices.IndexFunc(reqs, func(r connector.PageRequest) bool {
		return r.Cursor == "" && r.From.Equal(at.From) && r.Since.Equal(at.Since)
	})
	var next []string
	for _, r := range reqs[i+1:] {
		kind := "head"
		if r.Since.Equal(at.Since) {
			kind = "full"
		}
		if len(next) == 0 || next[len(next)-1] != kind {
			next = append(next, kind)
		}
	}
	if len(next) < 2 || next[0] != "head" || next[1] != "full" {
		t.Fatalf("after the window page during which the row was written, the pages went %v: want a head pass, then the rest of the full pass", next)
	}
	rig.AssertNoDupes(t, w.r.Fold())
}

// openWriter is a transaction that wrote one row dated at its start and
// stays open; commit may be called from any goroutine.
type openWriter struct {
	t  *testing.T
	tx pgx.Tx
	at time.Time
}

func beginLate(t *testing.T, r *rig.Rig, id int) *openWriter {
	t.Helper()
	ctx := context.Background()
	tx, err := r.DB.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	lw := &openWriter{t: t, tx: tx}
	if err := tx.QueryRow(ctx, `INSERT INTO items (id, updated_at, v) VALUES ($1, now(), 'late') RETURNING updated_at`, id).Scan(&lw.at); err != nil {
		t.Fatal(err)
	}
	return lw
}

func (lw *openWriter) commit() {
	if err := lw.tx.Commit(context.Background()); err != nil {
		lw.t.Errorf("commit the late row: %v", err)
	}
}

// TestNotifyLateCommitDuringAFullPass: a row dated tl commits while a full
// pass runs, after the pass read its place, and within the margin of tl.
// Head passes run between the full pass's later pages and move W past tl
// plus the margin, and no head pass reads below W less the lookback. The next full pass
// must still read from no later than the clock at that full pass's start,
// less the margin, and publish the row (reading from W less the margin,
// it would never be read).
func TestNotifyLateCommitDuringAFullPass(t *testing.T) {
	const margin = 4 * time.Second
	w := newNotifyWorldWith(t, connector.Config{PollInterval: 700 * time.Millisecond, Margin: margin})
	w.insert(0) // a watermark to start from
	w.waitPublished(t, 10*time.Second)
	late := beginLate(t, w.r, 1000)
	// A row after it moves W past it: no head pass reads it from now on.
	time.Sleep(200 * time.Millisecond)
	w.insert(500)
	waitFor(t, 10*time.Second, "the row after the late one published", func() bool {
		_, ok := w.r.Fold().Live["500"]
		return ok
	})
	var (
		mu          sync.Mutex
		committed   time.Time
		fullSince   time.Time
		id          = 1
		lastWindow  bool
		headsDuring int
		ended       = make(chan struct{})
		endOnce     sync.Once
		// began is when the first page of the last pass from each lower
		// bound was read.
		began = map[time.Time]time.Time{}
	)
	w.src.mu.Lock()
	w.src.onPage = func(_ context.Context, req connector.PageRequest) {
		mu.Lock()
		defer mu.Unlock()
		if req.Cursor == "" && !req.From.After(req.Since) {
			began[req.Since] = time.Now() // a pass's first page (of its first window)
		}
		switch {
		case committed.IsZero():
			// The first window above the late row's of a full pass that
			// began 2.8 to 3.9 s after it: the pass has read the row's
			// place, the commit is within the margin, and several
			// windows lie above the row. (A pass that began sooner,
			// and read that window 2.8 s after the row, has too few
			// windows left above it.)
			if req.Cursor != "" || !req.From.After(late.at) || req.Since.After(late.at) {
				return
			}
			if d := began[req.Since].Sub(late.at); d < 2800*time.Millisecond || d > 3900*time.Millisecond {
				return
			}
			late.commit()
			committed, fullSince = time.Now(), req.Since
			t.Logf("committed at the window from %s (width %s); the full pass reads from %s",
				req.From.Sub(late.at), req.Before.Sub(req.From), req.Since.Sub(late.at))
		case req.Since.Equal(fullSince) && !req.From.IsZero() && req.Before.IsZero():
			lastWindow = true
		case req.Since.Equal(fullSince) && !req.From.IsZero():
			// Every later window of that pass but the last: a row
			// written, then time for its notification and for the head
			// pass after this page to start from a later clock, past the
			// late row's margin (a loaded machine leaves few windows
			// above the late row by the time it commits).
			w.insert(id)
			id++
			time.Sleep(max(700*time.Millisecond, time.Until(late.at.Add(margin+300*time.Millisecond))))
		case !req.Since.Equal(fullSince) && lastWindow:
			endOnce.Do(func() { close(ended) }) // a pass after the full pass
		case !req.Since.Equal(fullSince) && req.Cursor == "":
			headsDuring++
		}
	}
	w.src.mu.Unlock()
	select {
	case <-ended:
	case <-time.After(30 * time.Second):
		t.Fatal("no full pass read a window above the late row, and ended, within 30 s")
	}
	// No row is written after the full pass, so W now is the W it left.
	wm, err := schemas.ParseTime(w.r.Checkpoint().Watermark)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	c, heads := committed, headsDuring
	mu.Unlock()
	t.Logf("late row committed %s after its updated_at; %d head passes during the full pass moved W %s past it",
		c.Sub(late.at).Round(time.Millisecond), heads, wm.Sub(late.at).Round(time.Millisecond))
	if c.Sub(late.at) > margin || heads == 0 || wm.Sub(late.at) <= margin {
		t.Fatal("the timing did not set up the case (committed within the margin, head passes during the full pass moved W more than the margin past it): the test proves nothing")
	}
	w.waitPublished(t, 15*time.Second)
	w.r.AssertTable()
	rig.AssertNoDupes(t, w.r.Fold())
}

// TestNotifyRestartAfterAHeadPassDuringAFullPass: a full pass publishes a
// late commit (a row no head pass could read), then a head pass runs
// between two of its pages and commits, and the connector stops before
// the full pass commits again. The checkpoint then says idle, and the
// next run's first pass is full again and reads the late row again: the
// dedupe set must know it, so the full pass may not have settled it by its
// own mark.
func TestNotifyRestartAfterAHeadPassDuringAFullPass(t *testing.T) {
	r := itemsWithTrigger(t)
	cfg := connector.Config{PollInterval: 1500 * time.Millisecond, Margin: 3 * time.Second, MinPassGap: 20 * time.Millisecond}
	run := func(src *passCounter) (cancel context.CancelFunc, stop func()) {
		return startEngine(t, r, src, cfg, "items_changes")
	}
	src := &passCounter{Source: r.Src}
	cancel, stop := run(src)
	time.Sleep(time.Second)
	late := beginLate(t, r, 1000)
	for id := 1; id <= 3; id++ {
		r.Exec(`INSERT INTO items (id, v) VALUES ($1, 'on time')`, id)
		time.Sleep(100 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "the three rows published", func() bool { return len(r.Fold().Live) == 3 })
	late.commit()
	var (
		mu        sync.Mutex
		step      int // 1: the row written between pages; 2: a head pass ran; 3: stopped
		fullSince time.Time
		stopped   = make(chan struct{})
	)
	src.mu.Lock()
	src.onPage = func(_ context.Context, req connector.PageRequest) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case step == 0:
			// A window of a full pass above the late row's: the row is
			// read and published (it commits before the head pass).
			if req.Cursor != "" || !req.From.After(late.at.Add(100*time.Millisecond)) || req.Since.After(late.at) {
				return
			}
			r.Exec(`INSERT INTO items (id, v) VALUES (4, 'during the full pass')`)
			time.Sleep(300 * time.Millisecond)
			step, fullSince = 1, req.Since
		case step == 1 && !req.Since.Equal(fullSince):
			step = 2 // the head pass between the pages
		case step == 2 && req.Since.Equal(fullSince):
			// The full pass goes on: stop here, before it commits again.
			step = 3
			cancel()
			close(stopped)
		}
	}
	src.mu.Unlock()
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("no head pass ran between two pages of a full pass within 30 s (step %d)", step)
	}
	stop()
	if _, ok := r.Fold().Live["1000"]; !ok {
		t.Fatal("the full pass did not publish the late row before the head pass")
	}
	if cp := r.Checkpoint(); cp.Phase != schemas.PhaseIdle {
		t.Fatalf("the last checkpoint is in phase %q, want the head pass's end (idle)", cp.Phase)
	}
	// The first pass of the next run is full, from the last full pass's
	// W less the margin: it reads the late row again.
	src2 := &passCounter{Source: r.Src}
	_, stop = run(src2)
	waitFor(t, 15*time.Second, "the late row read again after the restart", func() bool { return src2.times("1000") > 0 })
	time.Sleep(500 * time.Millisecond) // the pass ends and commits
	stop()
	r.AssertTable()
	rig.AssertNoDupes(t, r.Fold())
}

// TestNotifyHeadPassDuringAFullPassOverABacklog: the connector was stopped
// while rows were written over more than the margin above W (their
// notifications lost). The first full pass after the restart reads them in
// windows; a head pass between two of its pages reads from W (less the
// head lookback) again, below
// rows the full pass has published, and the dedupe set must still know
// them: its floor may not follow the full pass's own progress while head
// passes may run inside it. (The wake-ups come from the test, not from a
// listener, whose wake-up at connect would run a head pass before the
// full pass has read anything.)
func TestNotifyHeadPassDuringAFullPassOverABacklog(t *testing.T) {
	const margin = 2 * time.Second
	r := newRig(t, "", "items")
	wake := make(chan struct{}, 1)
	run := func(src *passCounter) (stop func()) {
		_, stop = startEngine(t, r, src, connector.Config{PollInterval: time.Hour, Margin: margin, Wake: wake}, "")
		return stop
	}
	r.Exec(`INSERT INTO items (id, v) VALUES (0, 'first')`)
	stop := run(&passCounter{Source: r.Src})
	waitFor(t, 10*time.Second, "the first row published", func() bool { return len(r.Fold().Live) == 1 })
	stop()
	w, err := schemas.ParseTime(r.Checkpoint().Watermark)
	if err != nil {
		t.Fatal(err)
	}
	// Rows dated from W to W + 3 margins, one every 100 ms, written while
	// the connector is stopped; then the clock passes them.
	for i := 1; i <= 60; i++ {
		r.Exec(`INSERT INTO items (id, updated_at, v) VALUES ($1, $2, 'backlog')`, i, w.Add(time.Duration(i)*100*time.Millisecond))
	}
	time.Sleep(time.Until(w.Add(6500 * time.Millisecond)))
	src := &passCounter{Source: r.Src}
	var fired atomic.Bool
	src.onPage = func(_ context.Context, req connector.PageRequest) {
		// A window of the first full pass well past W + margin: a row
		// is written and a wake-up sent.
		if req.From.After(w.Add(2*margin)) && fired.CompareAndSwap(false, true) {
			r.Exec(`INSERT INTO items (id, v) VALUES (1000, 'during the full pass')`)
			wake <- struct{}{}
		}
	}
	stop = run(src)
	waitFor(t, 15*time.Second, "every row published", func() bool { return len(r.Fold().Live) == 62 })
	stop()
	if !fired.Load() {
		t.Fatal("the full pass after the restart was not read in windows")
	}
	src.mu.Lock()
	heads := 0
	for _, q := range src.reqs {
		if q.Since.Equal(w.Add(-connector.DefaultHeadLookback)) {
			heads++
		}
	}
	src.mu.Unlock()
	if heads == 0 {
		t.Fatal("no head pass read from W less the lookback during the full pass")
	}
	r.AssertTable()
	rig.AssertNoDupes(t, r.Fold())
}

// startEngine runs a continuous engine over src with cfg until stop (also
// called at cleanup; cancel only cancels). With a channel, the wake-ups
// come from a Listener on it.
func startEngine(t *testing.T, r *rig.Rig, src connector.Source, cfg connector.Config, channel string) (cancel context.CancelFunc, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var l *postgres.Listener
	if channel != "" {
		var err error
		if l, err = postgres.Listen(ctx, r.PG, postgres.ListenConfig{Channel: channel, Logger: rig.Logger(t)}); err != nil {
			cancel()
			t.Fatal(err)
		}
		cfg.Wake = l.Wake()
	}
	e := r.Engine(src, cfg)
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("run: %v", err)
			}
			if l != nil {
				l.Close()
			}
		})
	}
	t.Cleanup(stop)
	return cancel, stop
}
