package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

type pairResult struct {
	txn      int
	base, tm loadResult
}

func (p pairResult) ratio() float64 { return p.tm.rowsPerSec() / p.base.rowsPerSec() }

type scalePoint struct {
	rows       int
	rssKB      int64
	rowsPerSec float64
}

type results struct {
	machine  machine
	table    tableInfo
	pages    []pageStat
	defaults []pairResult
	settings []pairResult
	scale    []scalePoint
	latency  latencyResult
	// latencyHigh is the latency run at the notify runs' highest rate,
	// without notify.
	latencyHigh latencyResult
	notify      []latencyResult // with source.notify (notify.go)
	// notifyDeferred is the notify run at the highest rate with the
	// deferred trigger.
	notifyDeferred []latencyResult
	// notifyBatched is the notify run at the highest rate with the updates
	// committed notifyBatch to a transaction (notify.go).
	notifyBatched []latencyResult
	// notifyAlone is the notify runs' load at the highest rate without
	// tidemark (loadAlone).
	notifyAlone latencyResult
	// bareAlone is the same load with neither trigger nor listener.
	bareAlone latencyResult
	window    windowResult
	profile   profileResult
	elapsed   time.Duration

	compression compressionResult // by kafka.compression (compression.go)
	par         parResult         // by sync.load_workers (parload.go)
	tasks       taskResult        // task mode (tasks.go)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianInt(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

func mib(kb int64) string { return fmt.Sprintf("%.0f", float64(kb)/1024) }

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "**NOT met**"
}

