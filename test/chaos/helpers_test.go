package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/failpoint"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

var (
	// bin is the tidemark binary, built once by TestMain.
	bin string
	// pg is the package's throwaway PostgreSQL cluster (loopback only);
	// every test gets its own schema on it.
	pg    *harness.Postgres
	pgErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "tidemark-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin = filepath.Join(dir, "tidemark")
	build := exec.Command("go", "build", "-o", bin, "github.com/tidemark/tidemark/cmd/tidemark")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build tidemark: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// A dedicated cluster rather than DATABASE_URL: these tests restart
	// backends and must only ever talk to loopback.
	pg, pgErr = harness.StartCluster()
	code := m.Run()
	if pg != nil {
		pg.Stop()
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// soak reports whether the long variants run (make soak).
func soak() bool { return os.Getenv("TIDEMARK_SOAK") == "1" }

// needPG returns the package's PostgreSQL, failing under CI=true and
// skipping elsewhere when there is none.
func needPG(t *testing.T) *harness.Postgres {
	t.Helper()
	if pg == nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", pgErr)
		}
		t.Skipf("no PostgreSQL server binaries: %v", pgErr)
	}
	return pg
}

// seedFor returns the RNG seed of a test: TIDEMARK_CHAOS_SEED when set (to
// replay a failure), else the clock. It is always logged.
func seedFor(t *testing.T) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("TIDEMARK_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("TIDEMARK_CHAOS_SEED=%q: %v", v, err)
		}
		s = n
	}
	t.Logf("seed %d (replay with TIDEMARK_CHAOS_SEED=%d)", s, s)
	return s
}

// itemsDDL is the table every scenario mutates: bigint id, soft deletes.
const itemsDDL = `CREATE TABLE items (
	id bigint PRIMARY KEY,
	updated_at timestamptz NOT NULL,
	deleted_at timestamptz,
	v text NOT NULL,
	n integer NOT NULL DEFAULT 0
);
CREATE INDEX items_updated_at_id ON items (updated_at, id)`

// world is one scenario: a schema with the items table on a PostgreSQL
// cluster, an in-process kfake cluster, and a config file for the binary.
type world struct {
	t       *testing.T
	db      *harness.DB
	kafka   *kfake.Cluster
	brokers []string
	opts    []kgo.Opt
	dir     string
	name    string
	topic   string
	offsets string
	ledger  string
	app     string // application_name of the connector's sessions
	src     postgres.Config
	sync    map[string]string       // sync.* overrides for the config file
	source  map[string]string       // extra source.* keys for the config file
	extra   string                  // more top-level YAML for the config file
	tune    func(*connector.Config) // adjusts the in-process engine's config
}

// newWorld builds a world on cluster p (nil = the package's cluster).
func newWorld(t *testing.T, p *harness.Postgres, kopts ...kfake.Opt) *world {
	t.Helper()
	if p == nil {
		p = needPG(t)
	}
	db := harness.NewDBOn(t, p)
	db.Exec(t, itemsDDL)
	w := &world{
		t: t, db: db, dir: t.TempDir(),
		name: "chaos", topic: "items", offsets: "tidemark-offsets", ledger: "tidemark-ledger",
		app: "tidemark-" + db.Schema,
		sync: map[string]string{
			"page_size":        "7",
			"margin":           "1s",
			"poll_interval":    "100ms",
			"poll_jitter":      "0",
			"txn_max_records":  "20",
			"txn_max_duration": "1s",
		},
	}
	w.startKafka(kopts...)
	w.src = postgres.Config{DSN: w.dsn(), Schema: db.Schema, Table: "items", DeletedAtColumn: "deleted_at"}
	return w
}

// startKafka gives the world a broker of its own: in-process kfake (never
// KAFKA_BROKERS), or an Apache Kafka container with the containers backend,
// where w.kafka is nil and kfake-only scenarios skip.
func (w *world) startKafka(kopts ...kfake.Opt) {
	w.t.Helper()
	k := harness.NewOwnKafka(w.t, kopts...)
	w.kafka = k.Cluster
	w.brokers = k.Brokers
	w.opts = []kgo.Opt{kgo.SeedBrokers(w.brokers...)}
}

// dsn is the connector's DSN: the test schema, and an application_name
// that identifies its sessions for pg_terminate_backend.
func (w *world) dsn() string {
	return w.db.URL + "&application_name=" + w.app
}

func (w *world) target() Target {
	return Target{Kafka: w.opts, Topic: w.topic, OffsetsTopic: w.offsets, Name: w.name, Source: w.src}
}

// check runs the checker, logs the six counts and fails the test unless
// they are all 0.
func (w *world) check(label string, marks ...map[int32]int64) Report {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tg := w.target()
	tg.ResetMarks = marks
	r, err := Check(ctx, tg)
	if err != nil {
		w.t.Fatalf("%s: check: %v", label, err)
	}
	w.t.Logf("%s: %s", label, r)
	if r.Failures() != 0 {
		w.t.Errorf("%s: the six counts must be 0: %s", label, r.Counts())
	}
	return r
}

