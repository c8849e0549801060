package connector

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/tidemark/tidemark/failpoint"
	"github.com/tidemark/tidemark/schemas"
)

// rangesPerWorker is how many key ranges the load splits the key space
// into per worker: a worker that finishes its range early takes the next
// one, so a range denser than the others does not leave the rest idle.
const rangesPerWorker = 4

// keyOrdered reports whether this initial load reads in key order.
func (e *Engine) keyOrdered() bool {
	if e.cfg.LoadWorkers <= 0 {
		return false
	}
	if _, ok := e.src.(RangeLoader); !ok {
		return false
	}
	if e.cfg.Consistent {
		_, ok := e.src.(SessionSnapshotter)
		return ok
	}
	return true
}

// keyLoad runs, or resumes, the initial load in key order (docs/design.md,
// "The initial load in key order"): the key space is split into ranges,
// LoadWorkers sessions read them side by side, and one transaction at a
// time publishes what they read, with every range's cursor in the
// checkpoint. The load hands the watermark PassHorizon to the incremental
// passes: the source's clock when it began (the snapshot's start when
// consistent), capped by the oldest open writer in horizon mode.
func (e *Engine) keyLoad(ctx context.Context, now time.Time) error {
	resume := e.cp.Phase == schemas.PhaseLoad
	consistent := e.cfg.Consistent
	if resume {
		if e.cp.Load == nil || len(e.cp.Load.Ranges) == 0 {
			return e.corrupt("load", errors.New("phase load without key ranges"))
		}
		consistent = e.cp.Load.Consistent
	}
	view, ok := e.src.(RangeLoader)
	if !ok {
		return fmt.Errorf("the checkpoint holds an open initial load in key order, but the source %T cannot read one: %w", e.src, ErrPermanent)
	}
	var h Horizon
	if e.cfg.Horizon && !resume {
		var err error
		if h, err = e.src.(Horizoner).Horizon(ctx); err != nil {
			return staged("source", fmt.Errorf("sample horizon: %w", err))
		}
	}
	wcap, mark := now, ""
	if consistent {
		ss, ok := e.src.(SessionSnapshotter)
		if !ok {
			return fmt.Errorf("the checkpoint holds an open consistent load in key order, but the source %T cannot share a snapshot between sessions: %w", e.src, ErrPermanent)
		}
		snap, err := ss.SnapshotSessions(ctx, e.workers())
		if err != nil {
			return staged("source", fmt.Errorf("open a snapshot on %d sessions for the initial load: %w", e.workers(), err))
		}
		defer snap.Close(context.WithoutCancel(ctx))
		if view, ok = snap.(RangeLoader); !ok {
			return fmt.Errorf("the snapshot of %T cannot read key ranges: %w", e.src, ErrPermanent)
		}
		wcap, mark = snap.Start(), snap.Mark()
	} else if m, ok := e.src.(Marker); ok && !resume {
		var err error
		if mark, err = m.Mark(ctx); err != nil {
			return staged("source", fmt.Errorf("mark the start of the initial load: %w", err))
		}
	}
	if resume {
		e.loadResumed = true
		e.log.Info("resuming the initial load in key order", "ranges_left", e.rangesLeft(), "ranges", len(e.cp.Load.Ranges),
			"consistent", consistent, "watermark_after_load", e.cp.PassHorizon)
	} else {
		if e.cfg.Horizon {
			wcap = capOf(h, minTime(h.Now, wcap))
		}
		n := e.workers()
		if n > 1 {
			n *= rangesPerWorker
		}
		ranges, err := view.SplitKeys(ctx, n)
		if err != nil {
			return staged("source", fmt.Errorf("split the key space for the initial load: %w", err))
		}
		if !covers(ranges) {
			return fmt.Errorf("the source split its key space into %d ranges that do not cover every id once (%v): %w", len(ranges), ranges, ErrPermanent)
		}
		e.cp.Phase = schemas.PhaseLoad
		e.cp.Load = &schemas.Load{Consistent: consistent, Ranges: make([]schemas.LoadRange, len(ranges))}
		for i, r := range ranges {
			e.cp.Load.Ranges[i] = schemas.LoadRange{Lo: r.Lo, Hi: r.Hi}
		}
		e.cp.PassHorizon = schemas.FormatTime(wcap.UTC().Truncate(time.Microsecond))
		e.cp.PassMark = mark
		e.cp.PassLow, e.cp.PassMax = "", ""
		e.cp.Cursor = e.loadCursor()
		if w := e.workers(); w > 1 && len(ranges) < w {
			// A small table, or a sample that found few ids (a
			// bloated table): fewer sessions read than configured.
			e.log.Warn("the source split the table into fewer key ranges than sync.load_workers: the load reads on as many sessions as there are ranges (a small table, or a sample of a bloated one that found few ids)",
				"ranges", len(ranges), "load_workers", w)
		}
		e.log.Info("initial load in key order", "ranges", len(ranges), "workers", e.workers(),
			"consistent", consistent, "watermark_after_load", e.cp.PassHorizon)
	}
	e.passW = false
	return e.walkRanges(ctx, view)
}

