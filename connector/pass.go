package connector

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/tidemark/tidemark/failpoint"
	"github.com/tidemark/tidemark/schemas"
)

// pass runs one pass to the end of the source, resuming an open pass from
// the checkpoint, and commits its end. It returns nil once the end of the
// pass is committed, or when ctx is cancelled after the open transaction was
// finished.
func (e *Engine) pass(ctx context.Context) error {
	e.passStarted = time.Now()
	src := e.src
	now, err := e.reshapeNow(ctx)
	if err != nil {
		return err
	}
	// The clock was read during reshapeNow, which may also inspect a
	// changed shape, and that takes a while: the host's time before the
	// call errs on the side of a later server clock, so that no row is
	// taken for future-dated because of it.
	e.clockAt, e.clockThen = now, e.passStarted
	e.future, e.futureID = 0, ""
	head := e.headNext()
	if e.cp.Phase == schemas.PhaseLoad || e.cp.Phase == schemas.PhaseIdle && e.cp.Watermark == "" && e.keyOrdered() {
		return e.keyLoad(ctx, now)
	}
	fresh := false
	// A pass reads its pages in a consistent view when the source has one
	// (docs/design.md, "A pass reads one snapshot"): it reads the source
	// as it was when it began, and what commits meanwhile is the next
	// pass's, so it does not chase the writers. The view is given back
	// before every commit, so that its locks and snapshot do not wait on
	// Kafka, and the next page opens a new one: a later snapshot, which
	// a pass may always read on in (a head pass between two pages of a
	// full pass needs one).
	var view PassView
	_, viewer := e.src.(Viewer)
	openView := func() error {
		// Only a pass: the consistent load reads in its own snapshot.
		if !viewer || view != nil || e.cp.Phase != schemas.PhasePass {
			return nil
		}
		v, err := e.src.(Viewer).OpenView(ctx)
		if err != nil {
			return staged("source", err)
		}
		view = v
		return nil
	}
	closeView := func() {
		closeViewOf(ctx, view)
		view = nil
	}
	defer closeView()
	switch e.cp.Phase {
	case schemas.PhasePass:
		// Resume the open pass at its stored cursor and lower bound, in a
		// view of the source now.
		if err := openView(); err != nil {
			return err
		}
	case schemas.PhaseSnapshot:
		// Resume the consistent load at its committed cursor under a new
		// snapshot. The watermark it hands over stays the first
		// snapshot's start (PassHorizon): a row changed since then is
		// read again by the incremental passes from there minus the
		// margin, and every row after the cursor is read in its state
		// now (docs/design.md, "Consistent initial load").
		sn, ok := src.(Snapshotter)
		if !ok {
			return fmt.Errorf("the checkpoint holds an open consistent load, but the source %T cannot hold a snapshot: %w", src, ErrPermanent)
		}
		snap, err := sn.Snapshot(ctx)
		if err != nil {
			return staged("source", fmt.Errorf("open a new snapshot to resume the consistent initial load: %w", err))
		}
		defer snap.Close(context.WithoutCancel(ctx))
		src = snap
		e.log.Info("resuming the consistent initial load under a new snapshot", "cursor", e.cp.Cursor, "watermark_after_load", e.cp.PassHorizon)
	default:
		// The watermark this pass may reach is capped by the source's
		// clock now: a row dated in the future is published but never
		// drags W ahead of real time. In horizon mode the oldest open
		// writer is sampled too, before anything is read: a writer still
		// open then caps W at its start; one that starts later writes
		// updated_at >= the sample's clock, which also caps W.
		var h Horizon
		if e.cfg.Horizon {
			var err error
			if h, err = e.src.(Horizoner).Horizon(ctx); err != nil {
				return staged("source", fmt.Errorf("sample horizon: %w", err))
			}
		}
		if e.cfg.Consistent && e.cp.Watermark == "" {
			snap, err := src.(Snapshotter).Snapshot(ctx)
			if err != nil {
				return staged("source", fmt.Errorf("open snapshot for the consistent initial load: %w", err))
			}
			defer snap.Close(context.WithoutCancel(ctx))
			src = snap
			e.cp.Phase = schemas.PhaseSnapshot
			e.cp.PassMark = snap.Mark()
			wcap := snap.Start()
			if e.cfg.Horizon {
				wcap = capOf(h, minTime(h.Now, wcap))
			}
			e.cp.PassHorizon = schemas.FormatTime(wcap)
		} else {
			e.cp.Phase = schemas.PhasePass
			e.cp.PassHead = head
			wcap := now
			if e.cfg.Horizon {
				wcap = capOf(h, minTime(h.Now, now))
			}
			e.cp.PassHorizon = schemas.FormatTime(wcap.UTC().Truncate(time.Microsecond))
			e.cp.PassMark = ""
			if err := openView(); err != nil {
				return err
			}
			if view != nil {
				e.cp.PassMark = view.Mark()
			} else if m, ok := e.src.(Marker); ok {
				mark, err := m.Mark(ctx)
				if err != nil {
					return staged("source", fmt.Errorf("mark the start of the pass: %w", err))
				}
				e.cp.PassMark = mark
			}
		}
		// A full pass reads from the last full pass's W - margin; a head
		// pass from W - lookback (docs/design.md, "Head passes").
		e.cp.PassLow = ""
		from, below := e.fullWatermark(), e.cfg.Margin
		if e.cp.PassHead {
			from, below = e.cp.Watermark, e.cfg.HeadLookback
		}
		if from != "" {
			w, err := schemas.ParseTime(from)
			if err != nil {
				return e.corrupt("watermark", err)
			}
			low := w.Add(-below)
			// Not below the dedupe set's committed floor: its entries
			// below are gone, so a margin raised since (a tuning setting)
			// would publish that band again. Late commits there were
			// already out of reach of the margin that set the floor.
			if f := e.cp.Boundary.Floor; f != "" {
				ft, err := schemas.ParseTime(f)
				if err != nil {
					return e.corrupt("boundary floor", err)
				}
				if ft.After(low) {
					low = ft
				}
			}
			e.cp.PassLow = schemas.FormatTime(low)
		}
		e.cp.PassMax = ""
		e.cp.Cursor = ""
		fresh = true
	}

	var since time.Time
	if e.cp.PassLow != "" {
		t, err := schemas.ParseTime(e.cp.PassLow)
		if err != nil {
			return e.corrupt("pass_low", err)
		}
		since = t
	}
	e.passW = false
	if e.cp.Watermark != "" && e.cp.Phase == schemas.PhasePass {
		w, err := schemas.ParseTime(e.cp.Watermark)
		if err != nil {
			return e.corrupt("watermark", err)
		}
		e.rereadBelow, e.passW = w.UnixMicro(), true
	}
	// A full pass skips what the last full pass proves seen, and its rows
	// are settled by its own mark. A head pass skips what the pass before
	// it proves seen (it reads only from W - lookback), and its rows are
	// settled only by the mark the next full pass will skip by; without
	// one, by none.
	//
	// A full pass after head passes also skips, from each one's lower
	// bound on, what that head pass's mark proves seen (PageRequest.Steps):
	// it reads again only late commits and what the last head pass read.
	// The steps live in memory: after a restart or a failure the first
	// full pass reads the head passes' rows again, which costs only the
	// re-read.
	skip, mark, settle := e.fullMark(), e.cp.PassMark, ""
	var steps []Step
	switch {
	case e.cp.Phase == schemas.PhaseSnapshot:
		skip = "" // a load reads everything
	case e.cp.PassHead:
		skip, settle = e.cp.SeenMark, e.fullMark()
		if settle == "" {
			skip, mark = "", ""
		}
	case e.cp.HeadsSinceFull:
		// A copy: head passes that end during this pass add steps.
		steps = slices.Clone(e.steps)
	}
	// A full pass over a window of time is cut into windows of updated_at,
	// and a wake-up that arrives between two of its pages runs a head pass
	// there (docs/design.md, "Head passes during a full pass"). Its rows
	// are then settled only by the mark a pass that redoes it skips by:
	// after a restart, the checkpoint a head pass committed in between
	// has the next full pass start over.
	var win windows
	nest := fresh && e.cfg.Wake != nil && e.cp.Phase == schemas.PhasePass && !e.cp.PassHead && !since.IsZero()
	if w, ok := src.(Windower); nest && ok && w.Windows() {
		win = newWindows(since, e.clockAt, windowCount(e.b.Len()))
	}
	nest = nest && win.n > 0
	if !e.cp.PassHead {
		e.fullHeads, e.nestOpen = 0, nest
	}
	if nest {
		if settle = e.fullMark(); settle == "" {
			skip, mark = "", ""
		}
	}
	e.log.Debug("pass", "phase", e.cp.Phase, "head", e.cp.PassHead, "since", orInf(e.cp.PassLow), "cursor", e.cp.Cursor, "windows", win.n, "view", view != nil)
	// request is the page request after cursor (in the open window).
	request := func(cursor string) PageRequest {
		return PageRequest{Since: since, From: win.from(), Before: win.before(), Cursor: cursor, Limit: e.cfg.PageSize, Skip: skip, Mark: mark, Settle: settle, Steps: steps, View: view}
	}
	cursor := e.cp.Cursor // the open window's cursor
	pages := 0
	// ahead is the next page, fetched while the transaction before it
	// commits (a commit part way through the pass), so that the page joins
	// the next transaction instead of waiting for the commit. Whatever way
	// the pass ends, a fetch still in flight is cancelled and waited for.
	var ahead *fetchAhead
	defer func() { ahead.stop() }()
	// finish and commit give the views back first.
	finish := func() error {
		ahead.stop()
		closeView()
		return e.finish(ctx)
	}
	commit := func() error {
		closeView()
		return e.commit(ctx)
	}
	for {
		if ctx.Err() != nil {
			return finish()
		}
		req := request(cursor)
		fetchStart := time.Now()
		var (
			page Page
			err  error
			cut  bool
		)
		if ahead != nil && ahead.req.Cursor == req.Cursor && ahead.req.From.Equal(req.From) && ahead.req.Before.Equal(req.Before) && !e.txOpen {
			page, err = ahead.wait()
			fetchStart = time.Now().Add(-ahead.took) // the fetch's own time, not the commit's
			ahead = nil
		} else {
			ahead.stop()
			ahead = nil
			if err := openView(); err != nil {
				return err
			}
			req.View = view
			fctx, cancel := ctx, context.CancelFunc(func() {})
			if e.txOpen {
				fctx, cancel = context.WithDeadline(ctx, e.fetchDeadline())
			}
			page, err = src.Page(fctx, req)
			cut = fctx.Err() != nil && ctx.Err() == nil
			cancel()
		}
		if err != nil {
			if ctx.Err() != nil {
				return finish()
			}
			if cut {
				// The fetch outlasted what the open transaction may take:
				// commit the pages already produced, then fetch the page
				// again with no transaction open.
				e.log.Warn("a page fetch outlasted the open transaction's time budget (kafka.transaction_timeout less a reserve): committing the pages already produced and fetching again",
					"cursor", req.Cursor, "waited", time.Since(fetchStart).Round(time.Millisecond))
				// (The cancelled fetch may have ended the view's
				// session: the next page opens a new one.)
				if err := commit(); err != nil {
					return err
				}
				continue
			}
			e.abort(ctx)
			return staged("source", fmt.Errorf("fetch page after cursor %q: %w", req.Cursor, err))
		}
		e.cfg.Observer.ObservePage(time.Since(fetchStart), len(page.Rows))
		failpoint.Hit(failpoint.AfterFetch)
		pages++
		reread, deduped := e.cp.Counters.Reread, e.cp.Counters.Deduped
		if err := e.apply(ctx, page.Rows); err != nil {
			e.abort(ctx)
			return staged("kafka", err)
		}
		if o, ok := e.cfg.Observer.(RereadObserver); ok {
			o.ObserveReread(int(e.cp.Counters.Reread-reread), int(e.cp.Counters.Deduped-deduped))
		}
		failpoint.Hit(failpoint.AfterProduce)
		e.txPages++
		e.cp.Counters.Pages++
		switch {
		case (page.End || page.Last) && !win.last():
			// The window is read: the next one starts from its From.
			if len(page.Rows) > 0 {
				e.cp.Cursor = page.Next
			}
			win.advance()
			cursor = ""
		case page.End || page.Last:
			e.reportFuture()
			ev := endEvidence{at: e.cfg.Now(), cursor: req.Cursor, since: orInf(e.cp.PassLow), pages: pages}
			if page.Last {
				e.cp.Cursor = page.Next
				ev.cursor = page.Next
			}
			// Nothing more is read in the view, and its session may be
			// the pool's only one (horizon mode samples at the end).
			closeView()
			if err := e.endPass(ctx); err != nil {
				return err
			}
			e.lastEnd = ev
			return nil
		case page.Next == "":
			e.abort(ctx)
			return fmt.Errorf("source returned a page without a next cursor and without an end signal (cursor %q): %w", req.Cursor, ErrPermanent)
		default:
			// The next page follows this one's cursor, also when it
			// returned no rows (an HTTP API may answer an empty page that
			// says there is more).
			e.cp.Cursor, cursor = page.Next, page.Next
		}
		if nest && e.wakePending() {
			// A wake-up between two pages of a full pass: what this
			// pass produced so far is committed with its position, and
			// a head pass runs now. (No page is fetched ahead here: one
			// is fetched only with the commit below, and taken at once.)
			closeView()
			if e.txOpen {
				if err := e.commit(ctx); err != nil {
					return err
				}
			}
			// The pages after the head pass come from a view opened
			// after its pages were read: a key's record published
			// later must be its newer version. (The view was given
			// back above, so the two passes never hold two sessions.)
			if err := e.headBetween(ctx); err != nil {
				return err
			}
			continue
		}
		if e.txFull() {
			// No transaction is open once the commit returns, so the
			// page fetched meanwhile needs no transaction deadline.
			// The fetch reads in the view and gives it back when done;
			// the page after it opens a new one.
			if err := openView(); err != nil {
				return err
			}
			next := request(cursor)
			view = nil // next.View's, given back by the fetch
			ahead = fetchNext(ctx, src, next)
			if err := e.commit(ctx); err != nil {
				return err
			}
		}
	}
}

