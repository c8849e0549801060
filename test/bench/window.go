package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
)

// windowPass is one `run --once` after a one-statement bulk update.
type windowPass struct {
	read, reread, deduped, published int64
	wall                             time.Duration
	rssKB                            int64
	entries                          int64 // dedupe set after the run
}

func (p windowPass) line() string {
	return fmt.Sprintf("read %d (re-read %d), deduplicated %d, published %d in %.1fs, peak RSS %s MiB, dedupe set %d entries",
		p.read, p.reread, p.deduped, p.published, p.wall.Seconds(), mib(p.rssKB), p.entries)
}

// windowResult is the bulk-update scenario (docs/design.md, "The dedupe
// set"): every row of the table updated by one statement to one updated_at,
// the worst window there is.
type windowResult struct {
	rows int
	// held: a writer was held open, so no pass can prove a row settled and
	// the dedupe set carries the whole window.
	held struct {
		bulk                windowPass
		after               []windowPass // the quiet passes that follow
		cpBytes, segBytes   float64      // per transaction of the bulk pass
		segments, txns      int64
		released, idleAfter []windowPass // after the writer ends
	}
	// settled: no writer open; the pass's mark settles every row.
	settled struct {
		bulk  windowPass
		after []windowPass
	}
}

// windowRun measures the bulk-update scenario on table, which it changes.
func (b *bench) windowRun(ctx context.Context, table string, rows int) (windowResult, error) {
	res := windowResult{rows: rows}
	r, err := b.newRun(table, 0)
	if err != nil {
		return res, err
	}
	defer b.k.drop(context.WithoutCancel(ctx), r.topic, r.offsets, r.ledger)
	once := func(what string) (windowPass, error) {
		p, err := b.start(r, "run", "--once", "--json")
		if err != nil {
			return windowPass{}, err
		}
		wctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
		defer cancel()
		if err := p.wait(wctx); err != nil {
			return windowPass{}, fmt.Errorf("%s: %v (log: %s)\n%s", what, err, r.log, tail(r.log, 20))
		}
		var c connector.Completion
		if err := json.Unmarshal(p.stdout.Bytes(), &c); err != nil {
			return windowPass{}, fmt.Errorf("%s: completion record: %w", what, err)
		}
		_, rss := p.rusage()
		wp := windowPass{read: c.Raw, reread: c.Reread, deduped: c.Deduped, published: c.Published, wall: p.wall, rssKB: rss, entries: c.DedupeEntries}
		fmt.Printf("      %s: %s\n", what, wp.line())
		return wp, nil
	}
	bulk := func() error {
		t := pgx.Identifier{table}.Sanitize()
		start := time.Now()
		_, err := b.pool.Exec(ctx, "UPDATE "+t+" SET updated_at = now(), amount = amount + 1")
		fmt.Printf("      UPDATE of %d rows to one updated_at in %s\n", rows, time.Since(start).Round(100*time.Millisecond))
		return err
	}
	if _, err := once("initial load"); err != nil {
		return res, err
	}

	// Held writer: the dedupe set carries everything.
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return res, err
	}
	tx, err := conn.Begin(ctx)
	if err == nil {
		_, err = tx.Exec(ctx, "SELECT txid_current()")
	}
	release := func() {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			tx = nil
		}
		conn.Release()
	}
	defer func() {
		if tx != nil {
			release()
		}
	}()
	if err != nil {
		return res, err
	}
	if err := bulk(); err != nil {
		return res, err
	}
	before, err := b.offsetsEnd(ctx, r.offsets)
	if err != nil {
		return res, err
	}
	if res.held.bulk, err = once("bulk pass, writer held open"); err != nil {
		return res, err
	}
	if res.held.bulk.published != int64(rows) {
		return res, fmt.Errorf("the bulk pass published %d, want %d: %w", res.held.bulk.published, rows, errMismatch)
	}
	var cps int64
	var cpBytes, segBytes int64
	err = fold.Scan(ctx, []kgo.Opt{kgo.SeedBrokers(b.k.addrs...)}, r.offsets, func(rec *kgo.Record) error {
		if rec.Offset < before || rec.Value == nil {
			return nil
		}
		switch {
		case string(rec.Key) == r.name:
			cps++
			cpBytes += int64(len(rec.Value))
		case strings.HasPrefix(string(rec.Key), r.name+"#b"):
			res.held.segments++
			segBytes += int64(len(rec.Value))
		}
		return nil
	})
	if err != nil {
		return res, fmt.Errorf("read %s: %w", r.offsets, err)
	}
	if cps > 0 {
		res.held.txns = cps
		res.held.cpBytes, res.held.segBytes = float64(cpBytes)/float64(cps), float64(segBytes)/float64(cps)
	}
	fmt.Printf("      offsets topic per transaction of the bulk pass: checkpoint %.0f bytes, dedupe segments %.0f bytes (%d segments in %d transactions)\n",
		res.held.cpBytes, res.held.segBytes, res.held.segments, cps)
	for i := range 3 {
		p, err := once(fmt.Sprintf("quiet pass %d, writer held open", i+1))
		if err != nil {
			return res, err
		}
		if p.published != 0 {
			return res, fmt.Errorf("quiet pass %d published %d: %w", i+1, p.published, errMismatch)
		}
		res.held.after = append(res.held.after, p)
	}
	release()
	for i := range 2 {
		p, err := once(fmt.Sprintf("quiet pass %d after the writer ended", i+1))
		if err != nil {
			return res, err
		}
		res.held.released = append(res.held.released, p)
	}

	// No writer: the pass's mark settles every row.
	if err := bulk(); err != nil {
		return res, err
	}
	if res.settled.bulk, err = once("bulk pass, no writer open"); err != nil {
		return res, err
	}
	for i := range 2 {
		p, err := once(fmt.Sprintf("quiet pass %d, no writer open", i+1))
		if err != nil {
			return res, err
		}
		res.settled.after = append(res.settled.after, p)
	}
	cp, err := offsets.NewStore([]kgo.Opt{kgo.SeedBrokers(b.k.addrs...)}, r.offsets, r.name).Load(ctx)
	if err != nil || cp == nil {
		return res, errors.Join(fmt.Errorf("final checkpoint"), err)
	}
	return res, nil
}

