// Command bench is `make bench`: it measures tidemark against the raw limit
// of this machine, in one run, on one PostgreSQL and one broker.
//
//	go build -o bin/tidemark ./cmd/tidemark && go run ./test/bench -tidemark bin/tidemark
//
// It builds a table of BENCH_ROWS rows (default 1,000,000) of ~200 bytes
// with many timestamp ties, then measures:
//
//   - baseline: COPY (SELECT id, row_to_json(t) FROM t) TO STDOUT streamed
//     into a non-transactional idempotent franz-go producer (the ceiling);
//   - tidemark initial loads (subprocess, `run --once`) with the default
//     settings and with sync.txn_max_records 1k, 10k and 50k, each paired
//     with a baseline run right before it: rows/s, MB/s, CPU of tidemark,
//     of PostgreSQL and of the broker, peak RSS of tidemark;
//   - incremental latency: 1,000 updates/s for 30 s while tidemark runs
//     continuously with a 1 s poll, commit in PostgreSQL -> visible to a
//     read_committed consumer;
//   - the same with source.notify (notify.go) at 1,000 and 10,000
//     updates/s: p50/p99, Kafka transactions per second, records per
//     transaction;
//   - bytes on the wire: initial loads with kafka.compression none, lz4,
//     zstd and snappy (compression.go): rows/s and bytes per record on the
//     broker;
//   - page cost with depth from EXPLAIN (ANALYZE, BUFFERS): the keyset page
//     query next to LIMIT/OFFSET at the start, middle and end;
//   - peak RSS of tidemark at 100k, 1M (and BENCH_ROWS) rows;
//   - the window: every row updated by one statement to one updated_at,
//     with a writer held open (the dedupe set carries it all) and without
//     (the pass's mark settles it): rows published and re-read per pass,
//     peak RSS, bytes written to the offsets topic per transaction;
//   - task mode (tasks.go): 12 tables as the tasks of one configuration,
//     initial load by 1 and by 3 `tidemark run` processes (a consumer
//     group), and the recovery of a member's tasks after SIGTERM and
//     after SIGKILL;
//   - a CPU and allocation profile of an in-process initial load.
//
// PostgreSQL: DATABASE_URL when set, else a throwaway cluster
// (harness.StartCluster). Kafka: KAFKA_BROKERS when set, else a kfake broker
// in a process of its own (this program with -serve-broker). Everything else lives in a temporary directory removed at
// exit (-keep keeps it). The table is printed and written to
// bench/results.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

type options struct {
	bin      string
	rows     int
	pairs    int
	out      string
	latency  time.Duration
	rate     int
	profile  bool
	keep     bool
	deadline time.Duration
	// profileOnly loads the table and profiles one in-process initial load,
	// printing the tops instead of writing the report (to iterate on a hot
	// spot: before and after a change).
	profileOnly bool
	// noWindow skips the bulk-update scenario.
	noWindow bool
	// notifyOnly loads the table and runs only the source.notify latency
	// runs, printing their lines instead of writing the report.
	notifyOnly bool
	// notifyRates and notifyArgs are the rates and extra `tidemark run`
	// arguments of -notify-only.
	notifyRates []int
	notifyArgs  string
	// notifyTrigger is the trigger kind of -notify-only (-notify-trigger).
	notifyTrigger string
	notifyBatch   int
	// compressionOnly loads the table and runs only the kafka.compression
	// loads (compression.go), printing their lines instead of the report.
	compressionOnly bool
	// loadOnly runs only the sync.load_workers scenario (parload.go);
	// noLoad skips it.
	loadOnly, noLoad bool
	// tasksOnly runs only the task-mode scenario (tasks.go) on its own
	// tables and prints its lines; noTasks skips it.
	tasksOnly, noTasks bool
}

func main() {
	log.SetFlags(0)
	log.SetPrefix("bench: ")
	os.Exit(run())
}