// viewCloseTimeout bounds the wait for a pass's view to end (a server that
// stopped answering): the view's connection is dropped then.
const viewCloseTimeout = 10 * time.Second

// A full pass that head passes may interrupt is cut into windows of
// updated_at (docs/design.md, "Head passes during a full pass"): one per
// windowRows entries of the dedupe set (the rows published within the
// margin, about the rows the pass reads), at least minWindows and at most
// maxWindows. minWindow is the narrowest window.
const (
	minWindows = 16
	maxWindows = 256
	windowRows = 2000
	minWindow  = time.Millisecond
)

// windowCount is the number of windows of a full pass whose range holds
// about rows rows.
func windowCount(rows int) int {
	return min(max(minWindows, (rows+windowRows-1)/windowRows), maxWindows)
}

// windows cuts [lo, hi) into n windows of equal width, the last one open
// above (docs/design.md, "Head passes during a full pass"), or fewer when
// they would be narrower than minWindow. The zero value is one open
// window: no bounds.
type windows struct {
	lo    time.Time
	width time.Duration
	n, i  int
}

func newWindows(lo, hi time.Time, n int) windows {
	if hi.Sub(lo) < minWindows*minWindow {
		return windows{}
	}
	if most := hi.Sub(lo) / minWindow; time.Duration(n) > most {
		n = int(most)
	}
	w := (hi.Sub(lo) / time.Duration(n)).Truncate(time.Microsecond)
	return windows{lo: lo.Truncate(time.Microsecond), width: w, n: n}
}

