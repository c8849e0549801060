package main

// Task mode (docs/scale-out.md): twelve tables as the tasks of one
// configuration with a tables: list, run continuously (`tidemark run`) by
// 1 and by 3 processes, the members of the consumer group tidemark-<name>,
// in alternating rounds: rows/s of the initial loads of all tasks together
// and the members' CPU. Then the recovery of a member's tasks: 3 members,
// every task caught up and a writer updating every table, one member is
// stopped with SIGTERM (and later another with SIGKILL); for each task it
// ran, the time until that task commits again from another member, as a
// read_committed consumer of the ledger topic sees it.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/schemas"
)

const (
	// taskTables is the number of tables (tasks) of the configuration.
	taskTables = 12
	// taskMembers is the number of processes of the scale-out runs.
	taskMembers = 3
	// taskRowsCap caps the rows per table (the time budget of `make bench`).
	taskRowsCap = 100_000
	// taskSession is group.session_timeout (kfake's minimum).
	taskSession = 6 * time.Second
	// taskPoll is sync.poll_interval.
	taskPoll = 200 * time.Millisecond
	// taskUpdateRate is the updates per second per table of the recovery
	// runs' writer.
	taskUpdateRate = 20
	// taskRecoveryBound is the bound of docs/scale-out.md and the chaos
	// test: a killed member's tasks run again within session_timeout + 10 s.
	taskRecoveryBound = taskSession + 10*time.Second
	// taskTermGoal: a member stopped by a signal leaves the group, so its
	// tasks move without waiting out the session timeout.
	taskTermGoal = taskSession
)

// taskRows is the rows of each table for -rows rows.
func taskRows(rows int) int { return min(max(10_000, rows/taskTables), taskRowsCap) }

func taskTableNames(rows int) []string {
	var out []string
	for i := range taskTables {
		out = append(out, fmt.Sprintf("bench_tasks_%d_%02d", rows, i))
	}
	return out
}

// taskLoad is one initial load of every table by some members.
type taskLoad struct {
	members int
	round   int
	rows    int64 // all tables
	wall    time.Duration
	cpu     time.Duration // the members' rusage, summed
	pgCPU   time.Duration
	maxRSS  int64  // the largest member's peak RSS
	spread  string // tasks per member when the load was done
	starts  int    // task runs started (12 when no task moved)
}

func (l taskLoad) rowsPerSec() float64 { return float64(l.rows) / l.wall.Seconds() }

func (l taskLoad) line() string {
	return fmt.Sprintf("%d process%s: %d rows in %.2f s: %.0f rows/s; tidemark CPU %.1f s (%.1f s per 1M rows), PostgreSQL CPU %.1f s; tasks per member %s, task runs started %d, peak RSS %s MiB",
		l.members, map[bool]string{true: "es"}[l.members > 1], l.rows, l.wall.Seconds(), l.rowsPerSec(),
		l.cpu.Seconds(), per1M(l.cpu, l.rows), l.pgCPU.Seconds(), l.spread, l.starts, mib(l.maxRSS))
}

// taskRecovery is one member stopped by a signal and how long its tasks
// stood still.
type taskRecovery struct {
	signal string
	member int      // index of the member stopped
	tasks  []string // the tasks it ran
	times  []time.Duration
	// exited is how long the member took to exit after the signal.
	exited time.Duration
	// others counts tasks of the other members that started a new run
	// meanwhile (a sticky balancer moves none).
	others int
}

func (r taskRecovery) max() time.Duration {
	if len(r.times) == 0 {
		return 0
	}
	return slices.Max(r.times)
}

func (r taskRecovery) median() time.Duration {
	var s []float64
	for _, t := range r.times {
		s = append(s, float64(t))
	}
	return time.Duration(median(s))
}

func (r taskRecovery) line() string {
	var ts []string
	for _, t := range r.times {
		ts = append(ts, fmt.Sprintf("%.1f", t.Seconds()))
	}
	return fmt.Sprintf("%s of member %d (%d tasks), exited after %.1f s: its tasks committing again on the others after max %.1f s, median %.1f s (%s s); tasks of the other members that moved: %d",
		r.signal, r.member+1, len(r.tasks), r.exited.Seconds(), r.max().Seconds(), r.median().Seconds(), strings.Join(ts, ", "), r.others)
}

