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
	defer func() {
		if _, err := b.pool.Exec(context.WithoutCancel(ctx), st.Remove); err != nil {
			fmt.Printf("      removing the notify trigger: %v\n", err)
		}
	}()
	var out []latencyResult
	for _, rate := range rates {
		args := append([]string{"--source.notify", notifyChannel}, extra...)
		res, err := b.latencyRunSpec(ctx, table, latencySpec{rate: rate, writers: max(1, rate/writerRate/batch), batch: batch, args: args})
		if err != nil {
			return out, fmt.Errorf("%d updates/s: %w", rate, err)
		}
		res.trigger = postgres.NotifyKinds[kind]
		fmt.Printf("      notify (%s trigger), %d/s asked, %d writer(s), %d update(s) a commit: %s; %.1f transactions/s, %.0f records per transaction\n",
			res.trigger, rate, res.writers, batch, res.line(), res.tps(), res.perTxn())
		out = append(out, res)
	}
	return out, nil
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
	for _, l := range append(slices.Clone(r.notify), r.notifyDeferred...) {
		fmt.Fprintf(b, "| incremental latency with source.notify, %s trigger, commit -> visible read_committed (%d updates/s asked, %.0f/s reached; poll 1s) | p50 %s, p99 %s, max %s; %d/%d seen; %.1f transactions/s, %.0f records per transaction | p99 <= %s | %s |\n",
			l.trigger, l.target, l.rate, ms(l.p50), ms(l.p99), ms(l.max), l.seen, l.updates, l.tps(), l.perTxn(), ms(notifyGoal), verdict(l.notifyMet()))
	}
	for _, l := range r.notifyBatched {
		fmt.Fprintf(b, "| the same, %d updates/s asked in source commits of %d rows (%.0f/s reached; not the goal's setting, which commits each update alone: it tells the cost of the commits from that of the rows) | p50 %s, p99 %s, max %s; %d/%d seen; %.1f transactions/s, %.0f records per transaction | (p99 <= %s) | %s |\n",
			l.target, l.batch, l.rate, ms(l.p50), ms(l.p99), ms(l.max), l.seen, l.updates, l.tps(), l.perTxn(), ms(notifyGoal), verdict(l.notifyMet()))
	}
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
	fmt.Fprintf(b, "| notify | updates/s asked | reached | writers | updates a commit | updates | visible | p50 | p99 | max | Kafka transactions/s | records per transaction | tidemark CPU s | peak RSS MiB | p99 <= %s |\n", ms(notifyGoal))
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
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
		fmt.Fprintf(b, "| %s | %d | %.0f | %d | %d | %d | %d | %s | %s | %s | %.1f | %.0f | %.1f | %s | %s |\n",
			on, l.target, l.rate, l.writers, max(l.batch, 1), l.updates, l.seen, ms(l.p50), ms(l.p99), ms(l.max), l.tps(), l.perTxn(), l.cpu.Seconds(), mib(l.rssKB), goal)
	}
	fmt.Fprintf(b, "\n")
}
