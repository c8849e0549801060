// Command demo is `make demo`: it streams a PostgreSQL table that changes
// under its feet into Kafka with tidemark, proves the topic equals the
// table, and shows what two naive sync loops lose on the same workload.
//
//	go build -o bin/tidemark ./cmd/tidemark && go run ./test/demo -tidemark bin/tidemark
//
// It uses DATABASE_URL (a loopback server) when set, else starts a
// throwaway PostgreSQL from the server binaries at `pg_config --bindir`.
// tidemark runs as a subprocess on its embedded Kafka broker under a
// temporary data directory, which is kept for inspection.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/test/harness"
)

func main() { os.Exit(run()) }

type options struct {
	bin       string
	seed      uint64
	rows      int
	duration  time.Duration
	pageSize  int
	naivePage int
	poll      time.Duration
	deadline  time.Duration
}

func run() int {
	var o options
	flag.StringVar(&o.bin, "tidemark", "bin/tidemark", "path of the tidemark binary; built with go build when missing")
	flag.Uint64Var(&o.seed, "seed", 0, "RNG seed of the seed data and the workload (0: pick one and print it)")
	flag.IntVar(&o.rows, "rows", 20000, "rows seeded before the workload starts")
	flag.DurationVar(&o.duration, "duration", 15*time.Second, "how long the workload changes the table")
	flag.IntVar(&o.pageSize, "page-size", 500, "tidemark's sync.page_size")
	flag.IntVar(&o.naivePage, "naive-page-size", 100, "page size of the naive loops")
	flag.DurationVar(&o.poll, "poll", 200*time.Millisecond, "poll interval of tidemark and of the naive loops")
	flag.DurationVar(&o.deadline, "deadline", 3*time.Minute, "hard limit for the whole demo")
	flag.Parse()
	if o.seed == 0 {
		o.seed = uint64(time.Now().UnixNano()%999_999) + 1
	}
	if o.rows < tieGroup*2 {
		fmt.Fprintf(os.Stderr, "demo: -rows must be at least %d\n", tieGroup*2)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, o.deadline)
	defer cancel()

	d := &demo{o: o, t0: time.Now()}
	err := d.run(ctx)
	d.cleanup()
	switch {
	case err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled):
		fmt.Printf("\ninterrupted: %v (everything the demo started is stopped)\n", err)
		return 130
	case err != nil:
		fmt.Printf("\nDEMO FAILED: %v\n", err)
		if d.logPath != "" {
			fmt.Printf("tidemark's log: %s\n", d.logPath)
		}
		return 1
	}
	return 0
}

// demo holds what run started, so that cleanup can stop it on every path.
type demo struct {
	o       options
	t0      time.Time
	pg      *harness.Postgres
	pool    *pgxpool.Pool
	tm      *proc
	dataDir string
	logPath string
	cfgPath string
	cleanMu sync.Mutex
}

func (d *demo) cleanup() {
	d.cleanMu.Lock()
	defer d.cleanMu.Unlock()
	if d.tm != nil {
		d.tm.stop(10 * time.Second)
		d.tm = nil
	}
	if d.pool != nil {
		d.pool.Close()
		d.pool = nil
	}
	if d.pg != nil {
		d.pg.Stop()
		d.pg = nil
	}
}

func (d *demo) elapsed() string { return fmt.Sprintf("%4.1fs", time.Since(d.t0).Seconds()) }

func step(n int, format string, a ...any) {
	fmt.Printf("\n[%d/8] %s\n", n, fmt.Sprintf(format, a...))
}

func say(format string, a ...any) { fmt.Printf("      "+format+"\n", a...) }

