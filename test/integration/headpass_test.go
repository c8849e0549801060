package integration

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// Head passes (docs/design.md, "Head passes"): with notifications on, a
// pass that a notification starts between two full passes reads from W
// less the head lookback, not from W - margin; the pass the poll timer
// starts is full and catches the late commits below that.

// lastFirst is the first page request of the latest pass.
func (p *passCounter) lastFirst() connector.PageRequest {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.firsts[len(p.firsts)-1]
}

// TestNotifyPassesStartAtTheWatermark: a pass started by a notification
// reads from the watermark less the head lookback (a tenth of a second),
// so that its cost is the rows written since the last pass, not the
// margin's worth of the index.
func TestNotifyPassesStartAtTheWatermark(t *testing.T) {
	obs := &headObserver{}
	w := newNotifyWorldWith(t, connector.Config{PollInterval: time.Hour, Observer: obs})
	w.insert(1)
	w.waitPublished(t, 10*time.Second)
	before := w.src.settled(t, 300*time.Millisecond)
	wm := w.r.Checkpoint().Watermark
	if wm == "" {
		t.Fatal("no watermark after the first row was published")
	}
	w.insert(2)
	w.waitPublished(t, 10*time.Second)
	if n := w.src.settled(t, 300*time.Millisecond); n == before {
		t.Fatal("the notification started no pass")
	}
	w.src.mu.Lock()
	req := w.src.firsts[before]
	w.src.mu.Unlock()
	w0, err := schemas.ParseTime(wm)
	if err != nil {
		t.Fatal(err)
	}
	if want := w0.Add(-connector.DefaultHeadLookback); !req.Since.Equal(want) {
		t.Errorf("the pass a notification started read from %s, want the watermark %s less the head lookback %s (not %s below it)",
			req.Since.Format(time.RFC3339Nano), wm, connector.DefaultHeadLookback, w0.Sub(req.Since))
	}
	if n := obs.heads.Load(); n == 0 {
		t.Error("no committed pass was reported as a head pass (CommitInfo.HeadPass)")
	}
	rig.AssertNoDupes(t, w.r.Fold())
}

// headObserver counts the committed ends of head passes.
type headObserver struct {
	connector.NopObserver
	heads atomic.Int64
}

func (o *headObserver) ObserveCommit(c connector.CommitInfo) {
	if c.PassEnded && c.HeadPass {
		o.heads.Add(1)
	}
}