// medianPair is the pair whose ratio is the median of the default runs.
func medianPair(ps []pairResult) (pairResult, float64) {
	var rs []float64
	for _, p := range ps {
		rs = append(rs, p.ratio())
	}
	m := median(rs)
	best := ps[0]
	for _, p := range ps {
		if abs(p.ratio()-m) < abs(best.ratio()-m) {
			best = p
		}
	}
	return best, m
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// render writes the report as markdown: the summary table first (what the
// terminal shows), then the detail of every measurement.
func (r *results) render(o options) string {
	var b strings.Builder
	m := r.machine
	fmt.Fprintf(&b, "# tidemark benchmark\n\n")
	fmt.Fprintf(&b, "`make bench` (`go run ./test/bench -tidemark bin/tidemark`), %s, %d rows, %s in total.\n\n", m.date, o.rows, r.elapsed.Round(time.Second))
	fmt.Fprintf(&b, "- machine: %d cores (%s), %s memory, %s\n", m.cores, m.cpuModel, m.memory, m.kernel)
	fmt.Fprintf(&b, "- %s; %s; broker: %s\n", m.postgres, m.goVer, m.broker)
	t := r.table
	fmt.Fprintf(&b, "- table: %d rows (bigint id, timestamptz updated_at with %d rows per value, text, numeric, jsonb; index on (updated_at, id)), %.0f MiB heap, %.0f bytes of row_to_json per row; loaded with INSERT ... SELECT generate_series, VACUUM ANALYZE, pg_prewarm\n\n",
		t.rows, t.ties, t.heapMB, t.valueBytes)

	// Summary.
	mp, mr := medianPair(r.defaults)
	var rps, tmRps, tmMBps []float64
	for _, p := range r.defaults {
		rps = append(rps, p.base.rowsPerSec())
		tmRps = append(tmRps, p.tm.rowsPerSec())
		tmMBps = append(tmMBps, p.tm.mbPerSec())
	}
	var keyFlat, offGrow string
	var flat bool
	if len(r.pages) == 6 {
		ks, ke := r.pages[0], r.pages[4]
		ofs, ofe := r.pages[1], r.pages[5]
		flat = ke.scanned <= ks.scanned*2 && ke.buffers <= ks.buffers*2+10
		keyFlat = fmt.Sprintf("keyset %d -> %d rows scanned, %.2f -> %.2f ms (start -> end)", ks.scanned, ke.scanned, ks.ms, ke.ms)
		offGrow = fmt.Sprintf("OFFSET %d -> %d rows scanned, %.2f -> %.2f ms", ofs.scanned, ofe.scanned, ofs.ms, ofe.ms)
	}
	var rssMax int64
	var rssLine []string
	for _, s := range r.scale {
		rssMax = max(rssMax, s.rssKB)
		rssLine = append(rssLine, fmt.Sprintf("%s MiB at %s rows", mib(s.rssKB), rowsLabel(s.rows)))
	}
	// Growth: the largest table's peak more than 1.5x (and 16 MiB over)
	// the smallest's. GC timing alone moves a peak by some MiB.
	first, last := r.scale[0].rssKB, r.scale[len(r.scale)-1].rssKB
	grows := len(r.scale) > 1 && float64(last) > 1.5*float64(first) && last-first > 16*1024
	p99ok := r.latency.pollMet()

	fmt.Fprintf(&b, "## Summary\n\n")
	fmt.Fprintf(&b, "| measure | result | target | |\n|---|---|---|---|\n")
	fmt.Fprintf(&b, "| baseline (COPY row_to_json -> idempotent producer), median of %d | %.0f rows/s | ceiling | |\n", len(rps), median(rps))
	fmt.Fprintf(&b, "| tidemark initial load, default settings, median of %d | %.0f rows/s, %.1f MiB/s | | |\n", len(tmRps), median(tmRps), median(tmMBps))
	fmt.Fprintf(&b, "| ratio tidemark / baseline rows/s, pair by pair, median of %d | **%.2f** (%s) | >= 0.70 | %s |\n", len(r.defaults), mr, ratios(r.defaults), verdict(mr >= 0.70))
	var eff []float64
	var other time.Duration
	var wall time.Duration
	for _, p := range r.defaults {
		eff = append(eff, p.base.cpuPerRow()/p.tm.cpuPerRow())
		other += p.base.otherCPU + p.tm.otherCPU
		wall += p.base.wall + p.tm.wall
	}
	fmt.Fprintf(&b, "| CPU ratio baseline / tidemark (all CPU per row: client or tidemark + PostgreSQL + broker), median of %d | %.2f (%.1f vs %.1f µs/row) | | |\n",
		len(eff), median(eff), mp.base.cpuPerRow()*1e6, mp.tm.cpuPerRow()*1e6)
	fmt.Fprintf(&b, "| other processes on the machine during those runs | %.0f CPU-s in %.0f s (%.0f%% of %d cores) | idle machine | %s |\n",
		other.Seconds(), wall.Seconds(), 100*other.Seconds()/wall.Seconds()/float64(r.machine.cores), r.machine.cores,
		map[bool]string{true: "quiet", false: "**noisy: rows/s figures are disturbed**"}[other.Seconds() < 0.1*wall.Seconds()])
	for _, p := range r.settings {
		fmt.Fprintf(&b, "| ratio with sync.txn_max_records %d (1 pair) | %.2f (%.0f rows/s) | | |\n", p.txn, p.ratio(), p.tm.rowsPerSec())
	}
	r.compressionSummary(&b) // compression.go
	r.parSummary(&b)         // parload.go
	fmt.Fprintf(&b, "| CPU per 1M rows, default (median pair): tidemark / PostgreSQL / broker | %.1f s / %.1f s / %.1f s | | |\n",
		per1M(mp.tm.selfCPU, mp.tm.rows), per1M(mp.tm.pgCPU, mp.tm.rows), per1M(mp.tm.brkCPU, mp.tm.rows))
	fmt.Fprintf(&b, "| CPU per 1M rows, baseline (same pair): client / PostgreSQL / broker | %.1f s / %.1f s / %.1f s | | |\n",
		per1M(mp.base.selfCPU, mp.base.rows), per1M(mp.base.pgCPU, mp.base.rows), per1M(mp.base.brkCPU, mp.base.rows))
	fmt.Fprintf(&b, "| incremental latency, commit -> visible read_committed (%d updates at %.0f/s, poll 1s) | p50 %s, p99 %s, max %s; %d/%d seen | p99 <= %s | %s |\n",
		r.latency.updates, r.latency.rate, ms(r.latency.p50), ms(r.latency.p99), ms(r.latency.max), r.latency.seen, r.latency.updates, 2*r.latency.poll, verdict(p99ok))
	if h := r.latencyHigh; h.updates > 0 {
		fmt.Fprintf(&b, "| the same at %d updates/s asked (%.0f/s reached, %d writers, poll 1s) | p50 %s, p99 %s, max %s; %d/%d seen; %.1f transactions/s, %.0f records per transaction | p99 <= %s | %s |\n",
			h.target, h.rate, h.writers, ms(h.p50), ms(h.p99), ms(h.max), h.seen, h.updates, h.tps(), h.perTxn(), 2*h.poll, verdict(h.pollMet()))
	}
	r.notifySummary(&b) // notify.go
	r.tasksSummary(&b)  // tasks.go
	fmt.Fprintf(&b, "| page cost with depth (1000-row page, EXPLAIN ANALYZE) | %s; %s | flat | %s |\n", keyFlat, offGrow, verdict(flat))
	fmt.Fprintf(&b, "| peak RSS of tidemark | %s | < 150 MiB, flat in N | %s |\n", strings.Join(rssLine, ", "), verdict(rssMax < 150*1024 && !grows))
	fmt.Fprintf(&b, "\n")

	// Initial loads.
	fmt.Fprintf(&b, "## Initial load, %d rows\n\n", o.rows)
	fmt.Fprintf(&b, "Baseline and tidemark alternate; each tidemark run is a fresh connector with its own topics, run as `tidemark run --once --json` (a subprocess; wall time includes its start-up: preflight, topic checks, fencing, checkpoint read). Each tidemark run is read back read_committed and must hold exactly one record per row. ")
	fmt.Fprintf(&b, "CPU: tidemark from the subprocess rusage; peak RSS = VmHWM from /proc/<pid>/status sampled every 20 ms (ru_maxrss of a child of a Go process inherits the parent's high-water mark through vfork+exec, so it is not used); PostgreSQL = postmaster + all its children from /proc (utime+stime, exited children via cutime/cstime), before/after; broker = the kfake broker's own process (/proc/<pid>/stat), before/after; the baseline's client is the bench process. The txn_max_records settings ran 1 pair each (time budget); the default setting %d pairs.\n\n", o.pairs)
	fmt.Fprintf(&b, "| run | setting | rows/s | MiB/s | wall s | engine s | CPU s (self) | PostgreSQL CPU s | broker CPU s | all CPU µs/row | other processes CPU s | peak RSS MiB | txns | ratio |\n")
	fmt.Fprintf(&b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	all := append(slices.Clone(r.defaults), r.settings...)
	for i, p := range all {
		fmt.Fprintf(&b, "| %d | baseline | %.0f | %.1f | %.2f | | %.1f (client) | %.1f | %.1f | %.1f | %.1f | | | |\n",
			i+1, p.base.rowsPerSec(), p.base.mbPerSec(), p.base.wall.Seconds(), p.base.selfCPU.Seconds(), p.base.pgCPU.Seconds(),
			p.base.brkCPU.Seconds(), p.base.cpuPerRow()*1e6, p.base.otherCPU.Seconds())
		fmt.Fprintf(&b, "| %d | tidemark %s | %.0f | %.1f | %.2f | %.2f | %.1f | %.1f | %.1f | %.1f | %.1f | %s | %d | %.2f |\n",
			i+1, txnLabel(p.tm), p.tm.rowsPerSec(), p.tm.mbPerSec(), p.tm.wall.Seconds(), p.tm.engine.Seconds(), p.tm.selfCPU.Seconds(),
			p.tm.pgCPU.Seconds(), p.tm.brkCPU.Seconds(), p.tm.cpuPerRow()*1e6, p.tm.otherCPU.Seconds(), mib(p.tm.maxRSSKB), p.tm.txns, p.ratio())
	}
	fmt.Fprintf(&b, "\n")

	r.renderCompression(&b) // compression.go
	r.renderPar(&b)         // parload.go

	// Latency.
	l := r.latency
	fmt.Fprintf(&b, "## Incremental latency\n\n")
	fmt.Fprintf(&b, "tidemark runs continuously (`tidemark run`, default settings, poll_interval 1s with the default 0.2 jitter) on the %s-row table after its initial load (the table is vacuumed before each latency run, this one and the notify runs below, so that none pays for the dead versions of the runs before it); one writer connection updates distinct random rows, each UPDATE setting updated_at = clock_timestamp() and attrs.seq = a sequence number, and notes the time its commit returned; a read_committed consumer in the bench process notes when each sequence number appears (key + attrs.seq).\n\n", rowsLabel(r.scale[0].rows))
	fmt.Fprintf(&b, "At the notify runs' highest rate (below) it runs again without notify, with as many writers as the notify run at that rate: the goal without notify is a p99 within the poll interval and one pass, here taken as twice the poll interval.\n\n")
	fmt.Fprintf(&b, "| updates | rate asked | reached | writers | visible | p50 | p99 | max | Kafka transactions/s | records per transaction | tidemark CPU s | peak RSS MiB | p99 <= %s |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n", 2*l.poll)
	for _, l := range []latencyResult{r.latency, r.latencyHigh} {
		if l.updates == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %d | %d/s | %.0f/s | %d | %d | %s | %s | %s | %.1f | %.0f | %.1f | %s | %s |\n", l.updates, l.target, l.rate, l.writers, l.seen, ms(l.p50), ms(l.p99), ms(l.max), l.tps(), l.perTxn(), l.cpu.Seconds(), mib(l.rssKB), verdict(l.pollMet()))
	}
	fmt.Fprintf(&b, "\n")

	r.renderNotify(&b) // notify.go
	r.renderTasks(&b)  // tasks.go

	// Pages.
	fmt.Fprintf(&b, "## Page cost with depth\n\n")
	fmt.Fprintf(&b, "`EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)` of a 1000-row page, median execution time of 3. keyset = the exact query connector/postgres runs for every page after the first (`WHERE (updated_at, id) > ($1, $2::text::bigint) ORDER BY updated_at, id LIMIT $3`); offset = the same SELECT with `LIMIT 1000 OFFSET k`. Rows scanned = rows the index scan under the Limit produced; buffers = shared hit + read.\n\n")
	fmt.Fprintf(&b, "| query | depth | after row | rows scanned | buffers | ms | plan under the Limit |\n|---|---|---:|---:|---:|---:|---|\n")
	for _, p := range r.pages {
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %.2f | %s |\n", p.query, p.depth, p.after, p.scanned, p.buffers, p.ms, p.plan)
	}
	fmt.Fprintf(&b, "\n")

	// Memory.
	fmt.Fprintf(&b, "## Memory with scale\n\n| rows | tidemark peak RSS MiB | rows/s |\n|---:|---:|---:|\n")
	for _, s := range r.scale {
		fmt.Fprintf(&b, "| %d | %s | %.0f |\n", s.rows, mib(s.rssKB), s.rowsPerSec)
	}
	fmt.Fprintf(&b, "\n(%s rows: the median peak RSS of the default runs, each listed above; BENCH_ROWS=10000000 adds a 10M point.)\n\n", rowsLabel(o.rows))

	r.window.render(&b)

	if r.profile.cpuTop != "" {
		fmt.Fprintf(&b, "\n## Profile of an initial load (in-process)\n\n")
		fmt.Fprintf(&b, "%s. The kfake broker runs in a process of its own; the profile is the bench process's (`-ignore=%s` drops any broker frames).\n\n", r.profile.summary, ignoreBroker)
		fmt.Fprintf(&b, "CPU, flat (`go tool pprof -top`):\n\n```\n%s\n```\n\nCPU, cumulative (`-top -cum`):\n\n```\n%s\n```\n\nAllocations (`-sample_index=alloc_space`):\n\n```\n%s\n```\n",
			r.profile.cpuTop, r.profile.cumTop, r.profile.allocTop)
	}
	return b.String()
}

func ratios(ps []pairResult) string {
	var s []string
	for _, p := range ps {
		s = append(s, fmt.Sprintf("%.2f", p.ratio()))
	}
	return strings.Join(s, ", ")
}

func per1M(d time.Duration, rows int64) float64 {
	if rows == 0 {
		return 0
	}
	return d.Seconds() * 1e6 / float64(rows)
}

func rowsLabel(n int) string {
	switch {
	case n%1_000_000 == 0:
		return fmt.Sprintf("%dM", n/1_000_000)
	case n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