func (d *demo) run(ctx context.Context) error {
	o := d.o
	fmt.Printf("tidemark demo: a PostgreSQL table that changes while it is copied into Kafka\n")
	fmt.Printf("seed %d (replay this exact workload: go run ./test/demo -seed %d)\n", o.seed, o.seed)

	bin, err := ensureBinary(ctx, o.bin)
	if err != nil {
		return err
	}

	// 1. PostgreSQL.
	dsn := os.Getenv("DATABASE_URL")
	if dsn != "" {
		step(1, "PostgreSQL: DATABASE_URL is set, using it")
		if err := loopbackOnly(dsn); err != nil {
			return err
		}
	} else {
		step(1, "PostgreSQL: starting a throwaway server (pg_config --bindir, as the postgres OS user)")
		d.pg, err = harness.StartCluster()
		if err != nil {
			return fmt.Errorf("start PostgreSQL: %w (set DATABASE_URL to use a running server)", err)
		}
		dsn = d.pg.URL
	}
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = 8
	if d.pool, err = pgxpool.NewWithConfig(ctx, pc); err != nil {
		return err
	}
	var version string
	if err := d.pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return fmt.Errorf("connect to PostgreSQL: %w", err)
	}
	say("PostgreSQL %s at %s:%d, ready at t+%s", version, pc.ConnConfig.Host, pc.ConnConfig.Port, d.elapsed())

	// 2. Table and seed data.
	step(2, "Table %s.%s: seeding %d rows in groups of %d that share ONE updated_at", demoSchema, demoTable, o.rows, tieGroup)
	if err := createTable(ctx, d.pool); err != nil {
		return fmt.Errorf("create the demo table: %w", err)
	}
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	if err := seed(ctx, d.pool, o.rows, o.seed, base); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	say("columns: id bigint PK, updated_at timestamptz, deleted_at timestamptz NULL, customer text,")
	say("         amount numeric(12,2), status text, items jsonb, tags text[]; index on (updated_at, id)")
	say("the timestamp-tie trap: %d distinct updated_at values for %d rows (t+%s)", (o.rows+tieGroup-1)/tieGroup, o.rows, d.elapsed())

	// tidemark's data directory and configuration.
	if d.dataDir, err = os.MkdirTemp("", "tidemark-demo-"); err != nil {
		return err
	}
	d.logPath = filepath.Join(d.dataDir, "tidemark.log")
	if d.cfgPath, err = writeConfig(d.dataDir, dsn, o.pageSize, o.poll); err != nil {
		return err
	}

	// 3. Workload.
	step(3, "Workload for %s (seed %d), two writers at once:", o.duration, o.seed)
	say("app writer:   ~%d single-row statements/s: inserts, updates (updated_at = clock_timestamp()),", appRate)
	say("              soft deletes (deleted_at = updated_at = now()) and undeletes")
	say("batch writer: transactions of 100..500 rows sharing one now(), held open 50..600 ms before")
	say("              COMMIT, so they land with a timestamp OLDER than rows committed meanwhile")
	var st stats
	mutDone := make(chan struct{})
	var mutErr error
	go func() {
		defer close(mutDone)
		mutErr = mutator(ctx, d.pool, o.seed, o.duration, o.rows, &st)
	}()

	// 4. tidemark, continuously, and the naive loops beside it.
	step(4, "Sync while the table changes: tidemark, and beside it two naive loops on the same table")
	d.tm, err = startTidemark(bin, d.logPath, "run", "--config", d.cfgPath)
	if err != nil {
		return fmt.Errorf("start tidemark: %w", err)
	}
	say("$ %s run --config %s", o.bin, d.cfgPath)
	say("  (embedded Kafka under %s; page_size %d, poll_interval %s, margin 10s)", filepath.Join(d.dataDir, "kafka"), o.pageSize, o.poll)
	say("  tidemark's log: %s", d.logPath)
	say("naive 1: WHERE updated_at > $W ORDER BY updated_at LIMIT %d OFFSET $k   (page after page)", o.naivePage)
	say("naive 2: WHERE updated_at > $last ORDER BY updated_at LIMIT %d           (timestamp-only cursor)", o.naivePage)
	offN, tsN := newNaive("OFFSET loop"), newNaive("timestamp cursor")
	var naiveWG sync.WaitGroup
	naiveWG.Add(2)
	go func() { defer naiveWG.Done(); offsetLoop(ctx, dsn, o.naivePage, o.poll, mutDone, offN) }()
	go func() { defer naiveWG.Done(); timestampLoop(ctx, dsn, o.naivePage, o.poll, mutDone, tsN) }()

	progress := time.NewTicker(3 * time.Second)
	defer progress.Stop()
	limit := time.After(o.duration + 30*time.Second)
