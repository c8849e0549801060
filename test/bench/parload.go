package main

// The initial load in key order (docs/design.md, "The initial load in key
// order"): on a table whose updated_at is unrelated to its heap order, the
// raw unordered pipe (a sequential scan into an idempotent producer) against
// tidemark's initial load walking (updated_at, id) (sync.load_workers 0) and
// in key order with 1, 2 and 4 workers, in alternating rounds.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// loadWorkerSettings are the sync.load_workers values measured; 0 is the
// (updated_at, id) walk.
var loadWorkerSettings = []int{0, 1, 2, 4}

// parGoal is the bar: the load at least this many times the raw
// unordered pipe, for the best worker setting.
const parGoal = 1.3

type parRun struct {
	workers int // -1: the baseline
	round   int
	load    loadResult
}

type parResult struct {
	table  tableInfo
	rounds int
	runs   []parRun
}

// parallelLoads runs rounds of: the baseline, then tidemark with each
// sync.load_workers setting, the settings in a rotating order.
func (b *bench) parallelLoads(ctx context.Context, table string, rows, rounds int) (parResult, error) {
	res := parResult{rounds: rounds}
	for round := range rounds {
		base, err := b.baseline(ctx, table, rows)
		if err != nil {
			return res, fmt.Errorf("baseline: %w", err)
		}
		fmt.Printf("      %-10s %s\n", "baseline", base.line())
		res.runs = append(res.runs, parRun{workers: -1, round: round + 1, load: base})
		for i := range loadWorkerSettings {
			w := loadWorkerSettings[(i+round)%len(loadWorkerSettings)]
			l, err := b.tidemarkLoadWith(ctx, table, rows, 0, "--sync.load_workers", strconv.Itoa(w))
			if err != nil {
				return res, fmt.Errorf("sync.load_workers %d: %w", w, err)
			}
			fmt.Printf("      workers %d  %s   ratio %.2f\n", w, l.line(), l.rowsPerSec()/base.rowsPerSec())
			res.runs = append(res.runs, parRun{workers: w, round: round + 1, load: l})
		}
	}
	return res, nil
}

// ratios are the setting's rows/s over the same round's baseline.
func (r parResult) ratios(workers int) []float64 {
	base := map[int]float64{}
	for _, p := range r.runs {
		if p.workers < 0 {
			base[p.round] = p.load.rowsPerSec()
		}
	}
	var out []float64
	for _, p := range r.runs {
		if p.workers == workers && base[p.round] > 0 {
			out = append(out, p.load.rowsPerSec()/base[p.round])
		}
	}
	return out
}

func (r parResult) of(workers int) []loadResult {
	var out []loadResult
	for _, p := range r.runs {
		if p.workers == workers {
			out = append(out, p.load)
		}
	}
	return out
}

func label(workers int) string {
	switch workers {
	case -1:
		return "raw unordered pipe"
	case 0:
		return "tidemark, (updated_at, id) walk"
	}
	return "tidemark, key order, " + strconv.Itoa(workers) + " worker" + map[bool]string{true: "s"}[workers > 1]
}

// best is the worker setting with the highest median ratio.
func (r parResult) best() (workers int, ratio float64) {
	for _, w := range loadWorkerSettings[1:] {
		if m := median(r.ratios(w)); m > ratio {
			workers, ratio = w, m
		}
	}
	return workers, ratio
}

// parSummary writes the summary row.
func (r *results) parSummary(b *strings.Builder) {
	if len(r.par.runs) == 0 {
		return
	}
	var parts []string
	for _, w := range loadWorkerSettings {
		parts = append(parts, fmt.Sprintf("%d: %.2f", w, median(r.par.ratios(w))))
	}
	w, best := r.par.best()
	fmt.Fprintf(b, "| initial load on a table with shuffled updated_at / raw unordered pipe, by sync.load_workers, median of %d rounds | %s (best %d workers: **%.2f**) | >= %.1f | %s |\n",
		r.par.rounds, strings.Join(parts, "; "), w, best, parGoal, verdict(best >= parGoal))
}

// renderPar writes the section.
func (r *results) renderPar(b *strings.Builder) {
	if len(r.par.runs) == 0 {
		return
	}
	t := r.par.table
	fmt.Fprintf(b, "## Initial load in key order (sync.load_workers)\n\n")
	fmt.Fprintf(b, "A second table of %d rows, the same columns, whose updated_at is unrelated to the heap order (row g gets the timestamp of position g·7919 mod n, %d rows per value), %.0f MiB heap. ", t.rows, t.ties, t.heapMB)
	fmt.Fprintf(b, "Each round runs the raw unordered pipe first (`COPY (SELECT id, row_to_json(t) FROM t) TO STDOUT` into a non-transactional idempotent producer, no compression, as `psql | kcat -P` would: a sequential scan, no order, no checkpoint), then tidemark (`run --once`, default settings, so lz4 and exactly once) with each `sync.load_workers` setting in a rotating order; 0 is the `(updated_at, id)` walk, which on this table reads the heap at random. Each tidemark run is read back read_committed and must hold exactly one record per row. Ratio = rows/s over the same round's pipe.\n\n")
	fmt.Fprintf(b, "| run | rows/s (median) | ratio (median) | ratios by round | tidemark CPU s | PostgreSQL CPU s | broker CPU s | peak RSS MiB |\n|---|---:|---:|---|---:|---:|---:|---:|\n")
	for _, w := range append([]int{-1}, loadWorkerSettings...) {
		runs := r.par.of(w)
		if len(runs) == 0 {
			continue
		}
		var rps, self, pg, brk []float64
		var rss []int64
		for _, l := range runs {
			rps = append(rps, l.rowsPerSec())
			self = append(self, l.selfCPU.Seconds())
			pg = append(pg, l.pgCPU.Seconds())
			brk = append(brk, l.brkCPU.Seconds())
			rss = append(rss, l.maxRSSKB)
		}
		ratio, byRound := "1", ""
		if w >= 0 {
			rs := r.par.ratios(w)
			ratio = fmt.Sprintf("%.2f", median(rs))
			var parts []string
			for _, x := range rs {
				parts = append(parts, fmt.Sprintf("%.2f", x))
			}
			byRound = strings.Join(parts, ", ")
		}
		rssCell := ""
		if w >= 0 {
			rssCell = mib(slices.Max(rss))
		}
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %.1f | %.1f | %.1f | %s |\n", label(w), median(rps), ratio, byRound, median(self), median(pg), median(brk), rssCell)
	}
	fmt.Fprintf(b, "\nOn the baseline row, CPU s (self) is the bench process: the client and the in-process broker together.\n\n")
}
