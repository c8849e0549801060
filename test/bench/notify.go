package main

// Incremental latency with source.notify (docs/operating.md, "Change
// notifications"): the latency run of latency.go, with the trigger that
// `tidemark check --print-notify-sql` prints installed on the table and
// `tidemark run --source.notify`, at 1,000, 4,000 and 10,000 updates/s (4,000
// is what one writer connection commits here, with CPU to spare; 10,000 is
// shared by four and saturates this machine's cores).

import (
	"context"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector/postgres"
)

const (
	// notifyChannel is the channel of the notify runs.
	notifyChannel = "tidemark_bench_changes"
	// notifyGoal is the p99 commit -> visible goal with notify.
	notifyGoal = 100 * time.Millisecond
	// writerRate is about what one writer connection commits per second
	// here; faster rates are shared by more connections.
	writerRate = 2500
)

// notifyBatch is the rows a writer commits at once in the run that tells
// the cost of the commits from that of the rows.
const notifyBatch = 10

// notifyRates are the update rates of the notify runs: the two, and
// one between that one writer reaches without saturating the machine.
var notifyRates = []int{1000, 4000, 10_000}

// notifyRuns installs the notify trigger on table (the statements
// `tidemark check --print-notify-sql` prints), measures commit -> visible
// with source.notify at each of notifyRates (latencyRunSpec; sync.poll_interval
// stays 1s, source.notify_min_gap its default), and removes the trigger.
// Every UPDATE commits on its own: with the statement-level trigger, each
// one is a notification.
//
// rates and extra are notifyRates and no arguments in `make bench`;
// `-notify-only` takes them from -notify-rates and -notify-args, to try a
// setting (say `--source.notify_min_gap 5ms`) at the rates that matter.
func (b *bench) notifyRuns(ctx context.Context, table string, rates []int, extra []string) ([]latencyResult, error) {
	return b.notifyRunsBatched(ctx, table, rates, extra, 1, postgres.NotifyStatement)
}

// notifyRunsBatched is notifyRuns with batch updates per transaction
// (-notify-batch): the same rows per second in a batch-th of the commits,
// each one notification, to tell the cost of the commits from that of the
// rows; and with the trigger of kind.
func (b *bench) notifyRunsBatched(ctx context.Context, table string, rates []int, extra []string, batch int, kind postgres.NotifyKind) ([]latencyResult, error) {
	remove, err := b.installNotify(ctx, table, kind)
	if err != nil {
		return nil, err
	}
	defer remove()
	var out []latencyResult
	for _, rate := range rates {
		args := append([]string{"--source.notify", notifyChannel}, extra...)
		res, err := b.latencyRunSpec(ctx, table, latencySpec{rate: rate, writers: max(1, rate/writerRate/batch), batch: batch, args: args})
		if err != nil {
			return out, fmt.Errorf("%d updates/s: %w", rate, err)
		}
		res.trigger = postgres.NotifyKinds[kind]
		fmt.Printf("      notify (%s trigger), %d/s asked, %d writer(s), %d update(s) a commit: %s; %.1f transactions/s, %.0f records per transaction; writers' UPDATE p99 %s, %s behind schedule (p99); CPU: PostgreSQL %s cores, bench process %.2f\n",
			res.trigger, rate, res.writers, batch, res.line(), res.tps(), res.perTxn(), msFine(res.wp99), ms(res.behind99), cores(res.pgCores), res.benchCores)
		out = append(out, res)
	}
	return out, nil
}

// installNotify installs the trigger of kind on table, the statements
// `tidemark check --print-notify-sql` prints, and returns the func that
// removes it.
func (b *bench) installNotify(ctx context.Context, table string, kind postgres.NotifyKind) (remove func(), err error) {
	var schema string
	if err := b.pool.QueryRow(ctx, `SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = $1::regclass`, pgx.Identifier{table}.Sanitize()).Scan(&schema); err != nil {
		return nil, fmt.Errorf("schema of %s: %w", table, err)
	}
	st, err := postgres.NotifySQL(schema, table, notifyChannel, kind)
	if err != nil {
		return nil, err
	}
	if _, err := b.pool.Exec(ctx, st.Install); err != nil {
		return nil, fmt.Errorf("install the notify trigger: %w", err)
	}
	return func() {
		if _, err := b.pool.Exec(context.WithoutCancel(ctx), st.Remove); err != nil {
			fmt.Printf("      removing the notify trigger: %v\n", err)
		}
	}, nil
}

