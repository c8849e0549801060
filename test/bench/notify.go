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

// notifyRates are the update rates of the notify runs: the two, and
// one between that one writer reaches without saturating the machine.
var notifyRates = []int{1000, 4000, 10_000}

// notifyRuns installs the notify trigger on table (the statements
// `tidemark check --print-notify-sql` prints), measures commit -> visible
// with source.notify at each of notifyRates (latencyRunSpec; sync.poll_interval
// stays 1s, source.notify_min_gap its default), and removes the trigger.
// Every UPDATE commits on its own, so each one is a notification.
//
// rates and extra are notifyRates and no arguments in `make bench`;
// `-notify-only` takes them from -notify-rates and -notify-args, to try a
// setting (say `--source.notify_min_gap 5ms`) at the rates that matter.
func (b *bench) notifyRuns(ctx context.Context, table string, rates []int, extra []string) ([]latencyResult, error) {
	var schema string
	if err := b.pool.QueryRow(ctx, `SELECT n.nspname FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE c.oid = $1::regclass`, pgx.Identifier{table}.Sanitize()).Scan(&schema); err != nil {
		return nil, fmt.Errorf("schema of %s: %w", table, err)
	}
	st, err := postgres.NotifySQL(schema, table, notifyChannel)
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
		res, err := b.latencyRunSpec(ctx, table, latencySpec{rate: rate, writers: max(1, rate/writerRate), args: args})
		if err != nil {
			return out, fmt.Errorf("%d updates/s: %w", rate, err)
		}
		fmt.Printf("      notify, %d/s asked, %d writer(s): %s; %.1f transactions/s, %.0f records per transaction\n",
			rate, res.writers, res.line(), res.tps(), res.perTxn())
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
	for _, l := range r.notify {
		fmt.Fprintf(b, "| incremental latency with source.notify, commit -> visible read_committed (%d updates/s asked, %.0f/s reached; poll 1s) | p50 %s, p99 %s, max %s; %d/%d seen; %.1f transactions/s, %.0f records per transaction | p99 <= %s | %s |\n",
			l.target, l.rate, ms(l.p50), ms(l.p99), ms(l.max), l.seen, l.updates, l.tps(), l.perTxn(), ms(notifyGoal), verdict(l.notifyMet()))
	}
}

// renderNotify writes the section of the notify runs, next to the run
// without notify.
func (r *results) renderNotify(b *strings.Builder) {
	if len(r.notify) == 0 {
		return
	}
	fmt.Fprintf(b, "## Incremental latency with source.notify\n\n")
	fmt.Fprintf(b, "The latency run above, with the statement-level trigger that `tidemark check --print-notify-sql` prints installed on the table and `tidemark run --source.notify %s` (a connection of its own LISTENs; a notification starts a pass at once, at least source.notify_min_gap 20ms after the last one started; poll_interval stays 1s). "+
		"Every UPDATE commits on its own, so every update is a notification. A run uses one writer connection per %d updates/s asked (at least one; the writers column). "+
		"Passes that notifications start within a poll interval of the end of the last full pass are head passes, which read from the watermark less source.notify_lookback (100ms by default); the full pass after them reads the margin's index range, in windows of updated_at (16, or one per 2,000 rows changed within the margin, at most 256) with head passes between its pages, and leaves out what they read (docs/design.md, \"Head passes\" and \"Head passes during a full pass\"). "+
		"Kafka transactions and records are the checkpoint's counters from the first update until tidemark stopped; per second over the time from the first update until the last one was visible.\n\n", notifyChannel, writerRate)
	fmt.Fprintf(b, "| notify | updates/s asked | reached | writers | updates | visible | p50 | p99 | max | Kafka transactions/s | records per transaction | tidemark CPU s | peak RSS MiB | p99 <= %s |\n", ms(notifyGoal))
	fmt.Fprintf(b, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n")
	rows := append([]latencyResult{r.latency}, r.notify...)
	if r.latencyHigh.updates > 0 {
		rows = append([]latencyResult{r.latency, r.latencyHigh}, r.notify...)
	}
	for i, l := range rows {
		on, goal := "on", verdict(l.notifyMet())
		if i < len(rows)-len(r.notify) {
			on, goal = "off (poll 1s)", "n/a"
		}
		fmt.Fprintf(b, "| %s | %d | %.0f | %d | %d | %d | %s | %s | %s | %.1f | %.0f | %.1f | %s | %s |\n",
			on, l.target, l.rate, l.writers, l.updates, l.seen, ms(l.p50), ms(l.p99), ms(l.max), l.tps(), l.perTxn(), l.cpu.Seconds(), mib(l.rssKB), goal)
	}
	fmt.Fprintf(b, "\n")
}