// covers reports whether ranges partition the whole key space: the first
// starts at the first id, each starts where the one before it ends, and
// the last ends at the last id.
func covers(ranges []KeyRange) bool {
	if len(ranges) == 0 || ranges[0].Lo != "" || ranges[len(ranges)-1].Hi != "" {
		return false
	}
	for i := 1; i < len(ranges); i++ {
		if ranges[i].Lo == "" || ranges[i].Lo != ranges[i-1].Hi {
			return false
		}
	}
	return true
}

// workers is the number of sessions a load reads with.
func (e *Engine) workers() int { return max(e.cfg.LoadWorkers, 1) }

// loadPageSize is the page size of the load in key order: five pages.
// Its pages cost a query each and hold no ties to resolve, no fresh rows
// to wait for; at 1,000 rows the sessions spend much of their time between
// queries. The workers' pages together (two each at most: one read, one
// waiting) hold no more than two transactions, whatever the workers; and
// a page is never less than a page (docs/design.md, "The initial load in
// key order").
func (e *Engine) loadPageSize() int {
	return max(min(5*e.cfg.PageSize, e.cfg.TxnMaxRecords/e.workers()), e.cfg.PageSize)
}

func (e *Engine) rangesLeft() int {
	n := 0
	for _, r := range e.cp.Load.Ranges {
		if !r.Done {
			n++
		}
	}
	return n
}

// loadCursor sums up the ranges' progress as the checkpoint's cursor,
// which the ledger records and audits: how many ranges are done, and a
// digest of every range's cursor.
func (e *Engine) loadCursor() string {
	h := uint64(14695981039346656037)
	for _, r := range e.cp.Load.Ranges {
		h = h*1099511628211 ^ fnv64(r.Cursor)
		if r.Done {
			h ^= 1
		}
	}
	return "load:" + strconv.Itoa(len(e.cp.Load.Ranges)-e.rangesLeft()) + "/" + strconv.Itoa(len(e.cp.Load.Ranges)) + ":" + strconv.FormatUint(h, 16)
}

// loaded is one page of a key range, or the error that ended its walk.
type loaded struct {
	rng  int // index in e.cp.Load.Ranges
	req  LoadRequest
	page Page
	err  error
	took time.Duration
}