func run() int {
	o := options{notifyRates: notifyRates}
	flag.StringVar(&o.bin, "tidemark", "bin/tidemark", "tidemark binary (built with `go build` when missing)")
	flag.IntVar(&o.rows, "rows", envInt("BENCH_ROWS", 1_000_000), "rows in the benchmark table (env BENCH_ROWS)")
	flag.IntVar(&o.pairs, "pairs", 3, "baseline/tidemark pairs with the default settings (median reported)")
	flag.StringVar(&o.out, "out", "bench/results.md", "markdown report")
	flag.DurationVar(&o.latency, "latency", 30*time.Second, "how long the writer updates rows in the latency run")
	flag.IntVar(&o.rate, "rate", 1000, "updates per second in the latency run")
	flag.BoolVar(&o.profile, "profile", true, "profile an in-process initial load (CPU and allocations)")
	flag.BoolVar(&o.profileOnly, "profile-only", false, "only profile an in-process initial load and print the tops (no report)")
	flag.BoolVar(&o.noWindow, "no-window", false, "skip the bulk-update (window) scenario")
	flag.BoolVar(&o.notifyOnly, "notify-only", false, "only run the source.notify latency runs on the -rows table and print them (no report)")
	flag.Func("notify-rates", "with -notify-only: the update rates, comma separated (default 1000,4000,10000)", func(v string) error {
		o.notifyRates = nil
		for f := range strings.SplitSeq(v, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n <= 0 {
				return fmt.Errorf("%q is not a positive rate", f)
			}
			o.notifyRates = append(o.notifyRates, n)
		}
		return nil
	})
	flag.IntVar(&o.notifyBatch, "notify-batch", 1, "with -notify-only: updates per writer transaction (distinct rows in one UPDATE), to compare the cost of the commits with that of the rows")
	flag.StringVar(&o.notifyTrigger, "notify-trigger", "statement", "with -notify-only: the notify trigger, statement or deferred (tidemark check --print-notify-sql --notify-trigger)")
	flag.StringVar(&o.notifyArgs, "notify-args", "", "with -notify-only: more `tidemark run` arguments, space separated (say --source.notify_min_gap 5ms)")
	flag.BoolVar(&o.loadOnly, "load-only", false, "only run the sync.load_workers initial loads on a shuffled -rows table (-pairs rounds) and print them (no report)")
	flag.BoolVar(&o.noLoad, "no-load", false, "skip the sync.load_workers scenario")
	flag.BoolVar(&o.compressionOnly, "compression-only", false, "only run the kafka.compression initial loads on the -rows table (-pairs rounds) and print them (no report)")
	flag.BoolVar(&o.tasksOnly, "tasks-only", false, "only run the task-mode scenario (12 tables, 1 vs 3 processes for -pairs rounds, recovery after SIGTERM and SIGKILL) and print it (no report)")
	flag.BoolVar(&o.noTasks, "no-tasks", false, "skip the task-mode scenario")
	flag.BoolVar(&o.keep, "keep", false, "keep the work directory (configs, logs, profiles)")
	flag.DurationVar(&o.deadline, "deadline", 30*time.Minute, "hard limit for the whole run")
	selfProfile := flag.String("self-profile", "", "write the bench process's own CPU profile to this file (to see what the load generator and the consumer cost)")
	serve := flag.Bool("serve-broker", false, "be the bench's broker process: serve a kfake broker, print its address, stop when standard input closes (the bench runs itself so)")
	flag.Parse()
	if *serve {
		return serveBroker()
	}
	if *selfProfile != "" {
		f, err := os.Create(*selfProfile)
		if err != nil {
			log.Print(err)
			return 2
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Print(err)
			return 2
		}
		defer pprof.StopCPUProfile()
	}
	if o.rows < 10_000 {
		log.Printf("-rows %d: need at least 10000", o.rows)
		return 2
	}
	if o.pairs < 1 {
		o.pairs = 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()

	b := &bench{opts: o, started: time.Now(), tag: strconv.FormatInt(time.Now().Unix()%1_000_000, 36)}
	err := b.run(ctx)
	b.close()
	if err != nil {
		log.Printf("FAILED: %v", err)
		return 1
	}
	return 0
}

func envInt(name string, def int) int {
	v := strings.ReplaceAll(strings.TrimSpace(os.Getenv(name)), "_", "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		log.Printf("%s=%q is not an integer; using %d", name, v, def)
		return def
	}
	return n
}

// bench holds what one run shares: the servers, the work directory and the
// results collected so far.
type bench struct {
	opts    options
	started time.Time
	tag     string // distinguishes this run's connectors and topics
	seq     int

	bin  string
	work string
	pg   *harness.Postgres // nil with DATABASE_URL
	url  string
	pool *pgxpool.Pool
	pgCP *pgCPU // nil when the server's processes are not visible
	k    *broker

	res results
}

func (b *bench) run(ctx context.Context) error {
	o := b.opts
	var err error
	if b.bin, err = ensureBinary(ctx, o.bin); err != nil {
		return err
	}
	if b.work, err = os.MkdirTemp("", "tidemark-bench-"); err != nil {
		return err
	}
	step("PostgreSQL")
	if u := os.Getenv("DATABASE_URL"); u != "" {
		b.url = u
		fmt.Printf("      DATABASE_URL (%s)\n", redact(u))
	} else {
		if b.pg, err = harness.StartCluster(); err != nil {
			return fmt.Errorf("start PostgreSQL (or set DATABASE_URL): %w", err)
		}
		b.url = b.pg.URL
		fmt.Printf("      throwaway cluster %s\n", redact(b.url))
	}
	if b.pool, err = pgxpool.New(ctx, b.url); err != nil {
		return err
	}
	if b.pgCP, err = newPGCPU(ctx, b.pool); err != nil {
		fmt.Printf("      PostgreSQL CPU not measured: %v\n", err)
		b.pgCP = nil
	}
	step("Kafka")
	if b.k, err = newBroker(); err != nil {
		return err
	}
	fmt.Printf("      %s\n", b.k.describe())
	if b.res.machine, err = describeMachine(ctx, b.pool); err != nil {
		return err
	}
	b.res.machine.broker = b.k.describe()
	if o.tasksOnly {
		res, err := b.tasksScenario(ctx)
		if err != nil {
			return err
		}
		b.res.tasks = res
		var s strings.Builder
		b.res.tasksSummary(&s)
		fmt.Print(s.String())
		return nil
	}

	// Tables: the main one of o.rows rows, plus smaller ones for the memory
	// scale (100k, 1M below o.rows); the smallest also serves the latency run.
	main := tableName(o.rows)
	step(fmt.Sprintf("table %s: %d rows", main, o.rows))
	if b.res.table, err = createTable(ctx, b.pool, main, o.rows); err != nil {
		return err
	}
	if o.notifyOnly {
		step(fmt.Sprintf("incremental latency with source.notify: %v updates/s for %s each", o.notifyRates, o.latency))
		kind, err := postgres.ParseNotifyKind(o.notifyTrigger)
		if err != nil {
			return err
		}
		if _, _, err := b.loadsAlone(ctx, main, slices.Max(o.notifyRates)); err != nil {
			return err
		}
		_, err = b.notifyRunsBatched(ctx, main, o.notifyRates, strings.Fields(o.notifyArgs), max(o.notifyBatch, 1), kind)
		return err
	}
	// The first run into a fresh broker process paid for its heap's
	// growth: the first round's uncompressed Go pipe ran at about 0.7 of the
	// others, which flattered tidemark's ratios in that round. One pipe run,
	// not reported, warms the broker up.
	step("warm-up: one raw pipe into the broker (not reported)")
	warm, werr := b.baseline(ctx, main, o.rows)
	if werr != nil {
		return fmt.Errorf("warm-up: %w", werr)
	}
	fmt.Printf("      %s\n", warm.line())
	if o.compressionOnly {
		step(fmt.Sprintf("initial load by kafka.compression %v: %d rounds", benchCodecs, o.pairs))
		_, err := b.codecLoads(ctx, main, o.rows, o.pairs)
		return err
	}
	if o.loadOnly || !o.noLoad {
		step(fmt.Sprintf("table %s: %d rows, updated_at shuffled against the heap order", shuffledName(o.rows), o.rows))
		if b.res.par.table, err = createTableShaped(ctx, b.pool, shuffledName(o.rows), o.rows, true); err != nil {
			return err
		}
		step(fmt.Sprintf("initial load in key order by sync.load_workers %v against the raw unordered pipe: %d rounds", loadWorkerSettings, o.pairs))
		tbl := b.res.par.table
		if b.res.par, err = b.parallelLoads(ctx, shuffledName(o.rows), o.rows, o.pairs); err != nil {
			return fmt.Errorf("parallel load: %w", err)
		}
		b.res.par.table = tbl
		if o.loadOnly {
			var s strings.Builder
			b.res.parSummary(&s)
			fmt.Print(s.String())
			return nil
		}
	}
	if o.profileOnly {
		step("profile: in-process initial load with runtime/pprof")
		p, err := b.profileLoad(ctx, main, o.rows)
		if err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		fmt.Printf("%s\n\nCPU, flat:\n%s\n\nCPU, cumulative:\n%s\n\nAllocations:\n%s\n\nprofiles: %s %s\n",
			p.summary, p.cpuTop, p.cumTop, p.allocTop, p.cpuFile, p.memFile)
		b.opts.keep = true
		return nil
	}
	var scales []int
	for _, n := range []int{100_000, 1_000_000} {
		if n < o.rows {
			scales = append(scales, n)
		}
	}
	for _, n := range scales {
		step(fmt.Sprintf("table %s: %d rows", tableName(n), n))
		if _, err := createTable(ctx, b.pool, tableName(n), n); err != nil {
			return err
		}
	}
	small := main
	if len(scales) > 0 {
		small = tableName(scales[0])
	}

	step("page cost with depth (EXPLAIN ANALYZE BUFFERS)")
	if b.res.pages, err = pageCost(ctx, b.pool, main, o.rows); err != nil {
		return err
	}
	for _, p := range b.res.pages {
		fmt.Printf("      %s\n", p.line())
	}

	step(fmt.Sprintf("initial load, default settings: %d baseline/tidemark pairs", o.pairs))
	for i := range o.pairs {
		p, err := b.pair(ctx, main, o.rows, 0)
		if err != nil {
			return fmt.Errorf("pair %d: %w", i+1, err)
		}
		b.res.defaults = append(b.res.defaults, p)
	}
	for _, txn := range []int{1000, 10_000, 50_000} {
		step(fmt.Sprintf("initial load, sync.txn_max_records %d: 1 pair", txn))
		p, err := b.pair(ctx, main, o.rows, txn)
		if err != nil {
			return fmt.Errorf("txn_max_records %d: %w", txn, err)
		}
		b.res.settings = append(b.res.settings, p)
	}

	step(fmt.Sprintf("initial load by kafka.compression %v: %d rounds", benchCodecs, o.pairs))
	if b.res.compression, err = b.codecLoads(ctx, main, o.rows, o.pairs); err != nil {
		return fmt.Errorf("compression: %w", err)
	}

	step("memory with scale")
	for _, n := range scales {
		r, err := b.tidemarkLoad(ctx, tableName(n), n, 0)
		if err != nil {
			return fmt.Errorf("load %d rows: %w", n, err)
		}
		fmt.Printf("      %s\n", r.line())
		b.res.scale = append(b.res.scale, scalePoint{rows: n, rssKB: r.maxRSSKB, rowsPerSec: r.rowsPerSec()})
	}
	var rss []int64
	var rps []float64
	for _, p := range b.res.defaults {
		rss = append(rss, p.tm.maxRSSKB)
		rps = append(rps, p.tm.rowsPerSec())
	}
	b.res.scale = append(b.res.scale, scalePoint{rows: o.rows, rssKB: medianInt(rss), rowsPerSec: median(rps)})

	step(fmt.Sprintf("incremental latency: %d updates/s for %s, poll_interval 1s", o.rate, o.latency))
	if b.res.latency, err = b.latencyRun(ctx, small); err != nil {
		return fmt.Errorf("latency: %w", err)
	}
	fmt.Printf("      %s\n", b.res.latency.line())
	high := slices.Max(notifyRates)
	step(fmt.Sprintf("incremental latency without notify: %d updates/s for %s, poll_interval 1s", high, o.latency))
	if b.res.latencyHigh, err = b.latencyRunSpec(ctx, small, latencySpec{rate: high, writers: max(1, high/writerRate)}); err != nil {
		return fmt.Errorf("latency at %d/s: %w", high, err)
	}
	fmt.Printf("      %s; %.1f transactions/s, %.0f records per transaction\n", b.res.latencyHigh.line(), b.res.latencyHigh.tps(), b.res.latencyHigh.perTxn())
	if b.res.bareAlone, b.res.notifyAlone, err = b.loadsAlone(ctx, small, high); err != nil {
		return err
	}
	step(fmt.Sprintf("incremental latency with source.notify: %v updates/s for %s each, poll_interval 1s", notifyRates, o.latency))
	if b.res.notify, err = b.notifyRuns(ctx, small, notifyRates, nil); err != nil {
		return fmt.Errorf("notify latency: %w", err)
	}
	step(fmt.Sprintf("incremental latency with source.notify and the deferred trigger: %d updates/s for %s", high, o.latency))
	if b.res.notifyDeferred, err = b.notifyRunsBatched(ctx, small, []int{high}, nil, 1, postgres.NotifyDeferred); err != nil {
		return fmt.Errorf("notify latency with the deferred trigger: %w", err)
	}
	step(fmt.Sprintf("incremental latency with source.notify: %d updates/s in commits of %d rows, %s", high, notifyBatch, o.latency))
	if b.res.notifyBatched, err = b.notifyRunsBatched(ctx, small, []int{high}, nil, notifyBatch, postgres.NotifyStatement); err != nil {
		return fmt.Errorf("notify latency in commits of %d: %w", notifyBatch, err)
	}

	if !o.noTasks {
		if b.res.tasks, err = b.tasksScenario(ctx); err != nil {
			return err
		}
	}

	if o.profile {
		step("profile: in-process initial load with runtime/pprof")
		if b.res.profile, err = b.profileLoad(ctx, main, o.rows); err != nil {
			return fmt.Errorf("profile: %w", err)
		}
		fmt.Printf("      %s\n", b.res.profile.summary)
	}

	if !o.noWindow {
		step(fmt.Sprintf("the window: %d rows updated by one statement to one updated_at", o.rows))
		if b.res.window, err = b.windowRun(ctx, main, o.rows); err != nil {
			return fmt.Errorf("window: %w", err)
		}
	}

	b.res.elapsed = time.Since(b.started)
	table := b.res.render(b.opts)
	fmt.Println()
	fmt.Print(table)
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.out, []byte(table), 0o644); err != nil {
		return err
	}
	fmt.Printf("\nwritten to %s (%s)\n", o.out, b.res.elapsed.Round(time.Second))
	return nil
}