// from is the open window's lower bound (zero for the first).
func (w *windows) from() time.Time {
	if w.i == 0 {
		return time.Time{}
	}
	return w.lo.Add(time.Duration(w.i) * w.width)
}

// before is the open window's upper bound (zero for the last).
func (w *windows) before() time.Time {
	if w.last() {
		return time.Time{}
	}
	return w.lo.Add(time.Duration(w.i+1) * w.width)
}

func (w *windows) last() bool { return w.i >= w.n-1 }
func (w *windows) advance()   { w.i++ }

// wakePending takes a wake-up that has arrived, if MinPassGap allows a
// pass now.
func (e *Engine) wakePending() bool {
	if e.cfg.MinPassGap > 0 && time.Since(e.passStarted) < e.cfg.MinPassGap {
		return false
	}
	select {
	case <-e.cfg.Wake:
		e.tookWake()
		return true
	default:
		return false
	}
}

// headBetween runs a head pass between two pages of the open full pass,
// which then goes on where it was. The full pass's state is set aside;
// the head pass's commits carry its own, so a restart after them begins
// with a full pass (docs/design.md, "Head passes during a full pass").
func (e *Engine) headBetween(ctx context.Context) error {
	cp := e.cp
	saved := struct {
		phase                           string
		low, max, horizon, mark, cursor string
		clockAt, clockThen              time.Time
		future                          int
		futureID                        string
		rereadBelow                     int64
		passW                           bool
	}{cp.Phase, cp.PassLow, cp.PassMax, cp.PassHorizon, cp.PassMark, cp.Cursor,
		e.clockAt, e.clockThen, e.future, e.futureID, e.rereadBelow, e.passW}
	cp.Phase, cp.Cursor = schemas.PhaseIdle, ""
	e.forceHead = true
	err := e.pass(ctx)
	e.forceHead = false
	if err != nil {
		return err
	}
	// The next head pass may start MinPassGap after this one ended, not
	// after it started: the full pass reads for at least that long
	// between two head passes, instead of a page per head pass once head
	// passes take the gap.
	e.passStarted = time.Now()
	cp.Phase, cp.PassHead = saved.phase, false
	cp.PassLow, cp.PassMax, cp.PassHorizon, cp.PassMark, cp.Cursor = saved.low, saved.max, saved.horizon, saved.mark, saved.cursor
	e.clockAt, e.clockThen, e.future, e.futureID = saved.clockAt, saved.clockThen, saved.future, saved.futureID
	e.rereadBelow, e.passW = saved.rereadBelow, saved.passW
	return nil
}

