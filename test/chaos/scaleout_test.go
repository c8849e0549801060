package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// TestScaleOutStorm (issue 16, task mode): three `tidemark run` processes
// with one configuration of 12 tables form a consumer group on the world's
// kfake and share the tables as tasks, while every table changes. The
// storm, in rounds, each on a settled group (see fleet.settle): a random
// member is killed with SIGKILL (sometimes two at once) and restarted after
// a short random delay; exactly one round stops a member with SIGTERM
// instead (it must exit 0) and restarts it. After each round the test waits
// until every task has a ledger entry (run start or commit) newer than the
// last death: the recovery time, which must stay within session_timeout +
// 10 s (group.session_timeout is 6s, kfake's minimum). Afterwards:
//   - no process ever exited other than by our signals (SIGTERM: exit 0),
//     and no task stopped on its own;
//   - the ledger of every task `<name>-<task>` is one chain: once a run has
//     started no other run commits, sequence numbers never repeat and every
//     transaction continues the one before it (so no task ever committed
//     from two members at once);
//   - after a SIGTERM of every member and one `run --once` (every task
//     once), the fold of every table's topic equals the table and the six
//     counts are 0.
func TestScaleOutStorm(t *testing.T) {
	storm := 35 * time.Second
	if soak() {
		storm = 5 * time.Minute
	}
	const (
		members        = 3
		sessionTimeout = 6 * time.Second
		recoveryBound  = sessionTimeout + 10*time.Second
	)
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x7363616c))
	w := newWorld(t, nil)
	w.sync["poll_interval"] = "200ms"
	tasks := scaleTasks(w, 12)

	// One table per task, the shape of items, each with its own mutator.
	var muts []*mutator
	for i, tk := range tasks {
		w.db.Exec(t, strings.ReplaceAll(itemsDDL, "items", tk.table))
		m := newTableMutator(w, tk.table, seed+uint64(i)*7919)
		seedTable(t, w, m, tk.table, 40+m.rng.IntN(60))
		muts = append(muts, m)
	}
	var stops []func() mutStats
	for _, m := range muts {
		stops = append(stops, m.run(200*time.Millisecond))
	}
	stopMuts := func() mutStats {
		var sum mutStats
		for _, stop := range stops {
			s := stop()
			sum.Txns += s.Txns
			sum.Inserts += s.Inserts
			sum.Updates += s.Updates
			sum.TieRows += s.TieRows
			sum.SoftDeletes += s.SoftDeletes
			sum.Undeletes += s.Undeletes
			sum.Failed += s.Failed
		}
		stops = nil
		return sum
	}
	defer func() {
		if stops != nil {
			stopMuts()
		}
	}()

	cfg := scaleConfig(t, w, tasks, sessionTimeout)
	conns := make([]string, len(tasks))
	for i, tk := range tasks {
		conns[i] = tk.conn
	}
	lt := startLedgerTail(t, w)
	if dir := os.Getenv("TIDEMARK_CHAOS_LOGS"); dir != "" {
		watchGroup(t, w, "tidemark-"+w.name, filepath.Join(dir, "group.txt"))
	}
	f := &fleet{w: w, cfg: cfg, slots: make([]*member, members)}
	defer f.dumpOnFailure(t)
	for s := range members {
		f.start(s)
	}

	// Every task commits, and the 12 tasks end up spread over the three
	// members, each process running exactly what the group assigned it.
	waitFor(t, 90*time.Second, "every task to commit", func() bool {
		return len(lt.missingAfter(conns, time.Time{})) == 0 || f.failed()
	})
	f.failNow(t, "start-up")
	adm := newAdmin(t, w)
	group := "tidemark-" + w.name
	t.Logf("start-up: every task committed; settled: %s", f.settle(t, adm, group, len(tasks), time.Minute))

	// The storm. Each round starts on a settled group: kfake's classic
	// group coordinator breaks when a member dies while its JoinGroup is
	// pending (see the note on settle), a state a storm would otherwise
	// reach all the time by killing a member that was just restarted.
	type round struct {
		kind     string
		kills    int
		recovery time.Duration // last death to every task running again
		worst    string        // the task that took longest
		affected int           // tasks with no entry within 2 s of the death
	}
	var rounds []round
	termRound := 1 + rng.IntN(2)
	began := time.Now()
	for i := 0; time.Since(began) < storm || i <= termRound; i++ {
		time.Sleep(time.Duration(rng.IntN(1500)) * time.Millisecond)
		kind := "kill"
		switch {
		case i == termRound:
			kind = "term"
		case rng.IntN(100) < 25:
			kind = "kill two"
		}
		delay := func() time.Duration { return time.Duration(200+rng.IntN(2800)) * time.Millisecond }
		var (
			death    time.Time
			restarts []restart
			kills    int
		)
		switch kind {
		case "kill":
			s := rng.IntN(members)
			death = f.kill(t, s)
			kills++
			restarts = append(restarts, restart{s, death.Add(delay())})
		case "kill two":
			s1 := rng.IntN(members)
			s2 := (s1 + 1 + rng.IntN(members-1)) % members
			f.kill(t, s1)
			death = f.kill(t, s2)
			kills += 2
			restarts = append(restarts, restart{s1, death.Add(delay())}, restart{s2, death.Add(delay())})
		case "term":
			s := rng.IntN(members)
			death = f.term(t, s, 60*time.Second)
			restarts = append(restarts, restart{s, death.Add(delay())})
		}
		// Restart on time, and measure until every task has an entry
		// newer than the death (or give up well past the bound).
		var missing []string
		for {
			for j := 0; j < len(restarts); j++ {
				if !time.Now().Before(restarts[j].at) {
					f.start(restarts[j].slot)
					restarts = slices.Delete(restarts, j, j+1)
					j--
				}
			}
			missing = lt.missingAfter(conns, death)
			if len(missing) == 0 && len(restarts) == 0 || time.Since(death) > 3*recoveryBound {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		for _, r := range restarts {
			f.start(r.slot)
		}
		rec, worst, affected := lt.recovery(conns, death)
		r := round{kind: kind, kills: kills, recovery: rec, worst: worst, affected: affected}
		rounds = append(rounds, r)
		settled := "did not settle"
		if len(missing) == 0 && !f.failed() {
			f.settle(t, adm, group, len(tasks), time.Minute)
			settled = fmt.Sprintf("settled %s after the death", time.Since(death).Round(time.Millisecond))
		}
		t.Logf("round %d (%s) at %s (last death %s): every task running again %s after the death (slowest %s; %d tasks took over 2s); group %s",
			i+1, kind, death.Sub(began).Round(time.Millisecond), death.UTC().Format("15:04:05.000"), rec.Round(time.Millisecond), worst, affected, settled)
		if len(missing) > 0 {
			t.Errorf("round %d (%s): tasks %v have no ledger entry within %s of the death", i+1, kind, missing, 3*recoveryBound)
		} else if rec > recoveryBound {
			t.Errorf("round %d (%s): task %s was running again only %s after its member died; want at most session_timeout + 10s = %s",
				i+1, kind, worst, rec.Round(time.Millisecond), recoveryBound)
		}
		if f.failed() {
			break
		}
	}
	stormTook := time.Since(began)
	stats := stopMuts()

	// Recovery figures.
	var kills, affected int
	var killRecs []time.Duration
	for _, r := range rounds {
		kills += r.kills
		if r.kind != "term" {
			killRecs = append(killRecs, r.recovery)
			affected += r.affected
		} else {
			t.Logf("recovery after the SIGTERM (measured from the exit): %s", r.recovery.Round(time.Millisecond))
		}
	}
	slices.Sort(killRecs)
	if n := len(killRecs); n > 0 {
		t.Logf("recovery after SIGKILL (last death to every task running again), %d rounds: max %s, median %s, all %v (bound %s)",
			n, killRecs[n-1].Round(time.Millisecond), killRecs[n/2].Round(time.Millisecond), roundAll(killRecs), recoveryBound)
	}
	t.Logf("storm %s: %d rounds, %d SIGKILLs (%d tasks orphaned and recovered), 1 SIGTERM, %d processes started; workload %s",
		stormTook.Round(time.Millisecond), len(rounds), kills, affected, f.started(), stats)

	// Every member stops on SIGTERM with exit 0.
	f.failNow(t, "storm")
	f.settle(t, adm, group, len(tasks), time.Minute)
	var wg sync.WaitGroup
	for s := range members {
		wg.Add(1)
		go func() { defer wg.Done(); f.termNoFail(s, 60*time.Second) }()
	}
	wg.Wait()
	f.failNow(t, "storm")
	f.checkTaskStops(t)

	// No task ever committed from two members at once.
	entries := readLedger(t, w)
	for _, tk := range tasks {
		checkOneChain(t, tk.conn, entries[tk.conn])
	}

	// One `run --once` runs every task; then the six counts of every table.
	code, p := w.run(3*time.Minute, nil, "run", "--config", cfg, "--once")
	if code != 0 {
		t.Fatalf("run --once after the storm exited %d; stderr tail:\n%s", code, tail(p.stderr.String(), 6000))
	}
	for _, tk := range tasks {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r, err := Check(ctx, Target{Kafka: w.opts, Topic: tk.topic, OffsetsTopic: w.offsets, Name: tk.conn,
			Source: postgres.Config{DSN: w.dsn(), Schema: w.db.Schema, Table: tk.table, DeletedAtColumn: "deleted_at"}})
		cancel()
		if err != nil {
			t.Fatalf("task %s: check: %v", tk.name, err)
		}
		t.Logf("task %s: %s", tk.name, r)
		if r.Failures() != 0 {
			t.Errorf("task %s: the six counts must be 0: %s", tk.name, r.Counts())
		}
		if r.SourceRows == 0 || r.Checkpoints == 0 {
			t.Errorf("task %s: nothing to compare (source rows %d, checkpoints %d)", tk.name, r.SourceRows, r.Checkpoints)
		}
	}
}

// scaleTask is one table of the scale-out configuration.
type scaleTask struct {
	table string // the table, in the world's schema
	entry string // its line(s) under tables:
	name  string // the task name
	conn  string // the task's connector name, <name>-<task>
	topic string // its data topic
}

// scaleTopicPrefix is the configuration's kafka.topic_prefix.
const scaleTopicPrefix = "scale."

// scaleTasks lists n tables t01..tNN in the three forms of a tables: entry:
// a scalar table name (most), a scalar schema.table and a mapping with a
// task name of its own.
func scaleTasks(w *world, n int) []scaleTask {
	var out []scaleTask
	for i := 1; i <= n; i++ {
		table := fmt.Sprintf("t%02d", i)
		tk := scaleTask{table: table, entry: table, name: w.db.Schema + "." + table}
		switch i {
		case n - 1:
			tk.entry = w.db.Schema + "." + table
		case n:
			tk.entry = fmt.Sprintf("table: %s\n    name: %s", table, table)
			tk.name = table
		}
		tk.conn = w.name + "-" + tk.name
		tk.topic = scaleTopicPrefix + w.db.Schema + "." + table
		out = append(out, tk)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// scaleConfig writes the task-mode configuration file and returns its path.
func scaleConfig(t *testing.T, w *world, tasks []scaleTask, session time.Duration) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nsource:\n  dsn: %q\n  schema: %s\n  deleted_at_column: deleted_at\n", w.name, w.dsn(), w.db.Schema)
	fmt.Fprintf(&b, "kafka:\n  brokers: [%s]\n  topic_prefix: %q\n  offsets_topic: %s\n  ledger_topic: %s\n  partitions: 3\n  transaction_timeout: 30s\n",
		strings.Join(w.brokers, ", "), scaleTopicPrefix, w.offsets, w.ledger)
	fmt.Fprintf(&b, "group:\n  session_timeout: %s\n  rebalance_timeout: 10s\n", session)
	b.WriteString("sync:\n")
	for _, k := range sortedKeys(w.sync) {
		fmt.Fprintf(&b, "  %s: %s\n", k, w.sync[k])
	}
	b.WriteString("log:\n  level: info\n  format: json\ntables:\n")
	for _, tk := range tasks {
		fmt.Fprintf(&b, "  - %s\n", tk.entry)
	}
	path := filepath.Join(w.dir, "tidemark-tasks.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tableTx runs the mutator's statements (written for items) on another
// table of the same shape.
type tableTx struct {
	pgx.Tx
	table string
}

func (tx tableTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return tx.Tx.Exec(ctx, strings.ReplaceAll(sql, "items", tx.table), args...)
}

// newTableMutator is newMutator on table instead of items.
func newTableMutator(w *world, table string, seed uint64) *mutator {
	m := newMutator(w, seed)
	m.begin = func(ctx context.Context) (pgx.Tx, error) {
		tx, err := w.db.Pool.Begin(ctx)
		if err != nil {
			return nil, err
		}
		return tableTx{Tx: tx, table: table}, nil
	}
	return m
}

// seedTable is seedRows on table.
func seedTable(t *testing.T, w *world, m *mutator, table string, n int) {
	t.Helper()
	for n > 0 {
		k := min(n, 1+m.rng.IntN(9))
		ts := m.ts()
		ids := make([]int64, k)
		for i := range ids {
			m.nextID++
			ids[i] = m.nextID
			m.live[m.nextID] = true
		}
		w.db.Exec(t, `INSERT INTO `+table+` (id, updated_at, v) SELECT x, $1, 'seed-' || x FROM unnest($2::bigint[]) AS x`, ts, ids)
		n -= k
	}
}

// restart is a member to start again at a time.
type restart struct {
	slot int
	at   time.Time
}

// fleet is the members of the group: one process per slot, restarted in
// place. Every process is watched: it may only end by our signal (SIGKILL:
// death by the signal; SIGTERM: exit 0).
type fleet struct {
	w      *world
	cfg    string
	mu     sync.Mutex
	slots  []*member
	all    []*member
	bad    []string
	events []string // the timeline of starts and signals
}

// event notes what happened when, for the timeline; f.mu is held.
func (f *fleet) event(format string, args ...any) {
	f.events = append(f.events, time.Now().UTC().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

type member struct {
	p       *proc
	label   string
	expect  string        // "", "kill" or "term": the signal we sent
	checked chan struct{} // closed once the exit is judged
}

func (f *fleet) start(slot int) *member {
	f.w.t.Helper()
	p := f.w.start(nil, "run", "--config", f.cfg)
	f.mu.Lock()
	m := &member{p: p, label: fmt.Sprintf("member %d #%d", slot, len(f.all)+1), checked: make(chan struct{})}
	f.slots[slot] = m
	f.all = append(f.all, m)
	f.event("started %s (pid %d)", m.label, p.cmd.Process.Pid)
	f.mu.Unlock()
	go func() {
		<-p.done
		f.mu.Lock()
		defer f.mu.Unlock()
		defer close(m.checked)
		f.event("%s exited %d", m.label, p.code)
		switch {
		case m.expect == "kill" && p.code == -1, m.expect == "term" && p.code == 0:
		default:
			how := "on its own"
			if m.expect != "" {
				how = "after our SIG" + strings.ToUpper(m.expect)
			}
			f.bad = append(f.bad, fmt.Sprintf("%s exited %s with code %d; stderr tail:\n%s", m.label, how, p.code, tail(p.stderr.String(), 4000)))
		}
	}()
	return m
}

// kill SIGKILLs the member in slot and returns when it is dead.
func (f *fleet) kill(t *testing.T, slot int) time.Time {
	t.Helper()
	f.mu.Lock()
	m := f.slots[slot]
	if m.p.running() {
		m.expect = "kill"
	}
	f.event("SIGKILL %s", m.label)
	f.mu.Unlock()
	m.p.signal(syscall.SIGKILL)
	m.p.wait(t, 10*time.Second)
	dead := time.Now()
	<-m.checked
	return dead
}

// term SIGTERMs the member in slot and returns when it has exited.
func (f *fleet) term(t *testing.T, slot int, timeout time.Duration) time.Time {
	t.Helper()
	f.termNoFail(slot, timeout)
	f.failNow(t, "SIGTERM")
	return time.Now()
}

// termNoFail is term for any goroutine: a failure is recorded.
func (f *fleet) termNoFail(slot int, timeout time.Duration) {
	f.mu.Lock()
	m := f.slots[slot]
	if m.p.running() {
		m.expect = "term"
	}
	f.event("SIGTERM %s", m.label)
	f.mu.Unlock()
	m.p.signal(syscall.SIGTERM)
	select {
	case <-m.p.done:
	case <-time.After(timeout):
		f.mu.Lock()
		f.bad = append(f.bad, fmt.Sprintf("%s did not exit within %s of SIGTERM; stderr tail:\n%s", m.label, timeout, tail(m.p.stderr.String(), 4000)))
		f.mu.Unlock()
		m.p.signal(syscall.SIGKILL)
		<-m.p.done
	}
	<-m.checked
}

func (f *fleet) failed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.bad) > 0
}

// failNow fails the test with every recorded failure.
func (f *fleet) failNow(t *testing.T, when string) {
	t.Helper()
	f.mu.Lock()
	bad := slices.Clone(f.bad)
	f.mu.Unlock()
	if len(bad) == 0 {
		return
	}
	for _, b := range bad {
		t.Errorf("%s: %s", when, b)
	}
	t.FailNow()
}

func (f *fleet) started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.all)
}

// running counts the tasks the process in each slot runs, from its log
// ("task starting" less "task stopped"); -1 for a slot whose process is
// not running.
func (f *fleet) running() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]int, len(f.slots))
	for i, m := range f.slots {
		if m == nil || !m.p.running() {
			out[i] = -1
			continue
		}
		s := m.p.stderr.String()
		out[i] = strings.Count(s, `"msg":"task starting"`) - strings.Count(s, `"msg":"task stopped`)
	}
	return out
}