type taskResult struct {
	rowsPerTable int
	table        tableInfo // the first table
	rounds       int
	loads        []taskLoad
	term, kill   taskRecovery
	cores        int
}

func (r taskResult) of(members int) []taskLoad {
	var out []taskLoad
	for _, l := range r.loads {
		if l.members == members {
			out = append(out, l)
		}
	}
	return out
}

// ratios are the 3-process rows/s over the same round's 1-process rows/s.
func (r taskResult) ratios() []float64 {
	one := map[int]float64{}
	for _, l := range r.loads {
		if l.members == 1 {
			one[l.round] = l.rowsPerSec()
		}
	}
	var out []float64
	for _, l := range r.loads {
		if l.members == taskMembers && one[l.round] > 0 {
			out = append(out, l.rowsPerSec()/one[l.round])
		}
	}
	return out
}

func medianRPS(ls []taskLoad) float64 {
	var v []float64
	for _, l := range ls {
		v = append(v, l.rowsPerSec())
	}
	return median(v)
}

func medianCPU1M(ls []taskLoad) float64 {
	var v []float64
	for _, l := range ls {
		v = append(v, per1M(l.cpu, l.rows))
	}
	return median(v)
}

// tasksScenario creates the tables and runs the loads and the recovery.
func (b *bench) tasksScenario(ctx context.Context) (taskResult, error) {
	rows := taskRows(b.opts.rows)
	res := taskResult{rowsPerTable: rows, rounds: b.opts.pairs, cores: b.res.machine.cores}
	tables := taskTableNames(rows)
	step(fmt.Sprintf("task mode: %d tables of %d rows", taskTables, rows))
	for i, t := range tables {
		info, err := createTableShaped(ctx, b.pool, t, rows, false)
		if err != nil {
			return res, err
		}
		if i == 0 {
			res.table = info
		}
	}
	step(fmt.Sprintf("task mode: initial load of %d tables by 1 and by %d processes (`tidemark run`, group.session_timeout %s, poll_interval %s): %d rounds",
		taskTables, taskMembers, taskSession, taskPoll, b.opts.pairs))
	for round := range b.opts.pairs {
		order := []int{1, taskMembers}
		if round%2 == 1 {
			order = []int{taskMembers, 1}
		}
		for _, n := range order {
			l, err := b.taskLoadRun(ctx, tables, rows, n)
			if err != nil {
				return res, fmt.Errorf("task mode, %d processes: %w", n, err)
			}
			l.round = round + 1
			fmt.Printf("      %s\n", l.line())
			res.loads = append(res.loads, l)
		}
	}
	fmt.Printf("      median: 1 process %.0f rows/s, %d processes %.0f rows/s, ratio %.2f\n",
		medianRPS(res.of(1)), taskMembers, medianRPS(res.of(taskMembers)), median(res.ratios()))
	step(fmt.Sprintf("task mode: recovery of a member's tasks, %d members, %d updates/s per table, SIGTERM then SIGKILL", taskMembers, taskUpdateRate))
	var err error
	if res.term, res.kill, err = b.taskRecoveryRun(ctx, tables, rows); err != nil {
		return res, fmt.Errorf("task mode recovery: %w", err)
	}
	return res, nil
}

// taskCluster is one configuration of the twelve tables (a fresh connector
// name, so fresh topics) and its member processes.
type taskCluster struct {
	b      *bench
	name   string
	config string
	tasks  []string // task names, sorted
	procs  []*proc
	logs   []string
	dead   []bool // stopped or killed on purpose
	w      *ledgerWatch
}

func (b *bench) newTaskCluster(tables []string) (*taskCluster, error) {
	name := b.next("tasks")
	c := &taskCluster{b: b, name: name, config: filepath.Join(b.work, name+".yaml")}
	q := func(s string) string { j, _ := json.Marshal(s); return string(j) }
	var brokers, list []string
	for _, a := range b.k.addrs {
		brokers = append(brokers, q(a))
	}
	for _, t := range tables {
		list = append(list, "  - "+q(t))
		c.tasks = append(c.tasks, "public."+t)
	}
	slices.Sort(c.tasks)
	cfg := fmt.Sprintf(`# written by test/bench (task mode)
name: %s
data_dir: %s
source:
  dsn: %s
kafka:
  brokers: [%s]
  topic_prefix: %s
  offsets_topic: %s
  ledger_topic: %s
group:
  session_timeout: %s
sync:
  poll_interval: %s
log:
  format: json
tables:
%s
`, q(name), q(filepath.Join(b.work, name+"-data")), q(b.url), strings.Join(brokers, ", "), q(name+"."),
		q(name+"-offsets"), q(name+"-ledger"), taskSession, taskPoll, strings.Join(list, "\n"))
	return c, os.WriteFile(c.config, []byte(cfg), 0o600)
}

