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

// The two baselines' pseudo worker settings.
const (
	goPipe    = -1 // baseline.go: COPY into an idempotent producer in the bench process (the broker apart)
	kcatPipe  = -2 // kcat.go: psql | kcat -P, processes of their own
	goPipeLZ4 = -3 // the Go pipe with lz4, tidemark's default compression
)

type parRun struct {
	workers int // goPipe, kcatPipe: the baselines
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
		res.runs = append(res.runs, parRun{workers: goPipe, round: round + 1, load: base})
		if _, k := kcatPath(); k == "" && round == 0 {
			fmt.Printf("      psql | kcat baseline skipped: psql or kcat is not installed (apt-get install kcat)\n")
		} else if k != "" {
			kl, err := b.kcatBaseline(ctx, table, rows)
			if err != nil {
				return res, fmt.Errorf("psql | kcat baseline: %w", err)
			}
			fmt.Printf("      %-10s %s\n", "psql|kcat", kl.line())
			res.runs = append(res.runs, parRun{workers: kcatPipe, round: round + 1, load: kl})
		}
		zl, err := b.goPipe(ctx, table, rows, true)
		if err != nil {
			return res, fmt.Errorf("baseline with lz4: %w", err)
		}
		fmt.Printf("      %-10s %s\n", "pipe+lz4", zl.line())
		res.runs = append(res.runs, parRun{workers: goPipeLZ4, round: round + 1, load: zl})
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

// ratios are the setting's rows/s over the same round's Go pipe.
func (r parResult) ratios(workers int) []float64 { return r.ratiosVs(workers, goPipe) }

// ratiosVs are the setting's rows/s over the same round's baseline pipe.
func (r parResult) ratiosVs(workers, pipe int) []float64 {
	base := map[int]float64{}
	for _, p := range r.runs {
		if p.workers == pipe {
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
	case goPipe:
		return "raw unordered pipe (COPY into a Go idempotent producer)"
	case kcatPipe:
		return "raw unordered pipe, `psql \\| kcat -P`" // \| in a table cell
	case goPipeLZ4:
		return "the Go pipe with lz4 (tidemark's default compression)"
	case 0:
		return "tidemark, (updated_at, id) walk"
	}
	return "tidemark, key order, " + strconv.Itoa(workers) + " worker" + map[bool]string{true: "s"}[workers > 1]
}

// best is the worker setting with the highest median ratio over pipe.
func (r parResult) best(pipe int) (workers int, ratio float64) {
	for _, w := range loadWorkerSettings[1:] {
		if m := median(r.ratiosVs(w, pipe)); m > ratio {
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
	r.parRow(b, goPipe, "initial load on a table with shuffled updated_at / raw unordered pipe (COPY into a Go idempotent producer), by sync.load_workers", fmt.Sprintf(">= %.1f", parGoal))
	if len(r.par.of(kcatPipe)) > 0 {
		r.parRow(b, kcatPipe, "the same / the issue's literal pipe `psql -c \"COPY ...\" \\| kcat -P` (idempotent librdkafka producer)", fmt.Sprintf(">= %.1f", parGoal))
	}
	if len(r.par.of(goPipeLZ4)) > 0 {
		r.parRow(b, goPipeLZ4, "the same / the Go pipe with lz4, as tidemark compresses by default (the pipes above send uncompressed, as `kcat -P` does by default)", fmt.Sprintf("(>= %.1f)", parGoal))
	}
}

// parRow writes one summary row: each worker setting's median ratio over
// pipe, and the best.
func (r *results) parRow(b *strings.Builder, pipe int, what, target string) {
	var parts []string
	for _, w := range loadWorkerSettings {
		parts = append(parts, fmt.Sprintf("%d: %.2f", w, median(r.par.ratiosVs(w, pipe))))
	}
	w, best := r.par.best(pipe)
	workers := "workers"
	if w == 1 {
		workers = "worker"
	}
	fmt.Fprintf(b, "| %s, median of %d rounds | %s (best %d %s: **%.2f**) | %s | %s |\n",
		what, r.par.rounds, strings.Join(parts, "; "), w, workers, best, target, verdict(best >= parGoal))
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
	if len(r.par.of(kcatPipe)) == 0 {
		fmt.Fprintf(b, "kcat was not installed, so the `psql | kcat -P` pipe did not run (apt-get install kcat).\n\n")
	}
	fmt.Fprintf(b, "When `psql` and `kcat` are installed, each round also runs the issue's literal pipe, `psql -c \"COPY (SELECT id, row_to_json(t) FROM t) TO STDOUT\" | kcat -P -K <TAB>` (librdkafka, enable.idempotence, acks all, linger 5 ms, no compression), right after the Go pipe: two processes of their own, so their CPU is measured apart from the broker's. Its ratios are in the second last column. Each round then runs the Go pipe once more with lz4 (tidemark's default compression; the pipes above send uncompressed, as `kcat -P` does by default), so that the comparison also holds with both sides compressing: its ratios are in the last column.\n\n")
	fmt.Fprintf(b, "| run | rows/s (median) | ratio (median) | ratios by round | tidemark (or client) CPU s | PostgreSQL CPU s | broker CPU s | peak RSS MiB | ratio over psql \\| kcat (median) | ratio over the Go pipe with lz4 (median) |\n|---|---:|---:|---|---:|---:|---:|---:|---:|---:|\n")
	for _, w := range append([]int{goPipe, kcatPipe, goPipeLZ4}, loadWorkerSettings...) {
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
		if w == kcatPipe || w == goPipeLZ4 {
			ratio = fmt.Sprintf("%.2f", median(r.par.ratiosVs(w, goPipe)))
		}
		lz4Ratio := "1"
		if w != goPipeLZ4 {
			lz4Ratio = fmt.Sprintf("%.2f", median(r.par.ratiosVs(w, goPipeLZ4)))
		}
		kcatRatio := "1"
		if w != kcatPipe {
			kcatRatio = fmt.Sprintf("%.2f", median(r.par.ratiosVs(w, kcatPipe)))
		}
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
		fmt.Fprintf(b, "| %s | %.0f | %s | %s | %.1f | %.1f | %.1f | %s | %s | %s |\n", label(w), median(rps), ratio, byRound, median(self), median(pg), median(brk), rssCell, kcatRatio, lz4Ratio)
	}
	fmt.Fprintf(b, "\nOn the Go pipes' rows, CPU s is their client (the bench process); on the kcat pipe's, psql and kcat. The broker runs in a process of its own in every run.\n\n")
}