// fetchAhead is a page fetch running in its own goroutine.
type fetchAhead struct {
	req    PageRequest
	took   time.Duration
	cancel context.CancelFunc
	done   chan struct{}
	page   Page
	err    error
}

// fetchNext fetches req in a goroutine of its own, and then gives back
// the view it reads in (req.View), if any.
func fetchNext(ctx context.Context, src Source, req PageRequest) *fetchAhead {
	fctx, cancel := context.WithCancel(ctx)
	f := &fetchAhead{req: req, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(f.done)
		start := time.Now()
		f.page, f.err = src.Page(fctx, req)
		f.took = time.Since(start)
		closeViewOf(ctx, req.View)
	}()
	return f
}

// closeViewOf gives a pass's view back, if any. A view that cannot be
// ended cleanly (within viewCloseTimeout) is dropped with its connection;
// it held nothing to keep.
func closeViewOf(ctx context.Context, v PassView) {
	if v == nil {
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), viewCloseTimeout)
	defer cancel()
	_ = v.Close(cctx)
}

// wait returns the fetched page.
func (f *fetchAhead) wait() (Page, error) {
	<-f.done
	f.cancel()
	return f.page, f.err
}

// stop cancels the fetch, if any, and waits for it to end.
func (f *fetchAhead) stop() {
	if f == nil {
		return
	}
	f.cancel()
	<-f.done
}