// walkRanges reads the ranges not yet done with up to LoadWorkers workers
// and publishes their pages as they arrive, one transaction at a time.
// A worker walks one range to its end, then takes the next; the pages of
// a range arrive in order. Workers keep reading while a transaction
// commits (at most one page each waits), so those pages join the next
// transaction. Every commit holds each range's cursor as of the pages
// published, so a restart resumes every range where it stopped.
func (e *Engine) walkRanges(ctx context.Context, view RangeLoader) error {
	type job struct {
		rng    int
		r      KeyRange
		cursor string
	}
	var jobs []job
	for i, r := range e.cp.Load.Ranges {
		if !r.Done {
			jobs = append(jobs, job{i, KeyRange{Lo: r.Lo, Hi: r.Hi}, r.Cursor})
		}
	}
	left := len(jobs)
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		cancel()
		wg.Wait()
	}()
	pages := make(chan loaded, e.workers())
	var (
		mu   sync.Mutex
		next int
	)
	mark, limit := e.cp.PassMark, e.loadPageSize()
	for range min(e.workers(), len(jobs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next == len(jobs) {
					mu.Unlock()
					return
				}
				j := jobs[next]
				next++
				mu.Unlock()
				req := LoadRequest{Range: j.r, Cursor: j.cursor, Limit: limit, Mark: mark}
				for {
					start := time.Now()
					page, err := view.LoadPage(wctx, req)
					select {
					case pages <- loaded{rng: j.rng, req: req, page: page, err: err, took: time.Since(start)}:
					case <-wctx.Done():
						return
					}
					if err != nil {
						return
					}
					if page.End || page.Last {
						break
					}
					req.Cursor = page.Next
				}
			}
		}()
	}

	deadline := time.NewTimer(time.Hour)
	defer deadline.Stop()
	pagesRead := 0
	for left > 0 {
		var expire <-chan time.Time
		if e.txOpen {
			deadline.Reset(time.Until(e.fetchDeadline()))
			expire = deadline.C
		}
		var l loaded
		select {
		case <-ctx.Done():
			return e.finish(ctx)
		case <-expire:
			// The workers are slower than the open transaction may
			// last: commit the pages already published.
			e.log.Warn("no page arrived within the open transaction's time budget (kafka.transaction_timeout less a reserve): committing the pages already produced")
			if err := e.commit(ctx); err != nil {
				return err
			}
			continue
		case l = <-pages:
		}
		if l.err != nil {
			if ctx.Err() != nil {
				return e.finish(ctx)
			}
			e.abort(ctx)
			return staged("source", fmt.Errorf("fetch a page of key range (%s, %s] after cursor %q: %w", orFirst(l.req.Range.Lo), orLast(l.req.Range.Hi), l.req.Cursor, l.err))
		}
		e.cfg.Observer.ObservePage(l.took, len(l.page.Rows))
		failpoint.Hit(failpoint.AfterFetch)
		pagesRead++
		deduped := e.cp.Counters.Deduped
		if err := e.apply(ctx, l.page.Rows); err != nil {
			e.abort(ctx)
			return staged("kafka", err)
		}
		if o, ok := e.cfg.Observer.(RereadObserver); ok {
			o.ObserveReread(0, int(e.cp.Counters.Deduped-deduped))
		}
		failpoint.Hit(failpoint.AfterProduce)
		e.txPages++
		e.cp.Counters.Pages++
		r := &e.cp.Load.Ranges[l.rng]
		switch {
		case l.page.End || l.page.Last:
			// Nothing followed in the range when the page was read:
			// what commits there later, the pass after the load reads
			// (docs/design.md, "The initial load in key order"). Not
			// waiting for an empty page keeps a range whose ids keep
			// growing (the last) from being chased for ever.
			r.Done = true
			left--
		case l.page.Next == "":
			e.abort(ctx)
			return fmt.Errorf("source returned a page of key range (%s, %s] without a next cursor and without an end signal (cursor %q): %w",
				orFirst(r.Lo), orLast(r.Hi), l.req.Cursor, ErrPermanent)
		default:
			r.Cursor = l.page.Next
		}
		e.cp.Cursor = e.loadCursor()
		if left > 0 && e.txFull() {
			if err := e.commit(ctx); err != nil {
				return err
			}
		}
	}
	e.reportFuture()
	ev := endEvidence{at: e.cfg.Now(), cursor: e.cp.Cursor, since: "-infinity", pages: pagesRead}
	if err := e.endPass(ctx); err != nil {
		return err
	}
	e.lastEnd = ev
	return nil
}

func orFirst(id string) string {
	if id == "" {
		return "first"
	}
	return id
}

func orLast(id string) string {
	if id == "" {
		return "last"
	}
	return id
}

// cloneLoad copies a load's progress, so that the committed checkpoint
// does not share its ranges with the working one.
func cloneLoad(l *schemas.Load) *schemas.Load {
	if l == nil {
		return nil
	}
	c := *l
	c.Ranges = append([]schemas.LoadRange(nil), l.Ranges...)
	return &c
}