wait:
	for {
		select {
		case <-mutDone:
			break wait
		case <-ctx.Done():
			return ctx.Err()
		case <-limit:
			return fmt.Errorf("the workload did not stop within %s", o.duration+30*time.Second)
		case <-progress.C:
			ls := readLog(d.logPath)
			tmState := "starting"
			if d.tm.exited() {
				tmState = "EXITED"
			} else if ls.lastCommit != nil {
				load := "initial load running"
				if !ls.initialDone.IsZero() {
					load = "initial load done"
				}
				tmState = fmt.Sprintf("%d commits, %s", ls.commits, load)
			}
			say("t+%s  %6d changes  | tidemark: %s | naive reads: %d / %d", d.elapsed(), st.total(), tmState, offN.reads.Load(), tsN.reads.Load())
		}
	}
	if mutErr != nil {
		return fmt.Errorf("workload: %w", mutErr)
	}
	total := st.total()
	say("workload done at t+%s: %d changes (%.0f/s): %d inserts, %d updates, %d soft deletes, %d undeletes,",
		d.elapsed(), total, float64(total)/o.duration.Seconds(), st.inserts.Load(), st.updates.Load(), st.softDeletes.Load(), st.undeletes.Load())
	say("              %d rows in %d batch transactions (%d single-row statements found their row locked or gone)",
		st.batchRows.Load(), st.batchTxns.Load(), st.skipped.Load())

	if d.tm.exited() {
		return fmt.Errorf("tidemark exited early with code %d; see %s", d.tm.cmd.ProcessState.ExitCode(), d.logPath)
	}
	code, killed := d.tm.stop(30 * time.Second)
	contOut := d.tm.stdout.String()
	d.tm = nil
	contLog := readLog(d.logPath)
	if killed {
		return fmt.Errorf("tidemark did not stop within 30s of SIGTERM and was killed")
	}
	if code != 0 {
		return fmt.Errorf("tidemark exited with code %d after SIGTERM (want 0); see %s", code, d.logPath)
	}
	say("SIGTERM -> tidemark finished its open transaction and exited 0 (clean shutdown, t+%s)", d.elapsed())
	for _, line := range strings.Split(contOut, "\n") {
		if t := strings.TrimSpace(line); strings.HasPrefix(t, "committed:") || strings.HasPrefix(t, "rows:") {
			say("  continuous run %s", t)
		}
	}

	// Catch up: one more run to the end of the table.
	say("$ %s run --once --config %s", o.bin, d.cfgPath)
	once, err := startTidemark(bin, d.logPath, "run", "--once", "--config", d.cfgPath)
	if err != nil {
		return fmt.Errorf("start tidemark --once: %w", err)
	}
	d.tm = once
	code, err = once.wait(ctx, 60*time.Second)
	d.tm = nil
	if err != nil {
		return fmt.Errorf("tidemark run --once: %w", err)
	}
	for _, line := range strings.Split(strings.TrimRight(once.stdout.String(), "\n"), "\n") {
		if !strings.HasPrefix(line, "completion record: ") {
			say("  | %s", line)
		}
	}
	if code != 0 {
		return fmt.Errorf("tidemark run --once exited %d (want 0); see %s", code, d.logPath)
	}
	say("tidemark run --once exited 0 at t+%s", d.elapsed())

	// The naive loops make their final pass once the workload has stopped.
	naiveDone := make(chan struct{})
	go func() { naiveWG.Wait(); close(naiveDone) }()
	select {
	case <-naiveDone:
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(60 * time.Second):
		return fmt.Errorf("the naive loops did not finish within 60s of the workload's end")
	}
	say("naive loops finished their final pass at t+%s", d.elapsed())
	for _, n := range []*naiveReader{offN, tsN} {
		if n.err != nil {
			return fmt.Errorf("naive %s: %w", n.name, n.err)
		}
	}

	// 5. Verify tidemark.
	step(5, "Verify: fold the topic read_committed (last record per key wins, tombstone deletes) and compare")
	say("source of truth: the table walked from scratch through tidemark's own encoder, in one snapshot")
	say("topic: the embedded broker's persisted data (%s), opened by the demo now that tidemark is gone", filepath.Join(d.dataDir, "kafka", "data"))
	tmD, err := verifyTidemark(ctx, dsn, d.dataDir)
	if err != nil {
		return err
	}
	say("rows in table (live)      %7d", tmD.source)
	say("live keys in topic        %7d   (%d committed records, %d tombstones)", tmD.replica, tmD.records, tmD.tombstones)
	say("missing from topic        %7d%s", tmD.missing, sample(tmD.missingIDs))
	say("extra in topic            %7d%s", tmD.extra, sample(tmD.extraIDs))
	say("mismatched values         %7d%s", tmD.stale, sample(tmD.staleIDs))
	say("duplicate publications    %7d   (same key, value and updated_at published again)", tmD.dups)
	if tmD.ok() {
		say("OK: the topic equals the table, key for key and byte for byte")
	} else {
		say("FAIL: the topic does not equal the table (seed %d)", o.seed)
	}

	// 6. The whole loop: replicate the topic into a table and verify it.
	step(6, "Replica: rebuild the table from the topic, exactly once, and prove it equals the source")
	if err := d.replicaStep(ctx, bin); err != nil {
		return err
	}

	// 7. The naive loops.
	step(7, "The naive loops, same table, same changes, same poll interval, final pass after the workload")
	offD, err := verifyNaive(ctx, d.pool, offN)
	if err != nil {
		return fmt.Errorf("compare the OFFSET loop: %w", err)
	}
	tsD, err := verifyNaive(ctx, d.pool, tsN)
	if err != nil {
		return fmt.Errorf("compare the timestamp cursor: %w", err)
	}
	for _, x := range []struct {
		n *naiveReader
		d diff
	}{{offN, offD}, {tsN, tsD}} {
		say("%-17s %d passes, %d rows read: LOST %d rows (%d missing, %d stale), %d extra (deleted rows still there), %d read twice",
			x.n.name+":", x.n.passes.Load(), x.d.raw, x.d.missing+x.d.stale, x.d.missing, x.d.stale, x.d.extra, x.d.dups)
	}
	say("why: a timestamp-only cursor skips the rest of every group of equal updated_at values that a page")
	say("     boundary cuts (here: groups of %d, pages of %d); OFFSET skips rows whenever an earlier row moves to", tieGroup, o.naivePage)
	say("     the end mid-walk; both skip every batch that commits late with an updated_at below their position")
	if offD.ok() || tsD.ok() {
		say("(a naive loop got lucky this time: the traps are timing-dependent; try another -seed)")
	}

	// 8. Summary.
	step(8, "Summary (live rows in the table at the end: %d)", tmD.source)
	say("%-18s %9s %9s %9s %9s   %s", "", "missing", "stale", "extra", "dups", "verdict")
	row := func(name string, x diff, dupNote string) {
		verdict := "exact copy"
		if !x.ok() {
			verdict = fmt.Sprintf("WRONG (%d of %d rows lost or stale)", x.missing+x.stale, x.source)
		}
		say("%-18s %9d %9d %9d %9d   %s%s", name, x.missing, x.stale, x.extra, x.dups, verdict, dupNote)
	}
	row("tidemark", tmD, "")
	row("OFFSET loop", offD, "")
	row("timestamp cursor", tsD, "")
	say("dups: the same row version published (tidemark) or read (naive) twice")
	if !contLog.initialDone.IsZero() && contLog.initialDone.After(contLog.started) {
		secs := contLog.initialDone.Sub(contLog.started).Seconds()
		say("tidemark initial load (from its log, while the workload ran): %d records, %d pages in %.2fs = %.0f rows/s",
			contLog.initialRecs, contLog.initialPages, secs, float64(contLog.initialRecs)/secs)
	}
	if n := len(contLog.warnings); n > 0 {
		say("tidemark logged %d warnings, e.g. %q", n, contLog.warnings[0])
	}
	say("data dir kept for inspection: %s  (try: %s status --config %s)", d.dataDir, o.bin, d.cfgPath)
	say("total time: %s", d.elapsed())
	if !tmD.ok() {
		return fmt.Errorf("tidemark's topic does not equal the table (seed %d): %d missing, %d extra, %d mismatched",
			o.seed, tmD.missing, tmD.extra, tmD.stale)
	}
	return nil
}