// TestNotifyLateCommitReachesTheFullPass: a row dated below W less the
// head lookback when it commits (a transaction that began before the rows
// the passes since read) is not read by the notification's pass, which
// starts there; the next full pass, at most a poll interval later,
// publishes it exactly once.
func TestNotifyLateCommitReachesTheFullPass(t *testing.T) {
	w := newNotifyWorldWith(t, connector.Config{PollInterval: 1500 * time.Millisecond})
	w.src.settled(t, 300*time.Millisecond)
	late := beginLate(t, w.r, 1000)
	time.Sleep(100 * time.Millisecond)
	for id := 1; id <= 5; id++ {
		w.insert(id)
		time.Sleep(30 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "the five rows published", func() bool { return len(w.r.Fold().Live) == 5 })
	if wm, err := schemas.ParseTime(w.r.Checkpoint().Watermark); err != nil || !wm.After(late.at) {
		t.Fatalf("the watermark %v (%v) is not past the late row's updated_at %s", wm, err, late.at)
	}
	late.commit()
	w.waitPublished(t, 10*time.Second)
	rig.AssertNoDupes(t, w.r.Fold())
}

// TestNotifyHeadPassReadsALateCommitWithinTheLookback: a writer commits a
// row dated a few milliseconds before rows that head passes have already
// published (the common late commit under concurrent writers: its
// transaction began first and committed last). The next head pass reads
// from the watermark less the lookback and publishes it, once; no full
// pass runs (the poll interval is an hour), so without the lookback it
// would wait for one.
func TestNotifyHeadPassReadsALateCommitWithinTheLookback(t *testing.T) {
	const lookback = 2 * time.Second
	w := newNotifyWorldWith(t, connector.Config{PollInterval: time.Hour, HeadLookback: lookback})
	w.insert(1) // the first pass, full, leaves a watermark
	w.waitPublished(t, 10*time.Second)
	w.src.settled(t, 300*time.Millisecond)
	late := beginLate(t, w.r, 1000)
	w.insert(2)
	w.insert(3)
	waitFor(t, 10*time.Second, "rows 2 and 3 published by a head pass", func() bool {
		return len(w.r.Fold().Live) == 3 && w.r.Checkpoint().HeadsSinceFull
	})
	cp := w.r.Checkpoint()
	wm, err := schemas.ParseTime(cp.Watermark)
	if err != nil || !wm.After(late.at) {
		t.Fatalf("the watermark %v (%v) is not past the late row's updated_at %s", wm, err, late.at)
	}
	if gap := wm.Sub(late.at); gap >= lookback {
		t.Fatalf("the setup took %s: the late row is not within the lookback %s below the watermark", gap, lookback)
	}
	var at2 time.Time
	if err := w.r.DB.Pool.QueryRow(context.Background(), `SELECT updated_at FROM items WHERE id = 2`).Scan(&at2); err != nil {
		t.Fatal(err)
	}
	before := w.src.times("2")
	late.commit()
	w.waitPublished(t, 10*time.Second)
	if cp := w.r.Checkpoint(); !cp.HeadsSinceFull {
		t.Error("a full pass ran: the late row must be published by a head pass")
	}
	// Row 2, dated below W and written after the open writer began (so
	// no mark skips it), lies within the lookback: the head pass that
	// read the late row read it again, and the dedupe set must drop it.
	if at2.Before(wm) && w.src.times("2") == before {
		t.Errorf("row 2, dated %s below the watermark, was not read again: no pass read the lookback", wm.Sub(at2))
	}
	rig.AssertNoDupes(t, w.r.Fold())
}

// TestNotifyFullPassDedupesWhatHeadPassesPublished: head passes move W
// far past the last full pass's W + margin; the next full pass without
// their steps (as after a restart) reads again, from that full pass's W -
// margin, every row they published, and must recognise each one (the
// dedupe set may not forget rows the next full pass may read).
func TestNotifyFullPassDedupesWhatHeadPassesPublished(t *testing.T) {
	w := newNotifyWorldWith(t, connector.Config{PollInterval: 2500 * time.Millisecond, Margin: 200 * time.Millisecond})
	w.src.mu.Lock()
	w.src.noSteps = true
	w.src.mu.Unlock()
	w.src.settled(t, 300*time.Millisecond)
	start := w.src.count()
	for id := 1; id <= 30; id++ {
		w.insert(id)
		time.Sleep(40 * time.Millisecond)
	}
	w.waitPublished(t, 10*time.Second)
	deduped := w.r.Checkpoint().Counters.Deduped
	// Wait for the full pass the poll timer starts.
	waitFor(t, 10*time.Second, "a full pass after the head passes", func() bool {
		return w.r.Checkpoint().Counters.Deduped > deduped
	})
	if w.src.count()-start < 3 {
		t.Fatalf("%d passes ran for 30 notifications", w.src.count()-start)
	}
	w.waitPublished(t, 10*time.Second)
	rig.AssertNoDupes(t, w.r.Fold())
}

// TestNotifyLateCommitAcrossARestart: the late row commits after head
// passes moved W past it, and the connector stops before any full pass;
// the next run's first pass is full and publishes the row exactly once.
// (A full pass that skipped by the last head pass's mark would skip the
// row for good.)
func TestNotifyLateCommitAcrossARestart(t *testing.T) {
	r := itemsWithTrigger(t)
	// run starts a continuous engine with notifications, polling once an
	// hour; stop stops it (also at the end of the test).
	run := func() (src *passCounter, stop func()) {
		src = &passCounter{Source: r.Src}
		_, stop = startEngine(t, r, src, connector.Config{PollInterval: time.Hour, MinPassGap: 20 * time.Millisecond}, "items_changes")
		return src, stop
	}
	src, stop := run()
	src.settled(t, 300*time.Millisecond)
	late := beginLate(t, r, 1000)
	// Beyond the head lookback (100 ms) below the rows after it.
	time.Sleep(connector.DefaultHeadLookback + 200*time.Millisecond)
	for id := 1; id <= 3; id++ {
		r.Exec(`INSERT INTO items (id, v) VALUES ($1, 'on time')`, id)
		time.Sleep(30 * time.Millisecond)
	}
	waitFor(t, 10*time.Second, "the three rows published", func() bool { return len(r.Fold().Live) == 3 })
	n := src.settled(t, 300*time.Millisecond)
	late.commit()
	// The late row's notification starts a pass from W less the
	// lookback, past the row.
	waitFor(t, 10*time.Second, "the pass the late commit's notification starts", func() bool { return src.settled(t, 300*time.Millisecond) > n })
	if since := src.lastFirst().Since; !since.After(late.at) {
		t.Fatalf("the pass after the late commit read from %s, at or below the late row's %s: it is not a head pass", since, late.at)
	}
	stop()
	if _, ok := r.Fold().Live["1000"]; ok {
		t.Fatal("a head pass published the late row dated below where it read from")
	}
	if cp := r.Checkpoint(); !cp.HeadsSinceFull || cp.FullMark == "" || cp.FullMark == cp.SeenMark {
		t.Fatalf("the checkpoint does not keep the last full pass's mark apart: heads_since_full %v, full_mark %q, seen_mark %q", cp.HeadsSinceFull, cp.FullMark, cp.SeenMark)
	}

	_, stop = run()
	waitFor(t, 10*time.Second, "the late row published after the restart", func() bool {
		_, ok := r.Fold().Live["1000"]
		return ok
	})
	stop()
	r.AssertTable()
	rig.AssertNoDupes(t, r.Fold())
}

// TestNotifyHeadPassesGoOn: head passes go on until a poll interval has
// passed since the last full pass, however many rows they read: one row
// per notification, thirty of them, with a page of ten. (A full pass in
// their place reads the margin's index range each time.) The full pass
// after them leaves out what they read (PageRequest.Steps): it reads
// again the last head pass's rows at most.
func TestNotifyHeadPassesGoOn(t *testing.T) {
	w := newNotifyWorldWith(t, connector.Config{PollInterval: 3 * time.Second, Margin: time.Minute, PageSize: 10})
	w.src.settled(t, 300*time.Millisecond)
	first := w.src.count()
	raw := w.r.Checkpoint().Counters.Raw
	for id := 1; id <= 30; id++ {
		w.insert(id)
		time.Sleep(40 * time.Millisecond)
	}
	w.waitPublished(t, 10*time.Second)
	wm, err := schemas.ParseTime(w.r.Checkpoint().Watermark)
	if err != nil {
		t.Fatal(err)
	}
	// A full pass reads from the last full pass's W - margin, a minute
	// below; wait for the one the poll timer starts.
	full := func(req connector.PageRequest) bool { return req.Since.Before(wm.Add(-30 * time.Second)) }
	waitFor(t, 10*time.Second, "a full pass after the head passes", func() bool {
		return w.src.count() > first && full(w.src.lastFirst())
	})
	w.src.settled(t, 300*time.Millisecond)
	w.src.mu.Lock()
	fulls, passes := 0, len(w.src.firsts)-first
	for _, req := range w.src.firsts[first:] {
		if full(req) {
			fulls++
		}
	}
	w.src.mu.Unlock()
	// The poll timer's, and one more if it struck during the writes.
	if fulls > 2 {
		t.Errorf("%d of %d passes were full: head passes stopped after a page of rows", fulls, passes)
	}
	if read := w.r.Checkpoint().Counters.Raw - raw; read > int64(30+3*fulls) {
		t.Errorf("%d passes (%d full) read %d rows for 30 rows written one by one: a full pass read again what the head passes had read", passes, fulls, read)
	}
	w.waitPublished(t, 10*time.Second)
	rig.AssertNoDupes(t, w.r.Fold())
}

// TestNotifySlowFullPassesLeaveRoomForHeadPasses: a full pass that takes
// longer than the poll interval (the margin's index range of a busy
// table, on a loaded server) is followed by head passes, not by another
// full pass at once: the poll interval counts from the end of the last
// full pass. Otherwise every pass is a slow full pass and every change
// waits for one.
func TestNotifySlowFullPassesLeaveRoomForHeadPasses(t *testing.T) {
	w := newNotifyWorldWith(t, connector.Config{PollInterval: 300 * time.Millisecond, Margin: time.Minute})
	time.Sleep(500 * time.Millisecond) // the first pass
	w.src.mu.Lock()
	w.src.slowBelow, w.src.slow = time.Now().Add(-30*time.Second), 500*time.Millisecond
	w.src.mu.Unlock()
	first := w.src.count()
	for id := 1; id <= 40; id++ {
		w.insert(id)
		time.Sleep(50 * time.Millisecond)
	}
	w.waitPublished(t, 10*time.Second)
	w.src.mu.Lock()
	heads, passes := 0, len(w.src.firsts)-first
	for _, req := range w.src.firsts[first:] {
		if !req.Since.Before(w.src.slowBelow) {
			heads++
		}
	}
	w.src.mu.Unlock()
	// 2 s of writes: at most 3 full passes of 0.5 s, each followed by
	// 0.3 s of head passes, one per 50 ms write.
	if heads < 8 {
		t.Errorf("%d of %d passes during 2 s of writes were head passes: slow full passes followed each other", heads, passes)
	}
	rig.AssertNoDupes(t, w.r.Fold())
}