// config writes the binary's config file and returns its path.
func (w *world) config() string {
	w.t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nsource:\n  dsn: %q\n  schema: %s\n  table: items\n  deleted_at_column: deleted_at\n", w.name, w.dsn(), w.db.Schema)
	for _, k := range sortedKeys(w.source) {
		fmt.Fprintf(&b, "  %s: %s\n", k, w.source[k])
	}
	fmt.Fprintf(&b, "kafka:\n  brokers: [%s]\n  topic: %s\n  offsets_topic: %s\n  ledger_topic: %s\n  partitions: 3\n  transaction_timeout: 30s\n",
		strings.Join(w.brokers, ", "), w.topic, w.offsets, w.ledger)
	b.WriteString("sync:\n")
	for _, k := range sortedKeys(w.sync) {
		fmt.Fprintf(&b, "  %s: %s\n", k, w.sync[k])
	}
	b.WriteString("log:\n  level: info\n  format: json\n")
	b.WriteString(w.extra)
	path := filepath.Join(w.dir, "tidemark.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

// proc is one tidemark subprocess.
type proc struct {
	cmd    *exec.Cmd
	stdout harness.SyncBuffer
	stderr harness.SyncBuffer
	done   chan struct{}
	code   int // exit code, -1 when killed by a signal; valid after done
}

// env is the subprocess environment: the test's, without anything that
// could override the config file (TIDEMARK_*, KAFKA_BROKERS), plus extra.
func env(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "TIDEMARK_") || strings.HasPrefix(kv, "KAFKA_BROKERS=") {
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

// start runs the binary with args; extra are added to its environment. The
// process is killed at the end of the test if it is still running.
func (w *world) start(extra []string, args ...string) *proc {
	w.t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan struct{})}
	p.cmd.Env = env(extra...)
	p.cmd.Stdout, p.cmd.Stderr = &p.stdout, &p.stderr
	if err := p.cmd.Start(); err != nil {
		w.t.Fatalf("start tidemark: %v", err)
	}
	go func() {
		_ = p.cmd.Wait()
		p.code = p.cmd.ProcessState.ExitCode()
		close(p.done)
	}()
	w.t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// wait waits for the process to exit and returns its exit code; it fails
// the test after timeout.
func (p *proc) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		t.Fatalf("tidemark %v did not exit within %s; stderr tail:\n%s", p.cmd.Args[1:], timeout, tail(p.stderr.String(), 3000))
		return -1
	}
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to this process (by its pid, never by name).
func (p *proc) signal(sig syscall.Signal) {
	if p.running() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// run runs the binary to completion and returns its exit code and output.
func (w *world) run(timeout time.Duration, extra []string, args ...string) (int, *proc) {
	w.t.Helper()
	p := w.start(extra, args...)
	return p.wait(w.t, timeout), p
}

// once runs `tidemark run --once` without failpoints and requires exit 0.
func (w *world) once(label string) *proc {
	w.t.Helper()
	code, p := w.run(90*time.Second, nil, "run", "--config", w.config(), "--once")
	if code != 0 {
		w.t.Fatalf("%s: run --once exited %d; stderr tail:\n%s", label, code, tail(p.stderr.String(), 4000))
	}
	return p
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// waitFor polls cond every 10ms until it holds or the deadline passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// mutator is the workload: one goroutine running small transactions of
// inserts, updates, soft deletes, undeletes and timestamp ties (many rows
// sharing one updated_at in one transaction). It is the only writer, and
// updated_at only ever grows, so every transaction commits before the next
// one takes its timestamp.
type mutator struct {
	begin  func(ctx context.Context) (pgx.Tx, error)
	rng    *rand.Rand
	live   map[int64]bool
	dead   map[int64]bool
	nextID int64
	last   time.Time
	stats  mutStats
	// late, when positive, holds one transaction in late open for 100 to
	// 400 ms after its write: it commits rows dated at its start after
	// passes (notification passes from W) have moved past them.
	late int
}

// mutStats counts committed operations (and failed transactions).
type mutStats struct {
	Txns, Inserts, Updates, TieRows, SoftDeletes, Undeletes, Failed, Late int
}

func (s mutStats) String() string {
	return fmt.Sprintf("%d transactions (%d committed late): %d inserts, %d updates, %d rows in timestamp ties, %d soft deletes, %d undeletes (%d transactions failed)",
		s.Txns, s.Late, s.Inserts, s.Updates, s.TieRows, s.SoftDeletes, s.Undeletes, s.Failed)
}

// ts returns the next updated_at: the clock, strictly after the previous
// one, and now and then exactly 1µs after it (a boundary in the 6th
// decimal).
func (m *mutator) ts() time.Time {
	now := time.Now().UTC().Truncate(time.Microsecond)
	if !now.After(m.last) || m.rng.IntN(10) == 0 {
		now = m.last.Add(time.Microsecond)
	}
	m.last = now
	return now
}

// seedRows inserts n rows in ties of up to 9 rows per updated_at.
func seedRows(t *testing.T, w *world, m *mutator, n int) {
	t.Helper()
	for n > 0 {
		k := min(n, 1+m.rng.IntN(9))
		ts := m.ts()
		for range k {
			m.nextID++
			w.db.Exec(t, `INSERT INTO items (id, updated_at, v) VALUES ($1, $2, $3)`, m.nextID, ts, fmt.Sprintf("seed-%d", m.nextID))
			m.live[m.nextID] = true
		}
		n -= k
	}
}

func (m *mutator) pick(set map[int64]bool) (int64, bool) {
	if len(set) == 0 {
		return 0, false
	}
	i := m.rng.IntN(len(set))
	for id := range set {
		if i == 0 {
			return id, true
		}
		i--
	}
	return 0, false
}

// step runs one random transaction.
func (m *mutator) step(ctx context.Context) error {
	tx, err := m.begin(ctx)
	if err != nil {
		m.stats.Failed++
		return err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	ts := m.ts()
	val := fmt.Sprintf("v-%s-%d", ts.Format("150405.000000"), m.rng.IntN(1000))
	var apply func()
	switch op := m.rng.IntN(100); {
	case op < 25: // insert 1..6 rows sharing one updated_at
		k := 1 + m.rng.IntN(6)
		ids := make([]int64, k)
		for i := range ids {
			m.nextID++
			ids[i] = m.nextID
		}
		if _, err := tx.Exec(ctx, `INSERT INTO items (id, updated_at, v) SELECT x, $1, $2 FROM unnest($3::bigint[]) AS x`, ts, val, ids); err != nil {
			m.stats.Failed++
			return err
		}
		apply = func() {
			for _, id := range ids {
				m.live[id] = true
			}
			m.stats.Inserts += k
		}
	case op < 40: // a tie: up to 15 live rows updated to one updated_at
		var ids []int64
		for range 1 + m.rng.IntN(15) {
			if id, ok := m.pick(m.live); ok {
				ids = append(ids, id)
			}
		}
		if _, err := tx.Exec(ctx, `UPDATE items SET updated_at = $1, v = $2, n = n + 1 WHERE id = ANY($3)`, ts, val, ids); err != nil {
			m.stats.Failed++
			return err
		}
		apply = func() { m.stats.TieRows += len(ids) }
	case op < 80: // update one row
		id, ok := m.pick(m.live)
		if !ok {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE items SET updated_at = $1, v = $2, n = n + 1 WHERE id = $3`, ts, val, id); err != nil {
			m.stats.Failed++
			return err
		}
		apply = func() { m.stats.Updates++ }
	case op < 92: // soft delete
		id, ok := m.pick(m.live)
		if !ok {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE items SET updated_at = $1, deleted_at = $1 WHERE id = $2`, ts, id); err != nil {
			m.stats.Failed++
			return err
		}
		apply = func() { delete(m.live, id); m.dead[id] = true; m.stats.SoftDeletes++ }
	default: // undelete
		id, ok := m.pick(m.dead)
		if !ok {
			return nil
		}
		if _, err := tx.Exec(ctx, `UPDATE items SET updated_at = $1, deleted_at = NULL, v = $2 WHERE id = $3`, ts, val, id); err != nil {
			m.stats.Failed++
			return err
		}
		apply = func() { delete(m.dead, id); m.live[id] = true; m.stats.Undeletes++ }
	}
	late := m.late > 0 && m.rng.IntN(m.late) == 0
	if late {
		time.Sleep(time.Duration(100+m.rng.IntN(300)) * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		m.stats.Failed++
		return err
	}
	apply()
	m.stats.Txns++
	if late {
		m.stats.Late++
	}
	return nil
}

// newMutator returns a mutator on w's table.
func newMutator(w *world, seed uint64) *mutator {
	m := &mutator{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), live: map[int64]bool{}, dead: map[int64]bool{}}
	m.begin = w.db.Pool.Begin
	m.last = time.Now().UTC().Truncate(time.Microsecond)
	return m
}

// run runs a transaction every `every` until stop is called; stop returns
// the statistics. Errors (a PostgreSQL restart) are counted and retried.
func (m *mutator) run(every time.Duration) (stop func() mutStats) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
			_ = m.step(sctx)
			scancel()
		}
	}()
	return func() mutStats {
		cancel()
		<-done
		return m.stats
	}
}

// ledgerEntries reads the connector's ledger.
func (w *world) ledgerEntries() []*schemas.LedgerEntry {
	w.t.Helper()
	var out []*schemas.LedgerEntry
	l := offsets.NewLedger(w.opts, w.ledger, w.name)
	if err := l.Entries(fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: -1}), 0, func(e *schemas.LedgerEntry) error { out = append(out, e); return nil }); err != nil {
		w.t.Fatalf("read the ledger: %v", err)
	}
	return out
}

// failpointExit is the exit code of a crash at a failpoint.
const failpointExit = failpoint.ExitCode