// reportFuture warns of the rows of the pass dated after the source's
// clock at its start.
func (e *Engine) reportFuture() {
	if e.future == 0 {
		return
	}
	e.log.Warn("rows dated after the source's clock: published, but the watermark stops at the clock, so they are read again until the clock reaches them; fix the writer's clock or time zone if that is not intended",
		"rows", e.future, "example_id", e.futureID, "clock", schemas.FormatTime(e.clockAt))
	if o, ok := e.cfg.Observer.(FutureObserver); ok {
		o.ObserveFutureDated(e.future)
	}
}

// apply publishes the rows of one page, skipping re-reads that B knows.
func (e *Engine) apply(ctx context.Context, rows []Row) error {
	passMax := int64(0)
	if e.cp.PassMax != "" {
		t, err := schemas.ParseTime(e.cp.PassMax)
		if err != nil {
			return e.corrupt("pass_max", err)
		}
		passMax = t.UnixMicro()
	}
	hasMax := e.cp.PassMax != ""
	if e.txStart.IsZero() {
		e.txStart = e.cfg.Now()
	}
	for i := range rows {
		r := &rows[i]
		ts := r.UpdatedAt.UnixMicro()
		if !hasMax || ts > passMax {
			passMax, hasMax = ts, true
		}
		e.cp.Counters.Raw++
		if e.passW && ts <= e.rereadBelow {
			e.cp.Counters.Reread++
		}
		if ts > e.clockAt.Add(time.Since(e.clockThen)+time.Second).UnixMicro() {
			if e.future == 0 {
				e.futureID = r.ID
			}
			e.future++
		}
		// A row B knows with the same record is a re-read: skipped.
		// A settled row (the source proves no later pass returns this
		// version) only needs an entry if B already has one to correct.
		var h uint64
		known := false
		if e.b.Len() > 0 || !r.Settled {
			h = idHash(r.ID)
			idx, same := e.b.seen(r, h)
			if same {
				e.cp.Counters.Deduped++
				if e.b.touch(idx, ts) {
					e.bMoved = true
				}
				continue
			}
			known = idx >= 0
		}
		if err := e.begin(ctx); err != nil {
			return err
		}
		if err := e.pub.Publish(ctx, r); err != nil {
			return fmt.Errorf("publish id %s: %w", r.ID, err)
		}
		e.txRecords++
		e.txBytes += int64(len(r.ID) + len(r.Value))
		if e.txKeys == 0 || ts > e.txNewest {
			e.txNewest = ts
		}
		if e.txKeys == 0 || ts < e.txOldest {
			e.txOldest = ts
		}
		e.txKeys++
		e.txKeySum += fnv64(r.ID)
		e.cp.Counters.Published++
		if r.Deleted {
			e.cp.Counters.Tombstones++
		}
		if known || !r.Settled {
			e.b.publish(r, h, ts)
		}
	}
	if hasMax {
		e.cp.PassMax = schemas.FormatTime(time.UnixMicro(passMax))
	}
	return nil
}

// begin opens a transaction unless one is open.
func (e *Engine) begin(ctx context.Context) error {
	if e.txOpen {
		return nil
	}
	if err := e.pub.Begin(ctx); err != nil {
		return fmt.Errorf("begin transaction: %w", err)
	}
	e.txOpen, e.txBegan = true, time.Now()
	return nil
}

// fetchDeadline is how long a page fetch may take while a transaction is
// open: until the transaction has used up its timeout less a reserve for
// the commit (a quarter of it, at most 10 s). Past it the broker would
// abort the transaction and bump the epoch.
func (e *Engine) fetchDeadline() time.Time {
	reserve := min(e.cfg.TxnTimeout/4, 10*time.Second)
	return e.txBegan.Add(e.cfg.TxnTimeout - reserve)
}

func (e *Engine) txFull() bool {
	return e.txRecords >= e.cfg.TxnMaxRecords ||
		e.txBytes >= e.cfg.TxnMaxBytes ||
		!e.txStart.IsZero() && e.cfg.Now().Sub(e.txStart) >= e.cfg.TxnMaxDuration
}