// replicaStep runs `tidemark replica --once` into a second table (its own
// embedded broker opens the persisted data now that the sync has stopped)
// and then `tidemark verify --replica-table`, which exits 0 only on an exact
// match.
func (d *demo) replicaStep(ctx context.Context, bin string) error {
	replicaLog := filepath.Join(d.dataDir, "replica.log")
	for _, args := range [][]string{
		{"replica", "--once", "--config", d.cfgPath, "--target-schema", demoSchema, "--target-table", demoTable + "_replica"},
		{"verify", "--config", d.cfgPath, "--replica-schema", demoSchema, "--replica-table", demoTable + "_replica"},
	} {
		say("$ %s %s", filepath.Base(bin), strings.Join(args, " "))
		cctx, cancel := context.WithTimeout(ctx, 90*time.Second)
		cmd := exec.CommandContext(cctx, bin, args...)
		logf, err := os.OpenFile(replicaLog, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			cancel()
			return err
		}
		cmd.Stderr = logf
		out, err := cmd.Output()
		cancel()
		logf.Close()
		for _, line := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
			if line != "" {
				say("  | %s", line)
			}
		}
		if err != nil {
			return fmt.Errorf("tidemark %s failed (%v); its log: %s", args[0], err, replicaLog)
		}
	}
	say("OK: source -> tidemark -> Kafka -> replica -> verify: the replica equals the source")
	return nil
}

// sample renders up to 5 ids.
func sample(ids []string) string {
	if len(ids) == 0 {
		return ""
	}
	n := min(len(ids), 5)
	s := "   e.g. id " + strings.Join(ids[:n], ", ")
	if len(ids) > n {
		s += ", ..."
	}
	return s
}

// loopbackOnly refuses a DATABASE_URL that points anywhere but this
// machine: the demo drops and recreates a schema.
func loopbackOnly(dsn string) error {
	pc, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	h := pc.ConnConfig.Host
	if strings.HasPrefix(h, "/") || h == "localhost" {
		return nil
	}
	if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("DATABASE_URL points at %q; the demo drops and recreates schema %s, so it only uses a server on this machine (localhost, 127.0.0.1, ::1 or a Unix socket)", h, demoSchema)
}