// loadAlone is the writers of the notify run at rate, single-row commits
// with the statement-level trigger installed and tidemark's own listener
// (postgres.Listen, as `tidemark run --source.notify` opens it), whose
// wake-ups are taken one per notifyGap as passes would take them, so that
// it holds notifications unread between them as it does in tidemark; but
// without tidemark's passes, its broker traffic or a consumer: what the
// load itself costs this machine, and how far its own commits keep their
// schedule. A notify run's latency can only be judged at a rate the load
// alone sustains with CPU to spare. With notify false the same writers run
// bare, with neither trigger nor listener: what the updates alone cost. It
// prints its line (aloneLine).
func (b *bench) loadAlone(ctx context.Context, table string, rate int, notify bool) (latencyResult, error) {
	res := latencyResult{target: rate, writers: max(1, rate/writerRate), batch: 1, bare: !notify}
	t, n, err := b.freshTable(ctx, table)
	if err != nil {
		return res, err
	}
	var l *postgres.Listener
	if notify {
		res.trigger = postgres.NotifyKinds[postgres.NotifyStatement]
		remove, err := b.installNotify(ctx, table, postgres.NotifyStatement)
		if err != nil {
			return res, err
		}
		defer remove()
		lctx, stop := context.WithCancel(ctx)
		if l, err = postgres.Listen(lctx, postgres.Config{DSN: b.url}, postgres.ListenConfig{Channel: notifyChannel, Logger: slog.New(slog.DiscardHandler)}); err != nil {
			stop()
			return res, fmt.Errorf("listen: %w", err)
		}
		defer l.Close()
		done := make(chan struct{})
		go func() { // the engine's side: a wake-up taken at most once per notifyGap
			defer close(done)
			for {
				select {
				case <-lctx.Done():
					return
				case <-l.Wake():
				}
				select {
				case <-lctx.Done():
					return
				case <-time.After(notifyGap):
				}
			}
		}()
		defer func() { stop(); <-done }()
	}
	tr := &tracker{pending: map[int64][]int{}}
	if _, err := b.writeMeasured(ctx, t, n, latencySpec{rate: rate, writers: res.writers, batch: 1}, tr, &res); err != nil {
		return res, err
	}
	if l != nil {
		// The notifications of the last commits are on their way; the
		// listener reads them at most its hold (250 ms) after they arrive.
		for deadline := time.Now().Add(5 * time.Second); l.Notifications() < int64(res.updates) && time.Now().Before(deadline); {
			time.Sleep(20 * time.Millisecond)
		}
		res.notified = l.Notifications()
	}
	fmt.Printf("      %s\n", res.aloneLine())
	return res, nil
}

// loadsAlone runs loadAlone at rate bare, then with the trigger and the
// listener.
func (b *bench) loadsAlone(ctx context.Context, table string, rate int) (bare, notified latencyResult, err error) {
	step(fmt.Sprintf("the load alone: %d single-row updates/s for %s, bare, then with the statement trigger and tidemark's listener; no passes", rate, b.opts.latency))
	if bare, err = b.loadAlone(ctx, table, rate, false); err != nil {
		return bare, notified, fmt.Errorf("the load alone, bare: %w", err)
	}
	if notified, err = b.loadAlone(ctx, table, rate, true); err != nil {
		return bare, notified, fmt.Errorf("the load alone with the trigger: %w", err)
	}
	return bare, notified, nil
}

// notifyGap is tidemark's default source.notify_min_gap: the least time
// between the starts of two passes that notifications start.
const notifyGap = 20 * time.Millisecond

// aloneLine describes a loadAlone result.
func (l latencyResult) aloneLine() string {
	heard, client := "no trigger, no listener; ", "the writers' client"
	if !l.bare {
		heard, client = fmt.Sprintf("the listener read %d notifications for %d commits; ", l.notified, l.updates), "the writers' client and the listener"
	}
	return fmt.Sprintf("%d updates/s asked, %.0f/s reached, %d writer(s); their UPDATE round trip p50 %s, p99 %s; %s behind their schedule (p99); %sCPU: PostgreSQL %s cores, the bench process (%s) %.2f cores",
		l.target, l.rate, l.writers, msFine(l.wp50), msFine(l.wp99), ms(l.behind99), heard, cores(l.pgCores), client, l.benchCores)
}

// pollMet: the goal without notify, p99 within the poll interval and one
// pass (taken as twice the poll interval), every update seen.
func (l latencyResult) pollMet() bool {
	return l.p99 > 0 && l.p99 <= 2*l.poll && l.seen == l.updates
}

func (l latencyResult) notifyMet() bool {
	return l.p99 > 0 && l.p99 <= notifyGoal && l.seen == l.updates
}