// endPass advances the watermark and commits the end of the pass.
func (e *Engine) endPass(ctx context.Context) error {
	oldW := e.cp.Watermark
	if e.cp.Phase == schemas.PhaseSnapshot || e.cp.Phase == schemas.PhaseLoad {
		// After a consistent load the walk continues from the snapshot's
		// start: W = snapshot start (capped by the horizon in horizon
		// mode); after a load in key order, from the clock at its start
		// (docs/design.md, "The initial load in key order").
		e.cp.Watermark = e.cp.PassHorizon
	} else if e.cp.PassMax != "" {
		cand, err := schemas.ParseTime(e.cp.PassMax)
		if err != nil {
			return e.corrupt("pass_max", err)
		}
		if e.cp.PassHorizon != "" {
			c, err := schemas.ParseTime(e.cp.PassHorizon)
			if err != nil {
				return e.corrupt("pass_horizon", err)
			}
			if cand.After(c) {
				// Rows committed while the pass ran: normal under
				// continuous writes (future-dated rows are warned of
				// by reportFuture), so not at info level.
				e.log.Debug("the pass read rows dated after the source's clock at its start; the watermark stops at the clock", "newest", e.cp.PassMax, "clock", e.cp.PassHorizon)
			}
			cand = minTime(cand, c)
		}
		if e.cfg.Horizon {
			// Not cancellable: a shutdown here must still finish the pass.
			h, err := e.src.(Horizoner).Horizon(context.WithoutCancel(ctx))
			if err != nil {
				e.abort(ctx)
				return staged("source", fmt.Errorf("sample horizon at the end of the pass: %w", err))
			}
			cand = minTime(cand, capOf(h, h.Now))
		}
		if oldW == "" {
			e.cp.Watermark = schemas.FormatTime(cand)
		} else if w, err := schemas.ParseTime(oldW); err != nil {
			return e.corrupt("watermark", err)
		} else if cand.After(w) {
			e.cp.Watermark = schemas.FormatTime(cand)
		}
	}
	wasPass, low, passCap := e.cp.Phase, e.cp.PassLow, e.cp.PassHorizon
	// A finished head pass is a step of the next full pass, once its
	// transaction is committed; a full pass ends the steps.
	var step *Step
	if e.cp.PassHead && e.cp.PassMark != "" && low != "" {
		t, err := schemas.ParseTime(low)
		if err != nil {
			return e.corrupt("pass_low", err)
		}
		step = &Step{Mark: e.cp.PassMark, Since: t}
	}
	if !e.cp.PassHead {
		// The head passes that ended during this full pass are the
		// steps of the next one: they began after it, so their marks
		// are at or above its mark.
		keep := min(e.fullHeads, len(e.steps))
		e.steps = slices.Clone(e.steps[len(e.steps)-keep:])
		e.fullHeads, e.nestOpen = 0, false
		if wasPass == schemas.PhasePass {
			// The poll interval of head passes counts from here: a full
			// pass slower than it is followed by head passes, not by
			// another full pass at once.
			e.fullAt = time.Now()
		}
	}
	// A moving load in key order leaves the topic as of no moment: --once
	// goes on to the pass that catches up. A consistent load leaves it
	// equal to the table as of its snapshot, where --once stops; resumed
	// under a new snapshot, its ranges hold two snapshots' rows, and a row
	// changed in between behind a range's cursor is only the next pass's.
	// (A consistent load in (updated_at, id) order needs no such pass: a
	// row changed in between moved past the cursor, where the resumed load
	// reads it.)
	e.loadEnded = wasPass == schemas.PhaseLoad && e.cp.Load != nil && (!e.cp.Load.Consistent || e.loadResumed)
	if wasPass == schemas.PhaseLoad {
		e.loadResumed = false
	}
	e.cp.Phase = schemas.PhaseIdle
	e.cp.Cursor, e.cp.PassLow, e.cp.PassMax, e.cp.PassHorizon = "", "", "", ""
	e.cp.Load = nil
	e.headEnded = e.cp.PassHead
	if e.cp.PassHead {
		// The first head pass after a full pass keeps what the next full
		// pass starts from: that pass's mark and the W it left.
		if !e.cp.HeadsSinceFull {
			e.cp.HeadsSinceFull, e.cp.FullMark, e.cp.FullWatermark = true, e.cp.SeenMark, oldW
		}
	} else {
		e.cp.HeadsSinceFull, e.cp.FullMark, e.cp.FullWatermark = false, "", ""
		// Head passes during this full pass may have moved W past the
		// clock at its start. A row they could not see, dated below W and
		// committed after this pass had read its place, committed after
		// that clock: the next full pass reads from no later than it,
		// less the margin, and skips by this pass's mark
		// (docs/design.md, "Head passes during a full pass").
		if fw, err := e.fullEnd(passCap); err != nil {
			return err
		} else if wasPass == schemas.PhasePass && fw != "" {
			e.cp.HeadsSinceFull, e.cp.FullMark, e.cp.FullWatermark = true, e.cp.PassMark, fw
		}
	}
	e.cp.PassHead = false
	e.cp.SeenMark, e.cp.PassMark = e.cp.PassMark, ""
	e.cp.Counters.Passes++
	// A pass that published nothing and moved nothing commits nothing: an
	// unchanged table costs no transaction. The committed checkpoint
	// already says "idle at W", unless the pass was resumed.
	if !e.txOpen && !e.bMoved && e.cp.Watermark == oldW && e.cp.SeenMark == e.committed.SeenMark &&
		e.cp.HeadsSinceFull == e.committed.HeadsSinceFull && e.cp.FullMark == e.committed.FullMark && e.cp.FullWatermark == e.committed.FullWatermark &&
		e.committed.Phase == schemas.PhaseIdle && wasPass != schemas.PhaseSnapshot && wasPass != schemas.PhaseLoad && (e.cp.Sweep == nil) == (e.committed.Sweep == nil) {
		e.resetTx()
		e.addStep(step)
		return nil
	}
	if err := e.commit(ctx); err != nil {
		return err
	}
	e.addStep(step)
	return nil
}