// close stops what run started, in reverse order.
func (b *bench) close() {
	if b.k != nil {
		b.k.close()
	}
	if b.pool != nil {
		b.pool.Close()
	}
	if b.pg != nil {
		b.pg.Stop()
	}
	if b.work != "" {
		if b.opts.keep {
			fmt.Printf("work directory kept: %s\n", b.work)
		} else {
			os.RemoveAll(b.work)
		}
	}
}

// pair runs a baseline and then a tidemark initial load of the same table
// (txn 0 = tidemark's default transaction size).
func (b *bench) pair(ctx context.Context, table string, rows, txn int) (pairResult, error) {
	base, err := b.baseline(ctx, table, rows)
	if err != nil {
		return pairResult{}, fmt.Errorf("baseline: %w", err)
	}
	fmt.Printf("      %s\n", base.line())
	tm, err := b.tidemarkLoad(ctx, table, rows, txn)
	if err != nil {
		return pairResult{}, fmt.Errorf("tidemark: %w", err)
	}
	fmt.Printf("      %s   ratio %.2f\n", tm.line(), tm.rowsPerSec()/base.rowsPerSec())
	return pairResult{txn: txn, base: base, tm: tm}, nil
}

func (b *bench) next(kind string) string {
	b.seq++
	return fmt.Sprintf("bench-%s-%s-%d", b.tag, kind, b.seq)
}

func step(s string) { fmt.Printf("[%s] %s\n", time.Now().Format("15:04:05"), s) }

func tableName(rows int) string { return "bench_" + strconv.Itoa(rows) }

func shuffledName(rows int) string { return "bench_shuffled_" + strconv.Itoa(rows) }

var errMismatch = errors.New("count mismatch")

func redact(u string) string {
	if i := strings.Index(u, "://"); i >= 0 {
		if j := strings.Index(u[i+3:], "@"); j >= 0 {
			if k := strings.Index(u[i+3:i+3+j], ":"); k >= 0 {
				return u[:i+3+k+1] + "REDACTED" + u[i+3+j:]
			}
		}
	}
	return u
}