// offsetsEnd is the end offset of a one-partition topic.
func (b *bench) offsetsEnd(ctx context.Context, topic string) (int64, error) {
	return b.k.endOffsets(ctx, topic)
}

func (w windowResult) render(sb *strings.Builder) {
	if w.rows == 0 {
		return
	}
	fmt.Fprintf(sb, "\n## The window: %d rows updated by one statement to one updated_at\n\n", w.rows)
	fmt.Fprintf(sb, "Every row of the table in one tie group: the worst window. With a writer held open (no pass can prove\n")
	fmt.Fprintf(sb, "any row settled), the dedupe set carries all of it, in segments of the offsets topic; without one, the\n")
	fmt.Fprintf(sb, "pass's mark settles every row and later passes do not read them at all (docs/design.md).\n\n")
	fmt.Fprintf(sb, "| run | read | re-read | deduplicated | published | time | peak RSS | dedupe set |\n|---|---|---|---|---|---|---|---|\n")
	row := func(name string, p windowPass) {
		fmt.Fprintf(sb, "| %s | %d | %d | %d | %d | %.1f s | %s MiB | %d |\n", name, p.read, p.reread, p.deduped, p.published, p.wall.Seconds(), mib(p.rssKB), p.entries)
	}
	row("bulk pass, writer held open", w.held.bulk)
	for i, p := range w.held.after {
		row(fmt.Sprintf("quiet pass %d, writer held open", i+1), p)
	}
	for i, p := range w.held.released {
		row(fmt.Sprintf("quiet pass %d after the writer ended", i+1), p)
	}
	row("bulk pass, no writer open", w.settled.bulk)
	for i, p := range w.settled.after {
		row(fmt.Sprintf("quiet pass %d, no writer open", i+1), p)
	}
	fmt.Fprintf(sb, "\nOffsets topic per transaction of the held bulk pass (%d transactions): checkpoint record %.0f bytes, dedupe-set segments %.0f bytes (%d segments in all, about %.1f bytes an entry).\n",
		w.held.txns, w.held.cpBytes, w.held.segBytes, w.held.segments, w.held.segBytes*float64(w.held.txns)/float64(max(w.held.bulk.entries, 1)))
}