// fullEnd returns the watermark the next full pass reads from when head
// passes moved W past passCap, the cap of the full pass ending now (its
// clock at the start), or "" when W is not past it.
func (e *Engine) fullEnd(passCap string) (string, error) {
	if passCap == "" || e.cp.Watermark == "" {
		return "", nil
	}
	c, err := schemas.ParseTime(passCap)
	if err != nil {
		return "", e.corrupt("pass_horizon", err)
	}
	w, err := schemas.ParseTime(e.cp.Watermark)
	if err != nil {
		return "", e.corrupt("watermark", err)
	}
	if !w.After(c) {
		return "", nil
	}
	return passCap, nil
}

// maxSteps bounds the head passes a full pass skips by (see pass): past
// it the oldest is dropped, and the full pass reads its rows again.
const maxSteps = 128

func (e *Engine) addStep(st *Step) {
	if st == nil {
		return
	}
	if len(e.steps) >= maxSteps {
		e.steps = slices.Delete(e.steps, 0, len(e.steps)-maxSteps+1)
	}
	e.steps = append(e.steps, *st)
	if e.nestOpen {
		e.fullHeads++ // a head pass between two pages of the open full pass
	}
}

// commit ends the open transaction with the checkpoint. Only after a
// successful commit does the committed position move.
func (e *Engine) commit(ctx context.Context) error {
	if err := e.begin(ctx); err != nil {
		return err
	}
	e.cp.Seq++
	e.cp.Counters.Transactions++
	e.cp.CommittedAt = schemas.FormatTime(e.cfg.Now())
	sealed, state, floor, floorUS, err := e.sealBoundary()
	if err != nil {
		e.abort(ctx)
		return err
	}
	led, err := schemas.EncodeLedgerEntry(e.ledgerEntry())
	if err != nil {
		e.abort(ctx)
		return fmt.Errorf("encode ledger entry: %w", err)
	}
	var unitOffsets []int64
	c := &Commit{State: state, Ledger: led, Checkpoint: func(offs []int64) ([]byte, error) {
		if len(offs) != len(state) {
			return nil, fmt.Errorf("%d offsets for %d state records", len(offs), len(state))
		}
		unitOffsets = offs[:len(sealed.segments)]
		e.cp.Boundary = e.b.state(floor, floorUS, sealed, e.cp.Seq, unitOffsets)
		return schemas.EncodeCheckpoint(e.cp)
	}}
	// Never cancel an in-flight EndTransaction: finish on a context that
	// survives shutdown, bounded by a timeout.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	took := time.Now()
	err = e.pub.Commit(cctx, c)
	e.txOpen = false
	if err != nil {
		e.cfg.Observer.ObserveAbort()
		return staged("kafka", fmt.Errorf("commit transaction seq %d: %w", e.cp.Seq, err))
	}
	e.b.done(sealed, e.cp.Seq, unitOffsets)
	e.lookAt = time.Now().Add(supersededEvery)
	failpoint.Hit(failpoint.AfterCommit)
	e.observeCommit(time.Since(took))
	e.log.Info("committed", "seq", e.cp.Seq, "records", e.txRecords, "pages", e.txPages,
		"phase", e.cp.Phase, "watermark", orInf(e.cp.Watermark), "cursor", e.cp.Cursor,
		"dedupe_entries", e.cp.Boundary.Entries, "took", time.Since(took).Round(time.Microsecond))
	e.committed = *e.cp
	e.committed.Load = cloneLoad(e.cp.Load)
	e.resetTx()
	return nil
}

// resetTx forgets the open transaction's bookkeeping.
func (e *Engine) resetTx() {
	e.txOpen = false
	e.bMoved = false
	e.txRecords, e.txBytes, e.txPages, e.txStart = 0, 0, 0, time.Time{}
	e.txKeys, e.txKeySum, e.txNewest, e.txOldest = 0, 0, 0, 0
}

func (e *Engine) observeCommit(took time.Duration) {
	c, p := e.cp.Counters, e.committed.Counters
	info := CommitInfo{
		Seq: e.cp.Seq, Took: took, Records: int64(e.txRecords),
		Pages: c.Pages - p.Pages, Raw: c.Raw - p.Raw, Published: c.Published - p.Published,
		Deduped: c.Deduped - p.Deduped, Tombstones: c.Tombstones - p.Tombstones,
		CommittedAt: e.cfg.Now(), PassEnded: e.cp.Phase == schemas.PhaseIdle,
		HeadPass: e.cp.Phase == schemas.PhaseIdle && e.headEnded,
	}
	e.headEnded = false
	if !e.txStart.IsZero() {
		info.Span = e.cfg.Now().Sub(e.txStart)
	}
	if e.cp.Watermark != "" {
		info.Watermark, _ = schemas.ParseTime(e.cp.Watermark)
	}
	if e.txKeys > 0 && !e.sweeping {
		info.NewestUpdatedAt, info.OldestUpdatedAt = time.UnixMicro(e.txNewest).UTC(), time.UnixMicro(e.txOldest).UTC()
	}
	if e.sweeping {
		info.PassEnded, info.HeadPass = false, false
	}
	e.cfg.Observer.ObserveCommit(info)
}