// notifySummary writes the summary rows of the notify runs.
func (r *results) notifySummary(b *strings.Builder) {
	if a := r.notifyAlone; a.updates > 0 {
		fmt.Fprintf(b, "| the notify runs' load alone: %d single-row updates/s asked, %d writers, statement trigger and tidemark's listener, no passes | %.0f/s reached; the writers' own UPDATE p99 %s, %s behind their schedule (p99); CPU %s of %d cores (PostgreSQL %s, the bench process: the writers' client and the listener, %.2f) | (room for tidemark: 95%% of the rate reached, sends < %s behind at p99, CPU <= 3/4 of the cores) | %s |\n",
			a.target, a.writers, a.rate, msFine(a.wp99), ms(a.behind99), cores(a.allCores()), runtime.NumCPU(), cores(a.pgCores), a.benchCores, ms(notifyGoal), verdict(aloneSpare(a)))
	}
	if a := r.bareAlone; a.updates > 0 {
		fmt.Fprintf(b, "| the same writers bare: no trigger, no listener, no passes | %.0f/s reached; the writers' own UPDATE p99 %s, %s behind their schedule (p99); CPU %s of %d cores (PostgreSQL %s, the writers' client %.2f) | (the same) | %s |\n",
			a.rate, msFine(a.wp99), ms(a.behind99), cores(a.allCores()), runtime.NumCPU(), cores(a.pgCores), a.benchCores, verdict(aloneSpare(a)))
	}
	for _, l := range append(slices.Clone(r.notify), r.notifyDeferred...) {
		fmt.Fprintf(b, "| incremental latency with source.notify, %s trigger, commit -> visible read_committed (%d updates/s asked, %.0f/s reached; poll 1s) | p50 %s, p99 %s, max %s; %d/%d seen; %.1f transactions/s, %.0f records per transaction | p99 <= %s | %s |\n",
			l.trigger, l.target, l.rate, ms(l.p50), ms(l.p99), ms(l.max), l.seen, l.updates, l.tps(), l.perTxn(), ms(notifyGoal), verdict(l.notifyMet()))
	}
	for _, l := range r.notifyBatched {
		fmt.Fprintf(b, "| the same, %d updates/s asked in source commits of %d rows (%.0f/s reached; not the goal's setting, which commits each update alone: it tells the cost of the commits from that of the rows) | p50 %s, p99 %s, max %s; %d/%d seen; %.1f transactions/s, %.0f records per transaction | (p99 <= %s) | %s |\n",
			l.target, l.batch, l.rate, ms(l.p50), ms(l.p99), ms(l.max), l.seen, l.updates, l.tps(), l.perTxn(), ms(notifyGoal), verdict(l.notifyMet()))
	}
}

// aloneSpare reports whether the load alone kept its schedule (reached 95%
// of the rate asked, its sends less than notifyGoal behind) with a quarter of
// the machine's cores to spare: only then can the machine also run
// tidemark, its broker and the consumer measuring it, and a notify run at
// that rate judge tidemark rather than the machine.
func aloneSpare(a latencyResult) bool {
	return a.rate >= 0.95*float64(a.target) && a.behind99 < notifyGoal && a.pgCores >= 0 && a.allCores() <= 0.75*float64(runtime.NumCPU())
}

// allCores is the CPU of PostgreSQL and of the bench process, in cores;
// -1 when PostgreSQL's was not measured.
func (l latencyResult) allCores() float64 {
	if l.pgCores < 0 {
		return -1
	}
	return l.pgCores + l.benchCores
}