func (c *taskCluster) connector(task string) string { return c.name + "-" + task }

// topics are every topic the configuration's members create.
func (c *taskCluster) topics() []string {
	out := []string{c.name + "-offsets", c.name + "-ledger", "tidemark-tasks." + c.name}
	for _, t := range c.tasks {
		out = append(out, c.name+"."+t)
	}
	return out
}

// startMember starts one more `tidemark run` with the configuration.
func (c *taskCluster) startMember() error {
	i := len(c.procs)
	log := filepath.Join(c.b.work, fmt.Sprintf("%s-member%d.log", c.name, i+1))
	p, err := c.b.start(&tmRun{name: c.name, config: c.config, log: log}, "run")
	if err != nil {
		return err
	}
	c.procs, c.logs, c.dead = append(c.procs, p), append(c.logs, log), append(c.dead, false)
	return nil
}

// unexpectedExit reports a member that exited without being told to.
func (c *taskCluster) unexpectedExit() error {
	for i, p := range c.procs {
		if !c.dead[i] && p.exited() {
			return fmt.Errorf("member %d exited on its own: %v (log %s):\n%s", i+1, p.err, c.logs[i], tail(c.logs[i], 30))
		}
	}
	return nil
}

// watch waits for the ledger topic and starts reading it.
func (c *taskCluster) watch(ctx context.Context) error {
	topic := c.name + "-ledger"
	// A client of its own: kgo answers a metadata request from what it
	// learnt within metadata_min_age (5 s by default), so the shared
	// admin client would see the new topic up to 5 s late.
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.b.k.addrs...), kgo.MetadataMinAge(50*time.Millisecond))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		td, err := adm.ListTopics(ctx, topic)
		if err == nil && td.Has(topic) && td[topic].Err == nil {
			break
		}
		if err := c.unexpectedExit(); err != nil {
			return err
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("no member created the ledger topic %s (log %s):\n%s", topic, c.logs[0], tail(c.logs[0], 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
	w, err := watchLedger(ctx, c.b.k.addrs, topic)
	c.w = w
	return err
}

// waitCaughtUp waits until every task's ledger shows rows published and
// returns when the bench's consumer saw the last of them.
func (c *taskCluster) waitCaughtUp(ctx context.Context, rows int64, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		var last time.Time
		done := 0
		for _, t := range c.tasks {
			if at, ok := c.w.reached(c.connector(t), rows); ok {
				done++
				last = maxTime(last, at)
			}
		}
		if done == len(c.tasks) {
			return last, nil
		}
		if err := c.unexpectedExit(); err != nil {
			return time.Time{}, err
		}
		if err := c.w.failed(); err != nil {
			return time.Time{}, fmt.Errorf("reading the ledger: %w", err)
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			var behind []string
			for _, t := range c.tasks {
				if _, ok := c.w.reached(c.connector(t), rows); !ok {
					behind = append(behind, fmt.Sprintf("%s (%d published)", t, c.w.published(c.connector(t))))
				}
			}
			return time.Time{}, fmt.Errorf("after %s, %d of %d tasks have not published %d rows: %s%s", timeout, len(behind), len(c.tasks), rows, strings.Join(behind, ", "), c.logTails(20))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (c *taskCluster) logTails(n int) string {
	var s strings.Builder
	for i, l := range c.logs {
		fmt.Fprintf(&s, "\n--- member %d (%s), last %d lines:\n%s", i+1, l, n, tail(l, n))
	}
	return s.String()
}

// stopAll sends SIGTERM to every member still running and waits for each
// to exit 0.
func (c *taskCluster) stopAll() error {
	for i, p := range c.procs {
		if !c.dead[i] && !p.exited() {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	var errs []error
	for i, p := range c.procs {
		if c.dead[i] {
			continue
		}
		select {
		case <-p.done:
		case <-time.After(90 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("member %d did not exit within 90 s of SIGTERM (killed; log %s):\n%s", i+1, c.logs[i], tail(c.logs[i], 30)))
			continue
		}
		if p.err != nil {
			errs = append(errs, fmt.Errorf("member %d: %v after SIGTERM, want exit 0 (log %s):\n%s", i+1, p.err, c.logs[i], tail(c.logs[i], 30)))
		}
		c.dead[i] = true
	}
	return errors.Join(errs...)
}

// close kills what still runs (after a failure), stops the ledger reader
// and drops the topics.
func (c *taskCluster) close(ctx context.Context) {
	for i, p := range c.procs {
		if !c.dead[i] {
			p.stop(30 * time.Second)
		}
	}
	if c.w != nil {
		c.w.close()
	}
	c.b.k.drop(context.WithoutCancel(ctx), c.topics()...)
}

// memberTasks are the tasks a member runs now, from its log: "group:
// assigned tasks" adds (the cooperative balancer reports what it adds),
// "group: revoked tasks" and "group: membership lost" remove.
func memberTasks(path string) []string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	set := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var l struct {
		Msg   string `json:"msg"`
		Tasks string `json:"tasks"`
	}
	for sc.Scan() {
		l.Msg, l.Tasks = "", ""
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Tasks == "" {
			continue
		}
		add := strings.HasPrefix(l.Msg, "group: assigned tasks")
		if !add && !strings.HasPrefix(l.Msg, "group: revoked tasks") && !strings.HasPrefix(l.Msg, "group: membership lost") {
			continue
		}
		for _, t := range strings.Split(l.Tasks, ",") {
			if add {
				set[t] = true
			} else {
				delete(set, t)
			}
		}
	}
	var out []string
	for t := range set {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// spread is the number of tasks each live member runs, e.g. "4/4/4".
func (c *taskCluster) spread() string {
	var parts []string
	for i := range c.procs {
		if !c.dead[i] {
			parts = append(parts, strconv.Itoa(len(memberTasks(c.logs[i]))))
		}
	}
	return strings.Join(parts, "/")
}

// taskLoadRun loads every table with a fresh connector run by n members,
// from the start of the first process until every task's ledger shows its
// rows published (read_committed), then stops the members (each must exit
// 0) and reads every topic back (exactly one record per row).
func (b *bench) taskLoadRun(ctx context.Context, tables []string, rows, n int) (taskLoad, error) {
	c, err := b.newTaskCluster(tables)
	if err != nil {
		return taskLoad{}, err
	}
	defer c.close(ctx)
	pg0, _ := b.pgCP.sample()
	for range n {
		if err := c.startMember(); err != nil {
			return taskLoad{}, err
		}
	}
	start := c.procs[0].start
	if err := c.watch(ctx); err != nil {
		return taskLoad{}, err
	}
	done, err := c.waitCaughtUp(ctx, int64(rows), 5*time.Minute)
	if err != nil {
		return taskLoad{}, err
	}
	l := taskLoad{members: n, rows: int64(rows) * int64(len(tables)), wall: done.Sub(start), spread: c.spread(), starts: c.w.runs()}
	if err := c.stopAll(); err != nil {
		return l, err
	}
	pg1, _ := b.pgCP.sample()
	l.pgCPU = pg1 - pg0
	for _, p := range c.procs {
		cpu, rss := p.rusage()
		l.cpu += cpu
		l.maxRSS = max(l.maxRSS, rss)
	}
	for _, t := range c.tasks {
		topic := c.name + "." + t
		got, _, err := b.k.countCommitted(ctx, topic, int64(rows))
		if err != nil {
			return l, fmt.Errorf("read back %s: %w", topic, err)
		}
		if got != int64(rows) {
			return l, fmt.Errorf("topic %s holds %d committed records, want %d: %w", topic, got, rows, errMismatch)
		}
	}
	return l, nil
}

// taskRecoveryRun starts 3 members on a fresh connector, waits for every
// initial load, starts the writer, then stops one member with SIGTERM and
// measures, starts a replacement, and kills one with SIGKILL and measures.
func (b *bench) taskRecoveryRun(ctx context.Context, tables []string, rows int) (term, kill taskRecovery, err error) {
	c, err := b.newTaskCluster(tables)
	if err != nil {
		return term, kill, err
	}
	defer c.close(ctx)
	for range taskMembers {
		if err := c.startMember(); err != nil {
			return term, kill, err
		}
	}
	if err := c.watch(ctx); err != nil {
		return term, kill, err
	}
	if _, err := c.waitCaughtUp(ctx, int64(rows), 5*time.Minute); err != nil {
		return term, kill, err
	}
	wctx, cancelWriter := context.WithCancel(ctx)
	werr := b.taskWriter(wctx, tables, rows)
	stopWriter := sync.OnceValue(func() error { cancelWriter(); return <-werr })
	defer stopWriter()

	if term, err = c.recovery(ctx, syscall.SIGTERM); err != nil {
		return term, kill, err
	}
	fmt.Printf("      %s\n", term.line())
	if err := c.startMember(); err != nil {
		return term, kill, err
	}
	if kill, err = c.recovery(ctx, syscall.SIGKILL); err != nil {
		return term, kill, err
	}
	fmt.Printf("      %s\n", kill.line())
	if err := stopWriter(); err != nil {
		return term, kill, err
	}
	return term, kill, c.stopAll()
}

// taskWriter updates random rows of every table, taskUpdateRate per second
// each, through the bench's pool, until ctx ends; the channel gets the
// first error (nil after ctx ended).
func (b *bench) taskWriter(ctx context.Context, tables []string, rows int) chan error {
	out := make(chan error, 1)
	var wg sync.WaitGroup
	var once sync.Once
	for _, t := range tables {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sql := "UPDATE " + pgx.Identifier{t}.Sanitize() + " SET updated_at = clock_timestamp() WHERE id = $1"
			tick := time.NewTicker(time.Second / taskUpdateRate)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				if _, err := b.pool.Exec(ctx, sql, rand.Int64N(int64(rows))+1); err != nil && ctx.Err() == nil {
					once.Do(func() { out <- fmt.Errorf("writer, %s: %w", t, err) })
					return
				}
			}
		}()
	}
	go func() {
		wg.Wait()
		once.Do(func() { out <- nil })
	}()
	return out
}

// settle waits until the group is quiet: every task assigned to exactly one
// live member (by the members' logs), no task run started for 5 s, and
// every task committed within the last 2 s.
func (c *taskCluster) settle(ctx context.Context) error {
	deadline := time.Now().Add(90 * time.Second)
	var why string
	for {
		if err := c.unexpectedExit(); err != nil {
			return err
		}
		owners := map[string]int{}
		for i := range c.procs {
			if !c.dead[i] {
				for _, t := range memberTasks(c.logs[i]) {
					owners[t]++
				}
			}
		}
		why = ""
		for _, t := range c.tasks {
			if owners[t] != 1 {
				why = fmt.Sprintf("task %s is assigned to %d members", t, owners[t])
				break
			}
			if at := c.w.lastTxn(c.connector(t)); time.Since(at) > 2*time.Second {
				why = fmt.Sprintf("task %s last committed %s ago", t, time.Since(at).Round(time.Millisecond))
				break
			}
		}
		if why == "" && time.Since(c.w.lastRunStart()) < 5*time.Second {
			why = "a task run started less than 5 s ago"
		}
		if why == "" {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the group did not settle within 90 s: %s%s", why, c.logTails(20))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// recovery stops the live member running the most tasks with sig and
// measures, for each of its tasks, the time from the signal until the
// bench's read_committed ledger consumer sees a transaction of a new run
// of that task.
func (c *taskCluster) recovery(ctx context.Context, sig syscall.Signal) (taskRecovery, error) {
	res := taskRecovery{signal: map[syscall.Signal]string{syscall.SIGTERM: "SIGTERM", syscall.SIGKILL: "SIGKILL"}[sig], member: -1}
	if err := c.settle(ctx); err != nil {
		return res, err
	}
	for i := range c.procs {
		if !c.dead[i] && (res.member < 0 || len(memberTasks(c.logs[i])) > len(res.tasks)) {
			res.member, res.tasks = i, memberTasks(c.logs[i])
		}
	}
	if len(res.tasks) == 0 {
		return res, fmt.Errorf("no member runs a task%s", c.logTails(20))
	}
	runBefore := map[string]string{}
	for _, t := range c.tasks {
		runBefore[t] = c.w.lastRunID(c.connector(t))
	}
	p := c.procs[res.member]
	c.dead[res.member] = true
	t0 := time.Now()
	if err := p.cmd.Process.Signal(sig); err != nil {
		return res, err
	}
	select {
	case <-p.done:
		res.exited = time.Since(t0)
	case <-time.After(90 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return res, fmt.Errorf("member %d did not exit within 90 s of %s (log %s):\n%s", res.member+1, res.signal, c.logs[res.member], tail(c.logs[res.member], 30))
	}
	if sig == syscall.SIGTERM && p.err != nil {
		return res, fmt.Errorf("member %d: %v after SIGTERM, want exit 0 (log %s):\n%s", res.member+1, p.err, c.logs[res.member], tail(c.logs[res.member], 30))
	}
	limit := taskSession + 60*time.Second
	for {
		res.times = res.times[:0]
		missing := []string{}
		for _, t := range res.tasks {
			at, ok := c.w.newRunTxn(c.connector(t), runBefore[t], t0)
			if !ok {
				missing = append(missing, t)
				continue
			}
			res.times = append(res.times, at.Sub(t0))
		}
		if len(missing) == 0 {
			break
		}
		if err := c.unexpectedExit(); err != nil {
			return res, err
		}
		if time.Since(t0) > limit || ctx.Err() != nil {
			return res, fmt.Errorf("%s of member %d: after %s, tasks %s have not committed from another member%s", res.signal, res.member+1, limit, strings.Join(missing, ","), c.logTails(30))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, t := range c.tasks {
		if !slices.Contains(res.tasks, t) {
			if _, ok := c.w.newRunAny(c.connector(t), runBefore[t], t0); ok {
				res.others++
			}
		}
	}
	return res, nil
}

// ledgerWatch reads a ledger topic read_committed from its start and keeps
// every entry with the time it was seen.
type ledgerWatch struct {
	mu     sync.Mutex
	by     map[string][]seenEntry
	runAt  time.Time // the last time an entry of a new run was seen
	nRuns  int
	err    error
	cancel context.CancelFunc
	done   chan struct{}
}

type seenEntry struct {
	kind, runID string
	published   int64
	at          time.Time // when the bench's consumer saw it
}

func watchLedger(ctx context.Context, addrs []string, topic string) (*ledgerWatch, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(50*time.Millisecond),
		// The default 5 s would delay the first fetch when the first
		// metadata load finds the new topic without its partition yet.
		kgo.MetadataMinAge(100*time.Millisecond))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &ledgerWatch{by: map[string][]seenEntry{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		defer cl.Close()
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			now := time.Now()
			fs.EachError(func(_ string, _ int32, e error) {
				if ctx.Err() == nil && !errors.Is(e, context.Canceled) {
					w.mu.Lock()
					w.err = e
					w.mu.Unlock()
				}
			})
			w.mu.Lock()
			fs.EachRecord(func(r *kgo.Record) {
				if r.Value == nil {
					return
				}
				e, err := schemas.DecodeLedgerEntry(r.Value)
				if err != nil {
					w.err = err
					return
				}
				prev := w.by[e.Connector]
				if len(prev) == 0 || prev[len(prev)-1].runID != e.RunID {
					w.runAt = now
					w.nRuns++
				}
				w.by[e.Connector] = append(prev, seenEntry{kind: e.Kind, runID: e.RunID, published: e.Counters.Published, at: now})
			})
			w.mu.Unlock()
		}
	}()
	return w, nil
}

func (w *ledgerWatch) close() { w.cancel(); <-w.done }

func (w *ledgerWatch) failed() error { w.mu.Lock(); defer w.mu.Unlock(); return w.err }

// reached is when the connector's ledger first showed rows published.
func (w *ledgerWatch) reached(conn string, rows int64) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.by[conn] {
		if e.published >= rows {
			return e.at, true
		}
	}
	return time.Time{}, false
}

func (w *ledgerWatch) published(conn string) int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	es := w.by[conn]
	if len(es) == 0 {
		return 0
	}
	return es[len(es)-1].published
}

// runs is the number of task runs started (entries of a new run).
func (w *ledgerWatch) runs() int { w.mu.Lock(); defer w.mu.Unlock(); return w.nRuns }

func (w *ledgerWatch) lastRunStart() time.Time { w.mu.Lock(); defer w.mu.Unlock(); return w.runAt }

func (w *ledgerWatch) lastRunID(conn string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	es := w.by[conn]
	if len(es) == 0 {
		return ""
	}
	return es[len(es)-1].runID
}

// lastTxn is when the connector's last transaction entry was seen.
func (w *ledgerWatch) lastTxn(conn string) time.Time {
	w.mu.Lock()
	defer w.mu.Unlock()
	es := w.by[conn]
	for i := len(es) - 1; i >= 0; i-- {
		if es[i].kind == schemas.LedgerTxn {
			return es[i].at
		}
	}
	return time.Time{}
}

// newRunTxn is when the first transaction of a run other than old was seen
// after t0.
func (w *ledgerWatch) newRunTxn(conn, old string, t0 time.Time) (time.Time, bool) {
	return w.find(conn, func(e seenEntry) bool { return e.kind == schemas.LedgerTxn && e.runID != old && e.at.After(t0) })
}

// newRunAny is when any entry of a run other than old was seen after t0.
func (w *ledgerWatch) newRunAny(conn, old string, t0 time.Time) (time.Time, bool) {
	return w.find(conn, func(e seenEntry) bool { return e.runID != old && e.at.After(t0) })
}

func (w *ledgerWatch) find(conn string, ok func(seenEntry) bool) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, e := range w.by[conn] {
		if ok(e) {
			return e.at, true
		}
	}
	return time.Time{}, false
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// tasksSummary writes the summary rows.
func (r *results) tasksSummary(b *strings.Builder) {
	t := r.tasks
	if len(t.loads) == 0 {
		return
	}
	one, three := t.of(1), t.of(taskMembers)
	fmt.Fprintf(b, "| task mode: %d tables x %d rows, initial load, 1 vs %d processes (`tidemark run`), median of %d rounds; %d cores | 1: %.0f rows/s, %d: %.0f rows/s, ratio **%.2f** (%s); tidemark CPU per 1M rows %.1f s vs %.1f s; peak RSS of a member %s MiB (%d tasks) vs %s MiB (%d tasks) | | |\n",
		taskTables, t.rowsPerTable, taskMembers, t.rounds, t.cores, medianRPS(one), taskMembers, medianRPS(three), median(t.ratios()), fmtRatios(t.ratios()),
		medianCPU1M(one), medianCPU1M(three), mib(maxRSS(one)), taskTables, mib(maxRSS(three)), taskTables/taskMembers)
	if len(t.term.times) > 0 {
		fmt.Fprintf(b, "| task mode: SIGTERM of 1 of %d members: its %d tasks committing again on the others | max %.1f s, median %.1f s | < session_timeout (%s) | %s |\n",
			taskMembers, len(t.term.tasks), t.term.max().Seconds(), t.term.median().Seconds(), taskTermGoal, verdict(t.term.max() < taskTermGoal))
	}
	if len(t.kill.times) > 0 {
		fmt.Fprintf(b, "| task mode: SIGKILL of 1 of %d members (group.session_timeout %s): its %d tasks committing again on the others | max %.1f s, median %.1f s | <= session_timeout + 10 s | %s |\n",
			taskMembers, taskSession, len(t.kill.tasks), t.kill.max().Seconds(), t.kill.median().Seconds(), verdict(t.kill.max() <= taskRecoveryBound))
	}
}

func maxRSS(ls []taskLoad) int64 {
	var m int64
	for _, l := range ls {
		m = max(m, l.maxRSS)
	}
	return m
}

func fmtRatios(v []float64) string {
	var s []string
	for _, x := range v {
		s = append(s, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(s, ", ")
}

// renderTasks writes the section.
func (r *results) renderTasks(b *strings.Builder) {
	t := r.tasks
	if len(t.loads) == 0 {
		return
	}
	fmt.Fprintf(b, "## Task mode: %d tables, 1 and %d processes\n\n", taskTables, taskMembers)
	fmt.Fprintf(b, "One configuration with a `tables:` list of %d tables of %d rows each (the columns of the main table, %.0f MiB heap each; %d rows in all), `group.session_timeout` %s, `sync.poll_interval` %s, defaults otherwise. ",
		taskTables, t.rowsPerTable, t.table.heapMB, taskTables*t.rowsPerTable, taskSession, taskPoll)
	fmt.Fprintf(b, "Each run is a fresh connector name (fresh topics, group and tasks topic) whose members are started together as `tidemark run` (continuous, task mode); wall time runs from the start of the first process until a read_committed consumer of the ledger topic has seen every task's checkpoint counters reach its table's rows (the ledger entry commits in the same transaction as the records); then every member gets SIGTERM and must exit 0, and every topic is read back read_committed and must hold exactly one record per row. 1 and %d processes alternate, in a rotating order. CPU = the members' rusage, summed. ", taskMembers)
	fmt.Fprintf(b, "This machine has %d cores, shared by the members, the PostgreSQL server and the broker; one member running its %d tasks side by side already keeps both cores busy, so %d processes add no CPU here and the ratio shows what they cost instead: %d Go runtimes and pools, the group's join and rebalances while the members start, and the tasks that move from the first member to join to the others (and resume there from their checkpoints; see task runs started). With more cores, or members on machines of their own, the members' loads run in parallel and rows/s should grow with the members until PostgreSQL or the broker is the limit.\n\n", t.cores, taskTables, taskMembers, taskMembers)
	fmt.Fprintf(b, "| processes | round | rows/s | wall s | tidemark CPU s | CPU s per 1M rows | PostgreSQL CPU s | tasks per member | task runs started | largest peak RSS MiB |\n|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	for _, l := range t.loads {
		fmt.Fprintf(b, "| %d | %d | %.0f | %.2f | %.1f | %.1f | %.1f | %s | %d | %s |\n",
			l.members, l.round, l.rowsPerSec(), l.wall.Seconds(), l.cpu.Seconds(), per1M(l.cpu, l.rows), l.pgCPU.Seconds(), l.spread, l.starts, mib(l.maxRSS))
	}
	fmt.Fprintf(b, "\nMedian: 1 process %.0f rows/s, %d processes %.0f rows/s, ratio %.2f (by round: %s).\n\n",
		medianRPS(t.of(1)), taskMembers, medianRPS(t.of(taskMembers)), median(t.ratios()), fmtRatios(t.ratios()))
	fmt.Fprintf(b, "**Recovery.** %d members on a fresh connector, every task caught up, and a writer updating random rows of every table, %d per second each (one pgx pool). The member running the most tasks gets the signal at t0; for each task it ran, recovery is the time from t0 until the bench's read_committed ledger consumer sees a transaction of a new run of that task (so it includes the member's stop, the rebalance, the new owner's producer initialisation and checkpoint read, a poll and a commit). After the SIGTERM measure a new member replaces the stopped one and the group settles before the SIGKILL. The other members learn of a rebalance at their next heartbeat, every %s here (a third of the session timeout), so a SIGTERM costs 0 to %s plus the task start; a SIGKILL costs the session timeout counted from the killed member's last heartbeat (so %s to %s) plus the same. One measure per signal.\n\n",
		taskMembers, taskUpdateRate, taskSession/3, taskSession/3, taskSession-taskSession/3, taskSession+taskSession/3)
	fmt.Fprintf(b, "| signal | tasks | member exited after s | recovery max s | recovery median s | per task s | other members' tasks moved |\n|---|---:|---:|---:|---:|---|---:|\n")
	for _, rc := range []taskRecovery{t.term, t.kill} {
		if rc.signal == "" {
			continue
		}
		var ts []string
		for _, d := range rc.times {
			ts = append(ts, fmt.Sprintf("%.1f", d.Seconds()))
		}
		fmt.Fprintf(b, "| %s | %d | %.1f | %.1f | %.1f | %s | %d |\n", rc.signal, len(rc.tasks), rc.exited.Seconds(), rc.max().Seconds(), rc.median().Seconds(), strings.Join(ts, ", "), rc.others)
	}
	fmt.Fprintf(b, "\n")
}