// ledgerEntry describes the transaction being committed.
func (e *Engine) ledgerEntry() *schemas.LedgerEntry {
	c, p := e.cp.Counters, e.committed.Counters
	return &schemas.LedgerEntry{
		Version: schemas.LedgerVersion, Connector: e.cfg.Name, Kind: schemas.LedgerTxn, RunID: e.runID,
		Seq: e.cp.Seq, At: e.cp.CommittedAt, Phase: e.cp.Phase,
		RequestCursor: e.committed.Cursor, NextCursor: e.cp.Cursor, Watermark: e.cp.Watermark,
		Pages: c.Pages - p.Pages, Raw: c.Raw - p.Raw, Published: c.Published - p.Published,
		Deduped: c.Deduped - p.Deduped, Tombstones: c.Tombstones - p.Tombstones,
		Keys: e.txKeys, KeysDigest: fmt.Sprintf("%016x", e.txKeySum), Counters: c,
	}
}

func fnv64(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// finish ends the open transaction on shutdown: the pages already handed to
// the producer are complete, so they are committed rather than thrown away.
func (e *Engine) finish(ctx context.Context) error {
	if !e.txOpen {
		return nil // nothing published since the last commit: nothing to keep
	}
	if err := e.commit(context.WithoutCancel(ctx)); err != nil {
		return fmt.Errorf("finish the open transaction on shutdown: %w", err)
	}
	return nil
}

func (e *Engine) abort(ctx context.Context) {
	if !e.txOpen {
		return
	}
	e.txOpen = false
	e.cfg.Observer.ObserveAbort()
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := e.pub.Abort(actx); err != nil {
		e.log.Warn("abort transaction", "err", err)
	}
}

func (e *Engine) corrupt(field string, err error) error {
	return &StopError{
		Reason: fmt.Sprintf("the checkpoint's %s is unreadable", field),
		Hint:   "the offsets topic holds a checkpoint this build cannot use; inspect it with `tidemark status` and decide with `tidemark reset`",
		Err:    err,
	}
}

// reshape asks the source whether its shape changed since the last pass
// (docs/schema-changes.md): a change is logged and counted and, with
// RepublishOnSchemaChange, schedules a sweep that republishes every row
// whose record now differs (committed with the pass, so a crash does not
// forget it). A change the configuration cannot follow is a safety stop.
func (e *Engine) reshape(ctx context.Context) error {
	rs, ok := e.src.(Reshaper)
	if !ok {
		return nil
	}
	ch, err := rs.Reshape(ctx)
	return e.reshaped(ch, err)
}

// reshapeNow is reshape, then the source's clock (sourceNow): in one round
// trip when the source is a ClockedReshaper.
func (e *Engine) reshapeNow(ctx context.Context) (time.Time, error) {
	cr, ok := e.src.(ClockedReshaper)
	if !ok {
		if err := e.reshape(ctx); err != nil {
			return time.Time{}, err
		}
		return e.sourceNow(ctx)
	}
	ch, now, err := cr.ReshapeNow(ctx)
	if err := e.reshaped(ch, err); err != nil {
		return time.Time{}, err
	}
	return now, nil
}

// reshaped handles what Reshape returned.
func (e *Engine) reshaped(ch *ShapeChange, err error) error {
	if err != nil {
		if Fatal(err) {
			return err
		}
		return staged("source", fmt.Errorf("begin a pass: %w", err))
	}
	if ch == nil {
		return nil
	}
	e.log.Warn("the source's columns changed: records from this pass on carry the new shape",
		"added", ch.Added, "dropped", ch.Dropped, "retyped", ch.Retyped, "table_replaced", ch.Replaced,
		"old", ch.Old, "new", ch.New, "republish", e.cfg.RepublishOnSchemaChange)
	if o, ok := e.cfg.Observer.(SchemaObserver); ok {
		o.ObserveSchemaChange()
	}
	if e.cfg.RepublishOnSchemaChange && e.cfg.Topic != nil && e.cp.Sweep == nil {
		e.cp.Sweep = &schemas.SweepProgress{StartedAt: schemas.FormatTime(e.cfg.Now())}
	}
	return nil
}

// sourceNow reads the source's clock (Clock), or the host's.
func (e *Engine) sourceNow(ctx context.Context) (time.Time, error) {
	c, ok := e.src.(Clock)
	if !ok {
		return e.cfg.Now().UTC(), nil
	}
	t, err := c.Now(ctx)
	if err != nil {
		return time.Time{}, staged("source", fmt.Errorf("read the source's clock: %w", err))
	}
	return t, nil
}

// capOf is the horizon cap: the earlier of at and the oldest open writer.
func capOf(h Horizon, at time.Time) time.Time {
	if !h.OldestWriter.IsZero() && h.OldestWriter.Before(at) {
		return h.OldestWriter.UTC().Truncate(time.Microsecond)
	}
	return at.UTC().Truncate(time.Microsecond)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