// settle waits until the group is settled and returns how it looks: state
// Stable; one member per slot, each the slot's live process (its client id
// names its pid); every task assigned, each member at least one; each
// process's log says it runs as many tasks as it was assigned; and the
// same for three looks in a row, 200ms apart.
//
// Why the storm waits for this before each round: kfake's classic group
// coordinator (v0.0.0-20260918054303) handles a member that dies while its
// JoinGroup is pending unlike Kafka. The response cannot be written, so
// the member never gets a session timer (group.reply arms it only after a
// successful write) and stays in the group until a rebalance timeout; and
// members waiting in JoinGroup meanwhile expire on their session timers
// (Kafka keeps members that await a join alive), without an answer to
// their JoinGroup. The live members are evicted without knowing it, keep
// their tasks until the next owner fences them, and the tasks wait
// session_timeout + rebalance_timeout (20s here) for an owner.
func (f *fleet) settle(t *testing.T, adm *kadm.Client, group string, ntasks int, timeout time.Duration) string {
	t.Helper()
	var last, why string
	same := 0
	deadline := time.Now().Add(timeout)
	for {
		f.failNow(t, "waiting for the group to settle")
		cur, ok := f.look(adm, group, ntasks)
		switch {
		case !ok:
			same, why = 0, cur
		case cur == last:
			same++
		default:
			same = 1
		}
		last = cur
		if same >= 3 {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("the group did not settle within %s: %s (log counts per slot %v)", timeout, why, f.running())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// look describes the group; ok says whether it is settled (see settle).
func (f *fleet) look(adm *kadm.Client, group string, ntasks int) (string, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	gs, err := adm.DescribeGroups(ctx, group)
	if err != nil {
		return "describe: " + err.Error(), false
	}
	g := gs[group]
	if g.Err != nil {
		return "describe: " + g.Err.Error(), false
	}
	f.mu.Lock()
	pids := make([]int, len(f.slots))
	for i, m := range f.slots {
		if m != nil && m.p.running() {
			pids[i] = m.p.cmd.Process.Pid
		}
	}
	f.mu.Unlock()
	logs := f.running()
	assigned := make([]int, len(pids))
	seen := make([]bool, len(pids))
	total := 0
	desc := g.State
	ok := g.State == "Stable" && len(g.Members) == len(pids)
	for _, m := range g.Members {
		n := 0
		if c, isConsumer := m.Assigned.AsConsumer(); isConsumer {
			for _, tp := range c.Topics {
				n += len(tp.Partitions)
			}
		}
		total += n
		slot := -1
		for i, pid := range pids {
			if pid != 0 && (strings.Contains(m.ClientID, fmt.Sprintf("/%d/", pid)) || strings.HasSuffix(m.ClientID, fmt.Sprintf("/%d", pid))) {
				slot = i
			}
		}
		desc += fmt.Sprintf(" %s:%d", m.ClientID, n)
		if slot < 0 || seen[slot] || n == 0 {
			ok = false
			continue
		}
		seen[slot] = true
		assigned[slot] = n
		if logs[slot] != n {
			ok = false
		}
	}
	if total != ntasks {
		ok = false
	}
	return fmt.Sprintf("%s; tasks per slot by the group %v, by the logs %v", desc, assigned, logs), ok
}

func newAdmin(t *testing.T, w *world) *kadm.Client {
	t.Helper()
	cl, err := kgo.NewClient(w.opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return kadm.NewClient(cl)
}

// checkTaskStops fails the test for a task of any process that stopped on
// its own ("task stopped; the other tasks go on", with its exit code: a
// safety stop, a configuration error, fenced while its member was alive, a
// verify mismatch, or a transient failure that outlasted the retries): in
// task mode the process goes on, so only the log tells. A task stopped
// because its member gave it up (revoke, lost, shutdown) logs no exit code.
func (f *fleet) checkTaskStops(t *testing.T) {
	t.Helper()
	f.mu.Lock()
	all := slices.Clone(f.all)
	f.mu.Unlock()
	for _, m := range all {
		n := 0
		for _, line := range strings.Split(m.p.stderr.String(), "\n") {
			if !strings.Contains(line, `"msg":"task stopped`) && !strings.Contains(line, `"msg":"task failed`) {
				continue
			}
			var rec map[string]any
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				continue
			}
			_, hasCode := rec["exit_code"]
			_, hasErr := rec["err"]
			if lvl, _ := rec["level"].(string); hasCode || hasErr || lvl == "ERROR" || lvl == "WARN" {
				if n++; n <= 5 {
					t.Errorf("%s: a task stopped on its own: %s", m.label, line)
				}
			}
		}
		if n > 5 {
			t.Errorf("%s: %d more tasks stopped on their own", m.label, n-5)
		}
	}
}

// dumpOnFailure logs the stderr tail of every process when the test
// failed; with TIDEMARK_CHAOS_LOGS=<dir>, every process's whole stderr is
// written there too (<dir>/member-<slot>-<n>.log).
func (f *fleet) dumpOnFailure(t *testing.T) {
	f.mu.Lock()
	all := slices.Clone(f.all)
	events := slices.Clone(f.events)
	f.mu.Unlock()
	if dir := os.Getenv("TIDEMARK_CHAOS_LOGS"); dir != "" {
		_ = os.WriteFile(filepath.Join(dir, "timeline.txt"), []byte(strings.Join(events, "\n")+"\n"), 0o644)
		for _, m := range all {
			name := strings.NewReplacer(" ", "-", "#", "").Replace(m.label) + ".log"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(m.p.stderr.String()), 0o644); err != nil {
				t.Logf("save %s: %v", name, err)
			}
		}
		t.Logf("the stderr of every process is in %s", dir)
	}
	if !t.Failed() {
		return
	}
	t.Logf("timeline (UTC):\n%s", strings.Join(events, "\n"))
	for _, m := range all {
		t.Logf("%s (exit %s): stderr tail:\n%s", m.label, exitOf(m.p), tail(m.p.stderr.String(), 2500))
	}
}

func exitOf(p *proc) string {
	if p.running() {
		return "running"
	}
	return fmt.Sprint(p.code)
}

// ledgerTail follows the ledger topic read_committed and keeps, per
// connector, the time (At) of every entry.
type ledgerTail struct {
	mu  sync.Mutex
	at  map[string][]time.Time
	bad int
}

func startLedgerTail(t *testing.T, w *world) *ledgerTail {
	t.Helper()
	lt := &ledgerTail{at: map[string][]time.Time{}}
	opts := append(slices.Clone(w.opts),
		kgo.ConsumeTopics(w.ledger),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.MetadataMinAge(250*time.Millisecond),
		kgo.MetadataMaxAge(time.Second),
		kgo.FetchMaxWait(200*time.Millisecond),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatalf("ledger tail: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			if fs.IsClientClosed() || ctx.Err() != nil {
				return
			}
			n := 0
			fs.EachRecord(func(r *kgo.Record) {
				n++
				if r.Value == nil {
					return
				}
				e, err := schemas.DecodeLedgerEntry(r.Value)
				var at time.Time
				if err == nil {
					at, err = schemas.ParseTime(e.At)
				}
				lt.mu.Lock()
				if err != nil {
					lt.bad++
				} else {
					lt.at[string(r.Key)] = append(lt.at[string(r.Key)], at)
				}
				lt.mu.Unlock()
			})
			if n == 0 && len(fs.Errors()) > 0 {
				time.Sleep(100 * time.Millisecond) // the topic does not exist yet
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done; cl.Close() })
	return lt
}

// firstAfter is the time of conn's earliest entry after since.
func (lt *ledgerTail) firstAfter(conn string, since time.Time) (time.Time, bool) {
	var first time.Time
	found := false
	for _, at := range lt.at[conn] {
		if at.After(since) && (!found || at.Before(first)) {
			first, found = at, true
		}
	}
	return first, found
}

// missingAfter lists the connectors with no entry after since.
func (lt *ledgerTail) missingAfter(conns []string, since time.Time) []string {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	var out []string
	for _, c := range conns {
		if _, ok := lt.firstAfter(c, since); !ok {
			out = append(out, c)
		}
	}
	return out
}

// recovery is the longest wait after death for a connector's first entry,
// which connector, and how many waited over 2 s.
func (lt *ledgerTail) recovery(conns []string, death time.Time) (time.Duration, string, int) {
	lt.mu.Lock()
	defer lt.mu.Unlock()
	var worst time.Duration
	worstConn, affected := "", 0
	for _, c := range conns {
		at, ok := lt.firstAfter(c, death)
		d := at.Sub(death)
		if !ok {
			d = time.Since(death)
		}
		if d > 2*time.Second {
			affected++
		}
		if d > worst || worstConn == "" {
			worst, worstConn = d, c
		}
	}
	return worst, worstConn, affected
}

// readLedger reads the whole ledger topic, per connector in order.
func readLedger(t *testing.T, w *world) map[string][]*schemas.LedgerEntry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out := map[string][]*schemas.LedgerEntry{}
	err := fold.Scan(ctx, w.opts, w.ledger, func(r *kgo.Record) error {
		if r.Value == nil {
			return nil
		}
		e, err := schemas.DecodeLedgerEntry(r.Value)
		if err != nil {
			return fmt.Errorf("ledger offset %d/%d: %w", r.Partition, r.Offset, err)
		}
		if e.Connector != string(r.Key) {
			return fmt.Errorf("ledger offset %d/%d: key %q, connector %q", r.Partition, r.Offset, r.Key, e.Connector)
		}
		out[e.Connector] = append(out[e.Connector], e)
		return nil
	})
	if err != nil {
		t.Fatalf("read the ledger: %v", err)
	}
	return out
}

// checkOneChain checks that the ledger of one task is one chain: once a run
// has started, no other run commits; no sequence number has two entries;
// every transaction continues the one before it (sequence + 1, its
// request cursor the previous next cursor).
func checkOneChain(t *testing.T, conn string, entries []*schemas.LedgerEntry) {
	t.Helper()
	if len(entries) == 0 {
		t.Errorf("%s: no ledger entries", conn)
		return
	}
	var prev *schemas.LedgerEntry
	seqs := map[int64]string{}
	latest := ""
	runs, txns, errs := 0, 0, 0
	fail := func(format string, args ...any) {
		errs++
		if errs <= 5 {
			t.Errorf(conn+": "+format, args...)
		}
	}
	for i, e := range entries {
		switch e.Kind {
		case schemas.LedgerRun:
			runs++
			latest = e.RunID
		case schemas.LedgerTxn:
			txns++
			if e.RunID != latest {
				fail("ledger entry %d: run %s committed seq %d after run %s had started", i, e.RunID, e.Seq, latest)
			}
			if run, ok := seqs[e.Seq]; ok {
				fail("two ledger entries for seq %d (runs %s and %s)", e.Seq, run, e.RunID)
			}
			seqs[e.Seq] = e.RunID
			if prev != nil && (e.Seq != prev.Seq+1 || e.RequestCursor != prev.NextCursor) {
				fail("seq %d by run %s (request cursor %q) does not continue seq %d by run %s (next cursor %q): two writers",
					e.Seq, e.RunID, e.RequestCursor, prev.Seq, prev.RunID, prev.NextCursor)
			}
			prev = e
		}
	}
	if errs > 5 {
		t.Errorf("%s: %d more chain errors", conn, errs-5)
	}
	if txns == 0 {
		t.Errorf("%s: no transaction in the ledger", conn)
	}
	t.Logf("%s: one chain: %d runs, %d transactions", conn, runs, txns)
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

// watchGroup writes a timeline of the consumer group to path (diagnosis
// only, with TIDEMARK_CHAOS_LOGS): every JoinGroup, SyncGroup, Heartbeat
// and LeaveGroup request the broker sees (kfake only), and every change of
// the group's state, members and assignments (DescribeGroups every 100ms).
func watchGroup(t *testing.T, w *world, group, path string) {
	t.Helper()
	var mu sync.Mutex
	var lines []string
	note := func(format string, args ...any) {
		mu.Lock()
		lines = append(lines, time.Now().UTC().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	if w.kafka != nil {
		for _, key := range []kmsg.Key{kmsg.JoinGroup, kmsg.SyncGroup, kmsg.Heartbeat, kmsg.LeaveGroup} {
			w.kafka.ControlKey(int16(key), func(req kmsg.Request) (kmsg.Response, error, bool) {
				switch r := req.(type) {
				case *kmsg.JoinGroupRequest:
					note("req JoinGroup member=%q session=%d rebalance=%d", r.MemberID, r.SessionTimeoutMillis, r.RebalanceTimeoutMillis)
				case *kmsg.SyncGroupRequest:
					note("req SyncGroup member=%q gen=%d assignments=%d", r.MemberID, r.Generation, len(r.GroupAssignment))
				case *kmsg.HeartbeatRequest:
					note("req Heartbeat member=%q gen=%d", r.MemberID, r.Generation)
				case *kmsg.LeaveGroupRequest:
					ids := []string{r.MemberID}
					for _, m := range r.Members {
						ids = append(ids, m.MemberID)
					}
					note("req LeaveGroup members=%q", ids)
				}
				return nil, nil, false
			})
		}
	}
	cl, err := kgo.NewClient(w.opts...)
	if err != nil {
		t.Fatal(err)
	}
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := ""
		for ctx.Err() == nil {
			dctx, dcancel := context.WithTimeout(ctx, 2*time.Second)
			gs, err := adm.DescribeGroups(dctx, group)
			dcancel()
			cur := ""
			if err != nil {
				cur = "describe: " + err.Error()
			} else {
				g := gs[group]
				var ms []string
				for _, m := range g.Members {
					var ps []int32
					if c, ok := m.Assigned.AsConsumer(); ok {
						for _, tp := range c.Topics {
							ps = append(ps, tp.Partitions...)
						}
					}
					slices.Sort(ps)
					ms = append(ms, fmt.Sprintf("%s=%v", m.MemberID, ps))
				}
				cur = fmt.Sprintf("group %s: %s", g.State, strings.Join(ms, " "))
			}
			if cur != last {
				note("%s", cur)
				last = cur
			}
			select {
			case <-ctx.Done():
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		cl.Close()
		mu.Lock()
		defer mu.Unlock()
		_ = os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	})
}