// renderNotify writes the section of the notify runs, next to the run
// without notify.
func (r *results) renderNotify(b *strings.Builder) {
	if len(r.notify) == 0 {
		return
	}
	fmt.Fprintf(b, "## Incremental latency with source.notify\n\n")
	fmt.Fprintf(b, "The latency run above, with the statement-level trigger that `tidemark check --print-notify-sql` prints installed on the table (every writing transaction notifies), and `tidemark run --source.notify %s` (a connection of its own LISTENs; a notification starts a pass at once, at least source.notify_min_gap 20ms after the last one started, and that pass is followed by one more, docs/design.md, \"Follow-up passes\"; poll_interval stays 1s). "+
		"Every UPDATE commits on its own, so with that trigger every update is a notification. "+
		"The deferred rows have the trigger that `--print-notify-sql --notify-trigger deferred` prints instead: it runs at commit, and a commit does not notify while another is notifying the channel, so the writers keep group commit (docs/design.md, \"One notifier at a time\"). "+
		"With fsync or synchronous_commit off, as in a throwaway cluster (see the machine above), a notifying commit holds PostgreSQL's notify lock for no WAL flush, so the cap the statement-level trigger puts on durable writers does not show here (docs/operating.md: 3,300 against 7,300 single-row commits/s with pgbench, fsync on). "+
		"A run uses one writer connection per %d updates/s asked (at least one; the writers column). "+
		"Passes that notifications start within a poll interval of the end of the last full pass are head passes, which read from the watermark less source.notify_lookback (100ms by default); the full pass after them reads the margin's index range, in windows of updated_at (16, or one per 2,000 rows changed within the margin, at most 256) with head passes between its pages, and leaves out what they read (docs/design.md, \"Head passes\" and \"Head passes during a full pass\"). "+
		"Kafka transactions and records are the checkpoint's counters from the first update until tidemark stopped; per second over the time from the first update until the last one was visible.\n\n", notifyChannel, writerRate)
	if len(r.notifyBatched) > 0 {
		fmt.Fprintf(b, "The last row commits the updates %d rows to a source transaction (one UPDATE of distinct rows, one notification): the same rows per second in a tenth of the commits. It is not the goal's setting; it shows whether the rows or the commits are what the machine cannot keep up with (each notifying commit holds PostgreSQL's notification queue lock until it is flushed, docs/operating.md).\n\n", notifyBatch)
	}
	if a := r.bareAlone; a.updates > 0 {
		fmt.Fprintf(b, "**The writers bare.** Before the notify runs, the writers of their highest rate wrote for the same time with neither a trigger nor a listener, and without tidemark: what the updates themselves cost this machine: %s.\n\n", a.aloneLine())
	}
	if a := r.notifyAlone; a.updates > 0 {
		fmt.Fprintf(b, "**The load alone.** Then the writers of the %d/s run wrote for the same time with the statement-level trigger installed and tidemark's own listener (connector/postgres Listen, as `tidemark run --source.notify` opens it), its wake-ups taken at most once per %s as passes take them, so that it leaves notifications unread between them as it does in tidemark; but without tidemark's passes, its broker or a consumer: %s. "+
			"Every column of the table below from \"writers' UPDATE p99\" on is measured the same way in each run: the writers' own round trip of an UPDATE and its commit, how far behind their schedule they sent it (a writer behind schedule sends the next at once), and the CPU of PostgreSQL (all its processes: the writers' backends and tidemark's) and of the bench process (the writers' client and the consumer that reads the topic back; the broker is a process of its own) over the time they wrote, in cores of this machine's %d.\n\n",
			a.target, notifyGap, a.aloneLine(), runtime.NumCPU())
	}
	fmt.Fprintf(b, "| notify | updates/s asked | reached | writers | updates a commit | updates | visible | p50 | p99 | max | Kafka transactions/s | records per transaction | tidemark CPU s | peak RSS MiB | p99 <= %s | writers' UPDATE p99 | behind schedule p99 | PostgreSQL cores | bench process cores |\n", ms(notifyGoal))
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|\n")
	for _, a := range []latencyResult{r.bareAlone, r.notifyAlone} {
		if a.updates == 0 {
			continue
		}
		what := a.trigger + " trigger, a listener"
		if a.bare {
			what = "no trigger, no listener"
		}
		fmt.Fprintf(b, "| the load alone (%s, no tidemark) | %d | %.0f | %d | 1 | %d | | | | | | | | | | %s | %s | %s | %.2f |\n",
			what, a.target, a.rate, a.writers, a.updates, msFine(a.wp99), ms(a.behind99), cores(a.pgCores), a.benchCores)
	}
	off := []latencyResult{r.latency}
	if r.latencyHigh.updates > 0 {
		off = append(off, r.latencyHigh)
	}
	rows := append(append(append(slices.Clone(off), r.notify...), r.notifyDeferred...), r.notifyBatched...)
	for i, l := range rows {
		on, goal := "on ("+l.trigger+")", verdict(l.notifyMet())
		if i < len(off) {
			on, goal = "off (poll 1s)", "n/a"
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %d | %d | %d | %d | %s | %s | %s | %.1f | %.0f | %.1f | %s | %s | %s | %s | %s | %.2f |\n",
			on, l.target, l.rate, l.writers, max(l.batch, 1), l.updates, l.seen, ms(l.p50), ms(l.p99), ms(l.max), l.tps(), l.perTxn(), l.cpu.Seconds(), mib(l.rssKB), goal, msFine(l.wp99), ms(l.behind99), cores(l.pgCores), l.benchCores)
	}
	fmt.Fprintf(b, "\n")
}
