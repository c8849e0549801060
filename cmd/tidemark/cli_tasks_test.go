package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// tasksWorld is a cliWorld with three tables, t_a, t_b and t_c, and a
// config listing them as tasks: t_c is renamed "c" with its own topic.
func (w *cliWorld) tasksConfig(extra string) string {
	w.t.Helper()
	for _, tbl := range []string{"t_a", "t_b", "t_c"} {
		w.db.Exec(w.t, fmt.Sprintf(`CREATE TABLE IF NOT EXISTS %s (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at timestamptz, v text);
			CREATE INDEX IF NOT EXISTS %s_w ON %s (updated_at, id)`, tbl, tbl, tbl))
	}
	text := fmt.Sprintf(`name: %s
source:
  dsn: %q
  schema: %s
  deleted_at_column: deleted_at
kafka:
  brokers: [%s]
  topic_prefix: "p."
group:
  session_timeout: 6s
sync:
  page_size: 3
  margin: 1s
  poll_interval: 50ms
  poll_jitter: 0
log:
  level: info
  format: text
tables:
  - t_a
  - %s.t_b
  - table: t_c
    name: c
    topic: c-topic
    sync: {page_size: 100}
%s`, cliName, w.dsn, w.db.Schema, strings.Join(w.kafka.Brokers, ", "), w.db.Schema, extra)
	path := filepath.Join(w.dir, "tasks.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// writeRows upserts rows from..to of every table.
func (w *cliWorld) writeRows(from, to int, v string) {
	w.t.Helper()
	for _, tbl := range []string{"t_a", "t_b", "t_c"} {
		for i := from; i <= to; i++ {
			w.db.Exec(w.t, fmt.Sprintf(`INSERT INTO %s (id, updated_at, v) VALUES ($1, clock_timestamp(), $2)
				ON CONFLICT (id) DO UPDATE SET updated_at = clock_timestamp(), v = excluded.v`, tbl), i, fmt.Sprintf("%s-%s-%d", tbl, v, i))
		}
	}
}

func (w *cliWorld) assertTasks() {
	w.t.Helper()
	w.assertFold("t_a", "p."+w.db.Schema+".t_a")
	w.assertFold("t_b", "p."+w.db.Schema+".t_b")
	w.assertFold("t_c", "c-topic")
}

// TestCLITasksOnce: a configuration with tables runs every table as a task
// of its own (transactional id, checkpoint, topic), and status, verify,
// ledger and run --once report each task, or the one --task names.
func TestCLITasksOnce(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.tasksConfig("")
	w.writeRows(1, 10, "one")
	ctx := context.Background()
	code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once")
	if code != 0 {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, task := range []string{"c", w.db.Schema + ".t_a", w.db.Schema + ".t_b"} {
		if !strings.Contains(out, "== task "+task+" ==") {
			t.Errorf("run --once does not report task %s:\n%s", task, out)
		}
	}
	w.assertTasks()
	// Each task is a connector of its own: its checkpoint is keyed
	// <name>-<task>, its transactional id tidemark-<name>-<task>.
	cp, err := offsets.NewStore(w.opts(), "tidemark-offsets", cliName+"-c").Load(context.Background())
	if err != nil || cp == nil || cp.Seq == 0 {
		t.Fatalf("checkpoint of task c: %+v %v", cp, err)
	}
	if got := producer.TransactionalID(cliName + "-c"); got != "tidemark-cli-sync-c" {
		t.Errorf("transactional id %s", got)
	}

	code, out, errOut = w.cli(ctx, "check", "--config", cfg)
	if code != 0 || strings.Count(out, "== task ") != 3 || !strings.Contains(out, "c-topic") {
		t.Fatalf("check: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "verify", "--config", cfg)
	if code != 0 || strings.Count(out, "== task ") != 3 {
		t.Fatalf("verify: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "status", "--config", cfg, "--json")
	if code != 0 {
		t.Fatalf("status --json: exit %d\n%s", code, errOut)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	objects := 0
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil || m["task"] == nil || m["connector"] != cliName+"-"+m["task"].(string) {
			t.Fatalf("status --json: an object without its task (%v):\n%s", err, out)
		}
		objects++
	}
	if objects != 3 {
		t.Errorf("status --json printed %d objects, want one per task:\n%s", objects, out)
	}
	code, out, _ = w.cli(ctx, "ledger", "--config", cfg, "--task", "c")
	if code != 0 || strings.Count(out, "== task ") != 1 {
		t.Errorf("ledger --task c: exit %d\n%s", code, out)
	}
	// Naming no task, or a task that is not there, is a usage error.
	if code, _, errOut := w.cli(ctx, "status", "--config", cfg, "--task", "nope"); code != exitConfig || !strings.Contains(errOut, `no such task; the tasks are c, `) {
		t.Errorf("status --task nope: exit %d\n%s", code, errOut)
	}
	if code, _, errOut := w.cli(ctx, "reset", "--config", cfg, "--yes", "--reason", "x"); code != exitConfig || !strings.Contains(errOut, "--task") {
		t.Errorf("reset without --task: exit %d\n%s", code, errOut)
	}

	// A second --once publishes only what changed.
	w.writeRows(5, 12, "two")
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once", "--task", "c", "--json"); code != 0 || strings.Count(out, `{"task":"c",`) != 1 {
		t.Fatalf("run --once --task c: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once"); code != 0 {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	w.assertTasks()
}

// TestCLITasksGroup: two `run` processes (here in-process) with the same
// configuration form one group and split the tasks; when one stops, the
// other takes its tasks over; the topics equal the tables throughout and
// every task's ledger is one chain of runs.
func TestCLITasksGroup(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.tasksConfig("metrics:\n  listen: 127.0.0.1:0\n")
	w.writeRows(1, 20, "one")

	type member struct {
		cancel context.CancelFunc
		done   chan int
		log    *harness.SyncBuffer
	}
	start := func() *member {
		ctx, cancel := context.WithCancel(context.Background())
		m := &member{cancel: cancel, done: make(chan int, 1), log: &harness.SyncBuffer{}}
		go func() {
			var out harness.SyncBuffer
			m.done <- run(ctx, []string{"run", "--config", cfg}, &out, m.log)
		}()
		return m
	}
	caughtUp := func() (bool, string) {
		code, out, errOut := w.cli(context.Background(), "verify", "--config", cfg)
		return code == 0, out + errOut
	}
	a := start()
	defer a.cancel()
	waitForLong(t, 60*time.Second, caughtUp)
	if !strings.Contains(a.log.String(), "group: assigned tasks") {
		t.Fatalf("member a never joined:\n%s", a.log.String())
	}

	b := start()
	defer b.cancel()
	// The group rebalances: b takes some tasks, a gives them up first.
	waitForLong(t, 60*time.Second, func() (bool, string) {
		return strings.Contains(a.log.String(), "group: revoked tasks stopped") && strings.Contains(b.log.String(), "task starting"), b.log.String()
	})
	w.writeRows(15, 30, "two")
	waitForLong(t, 60*time.Second, caughtUp)
	code, out, _ := w.cli(context.Background(), "status", "--config", cfg)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s", code, out)
	}
	members := map[string]bool{}
	for l := range strings.Lines(out) {
		if _, m, ok := strings.Cut(l, "(runs on: "); ok {
			members[strings.TrimSuffix(strings.TrimSpace(m), ")")] = true
		}
	}
	if len(members) != 2 {
		t.Errorf("status shows members %v, want two:\n%s", members, out)
	}

	// A sweep of one task fences the member running it; the task starts
	// again there (the group still assigns it) and catches up.
	if code, out, errOut := w.cli(context.Background(), "sweep", "--config", cfg, "--task", "c"); code != 0 {
		t.Fatalf("sweep --task c: exit %d\n%s\n%s", code, out, errOut)
	}
	w.writeRows(1, 5, "after-sweep")
	waitForLong(t, 60*time.Second, caughtUp)
	if !strings.Contains(a.log.String()+b.log.String(), "task was fenced by another writer of it") {
		t.Errorf("no member reports the fenced task c")
	}

	// a stops (SIGTERM): it stops its tasks, leaves, and b runs them all.
	a.cancel()
	if code := <-a.done; code != 0 {
		t.Fatalf("member a exited %d:\n%s", code, a.log.String())
	}
	w.writeRows(25, 40, "three")
	waitForLong(t, 60*time.Second, caughtUp)
	code, out, _ = w.cli(context.Background(), "status", "--config", cfg)
	if code != 0 || strings.Count(out, "(runs on: tidemark-") != 3 {
		t.Errorf("after a left, status: exit %d\n%s", code, out)
	}
	b.cancel()
	if code := <-b.done; code != 0 {
		t.Fatalf("member b exited %d:\n%s", code, b.log.String())
	}
	w.assertTasks()
	for _, task := range []string{"c", w.db.Schema + ".t_a", w.db.Schema + ".t_b"} {
		assertOneChain(t, w, cliName+"-"+task)
	}
}

// assertOneChain checks that the ledger entries of connector name never
// interleave two runs: once a run has an entry, no earlier run has one
// after it, so no two members ever committed the task at once.
func assertOneChain(t *testing.T, w *cliWorld, name string) {
	t.Helper()
	var es []*schemas.LedgerEntry
	err := offsets.NewLedger(w.opts(), "tidemark-ledger", name).Entries(context.Background(), 0, func(e *schemas.LedgerEntry) error {
		es = append(es, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	retired := map[string]bool{}
	last := ""
	runs := 0
	for _, e := range es {
		if e.RunID == last {
			continue
		}
		if retired[e.RunID] {
			t.Errorf("%s: run %s wrote again after run %s started: two writers at once", name, e.RunID, last)
		}
		if last != "" {
			retired[last] = true
		}
		last = e.RunID
		runs++
	}
	if runs < 1 {
		t.Errorf("%s: no ledger entries", name)
	}
}

func waitForLong(t *testing.T, d time.Duration, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s; last: %s", d, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestCLITaskFailsAlone: a task whose table cannot be synced (here it does
// not exist) stops alone: in `run --once` the others complete and the exit
// code is that task's (2, naming it); in the group the others run on while
// it is reported stopped.
func TestCLITaskFailsAlone(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.tasksConfig("  - no_such_table\nmetrics:\n  listen: 127.0.0.1:0\n")
	w.writeRows(1, 10, "one")
	ctx := context.Background()
	code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once")
	if code != exitConfig || !strings.Contains(errOut, "task "+w.db.Schema+".no_such_table") {
		t.Fatalf("run --once: exit %d, want 2 naming the task\n%s\n%s", code, out, errOut)
	}
	w.assertTasks()

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var log harness.SyncBuffer
	done := make(chan int, 1)
	go func() {
		var o harness.SyncBuffer
		done <- run(runCtx, []string{"run", "--config", cfg}, &o, &log)
	}()
	w.writeRows(5, 20, "two")
	waitForLong(t, 60*time.Second, func() (bool, string) {
		ok := true
		for _, task := range []string{"c", w.db.Schema + ".t_a", w.db.Schema + ".t_b"} {
			code, _, _ := w.cli(ctx, "verify", "--config", cfg, "--task", task)
			ok = ok && code == 0
		}
		return ok && strings.Contains(log.String(), "task stopped; the other tasks go on"), log.String()
	})
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("the member exited %d:\n%s", code, log.String())
	}
	w.assertTasks()
}

// TestCLITaskModeKeepsReplicaFlags: in task mode, replica's own flags
// (--target-table, --once, ...) reach the task's command, and verify
// compares the task's replica table.
func TestCLITaskModeKeepsReplicaFlags(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.tasksConfig("")
	w.writeRows(1, 6, "one")
	ctx := context.Background()
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once", "--task", "c"); code != exitOK {
		t.Fatalf("run --once --task c: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut := w.cli(ctx, "replica", "--config", cfg, "--task", "c", "--target-table", "c_replica", "--once")
	if code != exitOK || !strings.Contains(out, "applied 6 records") {
		t.Fatalf("replica --task c --target-table c_replica --once: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "verify", "--config", cfg, "--task", "c", "--replica-table", "c_replica")
	if code != exitOK || !strings.Contains(out, "c_replica") {
		t.Fatalf("verify --task c --replica-table c_replica: exit %d\n%s\n%s", code, out, errOut)
	}
}

// tasksEdgeConfig is a configuration with tables whose DSN and brokers are
// closed loopback ports: nothing may connect.
func tasksEdgeConfig(t *testing.T) string {
	t.Helper()
	return writeFile(t, t.TempDir(), "tasks.yaml", `name: shop
source:
  dsn: "postgres://u@127.0.0.1:1/d"
  notify: shop_changes
kafka:
  brokers: [127.0.0.1:1]
log:
  format: text
tables:
  - orders
  - sales.customers
`)
}

// TestCLITaskModePrintNotifySQL: check --print-notify-sql prints each
// task's trigger (or the one --task names) and connects to nothing; feed
// serve refuses a configuration with tables.
func TestCLITaskModePrintNotifySQL(t *testing.T) {
	cfg := tasksEdgeConfig(t)
	began := time.Now()
	code, out, errOut := edgeCLI(t, nil, "check", "--print-notify-sql", "--config", cfg, "--task", "public.orders")
	if code != exitOK || !strings.Contains(out, `ON "public"."orders"`) || !strings.Contains(out, `pg_notify('shop_changes', '')`) ||
		strings.Contains(out, "customers") {
		t.Errorf("check --print-notify-sql --task public.orders: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = edgeCLI(t, nil, "check", "--print-notify-sql", "--config", cfg)
	if code != exitOK || !strings.Contains(out, `ON "public"."orders"`) || !strings.Contains(out, `ON "sales"."customers"`) ||
		!strings.Contains(out, "-- task sales.customers\n") {
		t.Errorf("check --print-notify-sql: exit %d\n%s\n%s", code, out, errOut)
	}
	if d := time.Since(began); d > 3*time.Second {
		t.Errorf("--print-notify-sql took %s: it connected to something", d)
	}
	code, out, errOut = edgeCLI(t, nil, "feed", "serve", "--config", cfg, "--listen", "127.0.0.1:0")
	if code != exitConfig || !strings.Contains(errOut, "tables:") || !strings.Contains(errOut, "single-table configuration") {
		t.Errorf("feed serve with tables: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestCLITaskModeVerifyReplicaNeedsTask: --replica-table names one replica
// table; with tables: and no --task, verify compared every task's source
// with it and reported all but one as different. It is a usage error
// naming --task, before anything connects.
func TestCLITaskModeVerifyReplicaNeedsTask(t *testing.T) {
	cfg := tasksEdgeConfig(t)
	code, out, errOut := edgeCLI(t, nil, "verify", "--config", cfg, "--replica-table", "orders_replica")
	if code != exitConfig || !strings.Contains(errOut, "--task") || !strings.Contains(errOut, "public.orders") {
		t.Errorf("verify --replica-table with tables: and no --task: exit %d, want 2 naming --task and the tasks\n%s\n%s", code, out, errOut)
	}
}
