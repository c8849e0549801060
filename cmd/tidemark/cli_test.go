package main

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// cliWorld is a PostgreSQL schema with two tables, a Kafka cluster and a
// config file pointing at both, with a password in the DSN (trust auth
// ignores it) that no output may contain.
type cliWorld struct {
	t        *testing.T
	db       *harness.DB
	kafka    *harness.Kafka
	dsn      string
	password string
	dir      string
}

const cliName = "cli-sync"

func newCLIWorld(t *testing.T) *cliWorld {
	t.Helper()
	db := harness.NewDB(t)
	for _, tbl := range []string{"items", "items2"} {
		db.Exec(t, fmt.Sprintf(`CREATE TABLE %s (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at timestamptz, v text);
			CREATE INDEX ON %s (updated_at, id)`, tbl, tbl))
	}
	for i := 1; i <= 7; i++ {
		db.Exec(t, `INSERT INTO items (id, updated_at, v) VALUES ($1, $2, $3)`, i,
			time.Date(2024, 5, 1, 12, 0, 0, i*1000, time.UTC), fmt.Sprintf("v%d", i))
	}
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	password, ok := u.User.Password()
	if !ok {
		password = "Sup3r-S3cret-pw"
		u.User = url.UserPassword(u.User.Username(), password)
	}
	return &cliWorld{t: t, db: db, kafka: harness.NewKafka(t), dsn: u.String(), password: password, dir: t.TempDir()}
}

// loginRole creates a login role named after the test's schema (roles
// are the cluster's) with USAGE on the schema, dropped at cleanup, and
// returns its quoted name and the world's DSN as that role.
func (w *cliWorld) loginRole(suffix string) (ident string, dsn *url.URL) {
	w.t.Helper()
	role := w.db.Schema + "_" + suffix
	ident = pgx.Identifier{role}.Sanitize()
	w.db.Exec(w.t, fmt.Sprintf("CREATE ROLE %s LOGIN", ident))
	w.t.Cleanup(func() {
		_, _ = w.db.Pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %s; DROP ROLE %s", ident, ident))
	})
	w.db.Exec(w.t, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{w.db.Schema}.Sanitize(), ident))
	dsn, err := url.Parse(w.dsn)
	if err != nil {
		w.t.Fatal(err)
	}
	dsn.User = url.User(role)
	return ident, dsn
}

// config writes a config file; extra is appended under the top level
// (source keys go in src).
func (w *cliWorld) config(file, table, src string) string {
	w.t.Helper()
	text := fmt.Sprintf(`name: %s
source:
  dsn: %q
  schema: %s
  table: %s
  deleted_at_column: deleted_at
%s
kafka:
  brokers: [%s]
  topic: items-topic
sync:
  page_size: 2
  margin: 10s
  poll_interval: 50ms
  poll_jitter: 0
log:
  level: warn
  format: text
`, cliName, w.dsn, w.db.Schema, table, src, strings.Join(w.kafka.Brokers, ", "))
	path := filepath.Join(w.dir, file)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// cli runs the CLI in-process and checks that no output holds the password.
func (w *cliWorld) cli(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	w.t.Helper()
	var o, e harness.SyncBuffer
	code = run(ctx, args, &o, &e)
	stdout, stderr = o.String(), e.String()
	w.noSecret(args[0], stdout, stderr)
	return code, stdout, stderr
}

func (w *cliWorld) noSecret(cmd string, outs ...string) {
	w.t.Helper()
	for _, s := range outs {
		if strings.Contains(s, w.password) {
			w.t.Errorf("tidemark %s printed the DSN password:\n%s", cmd, s)
		}
	}
}

func (w *cliWorld) opts() []kgo.Opt { return []kgo.Opt{kgo.SeedBrokers(w.kafka.Brokers...)} }

func (w *cliWorld) seq() int64 {
	w.t.Helper()
	cp, err := offsets.NewStore(w.opts(), "tidemark-offsets", cliName).Load(fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: -1}))
	if err != nil {
		w.t.Fatal(err)
	}
	if cp == nil {
		return 0
	}
	return cp.Seq
}

// assertTopicEqualsTable folds the data topic read_committed and compares
// keys and values with the table walked from scratch by the source.
func (w *cliWorld) assertTopicEqualsTable(table string) {
	w.t.Helper()
	w.assertFold(table, "items-topic")
}

// assertFold compares topic, folded read_committed, with table: keys,
// values, and no (key, value) published twice.
func (w *cliWorld) assertFold(table, topic string) {
	w.t.Helper()
	ctx := context.Background()
	src, err := postgres.New(ctx, postgres.Config{DSN: w.db.URL, Schema: w.db.Schema, Table: table, DeletedAtColumn: "deleted_at"})
	if err != nil {
		w.t.Fatal(err)
	}
	defer src.Close()
	want := map[string]string{}
	req := connector.PageRequest{Limit: 1000}
	for {
		p, err := src.Page(ctx, req)
		if err != nil {
			w.t.Fatal(err)
		}
		if p.End {
			break
		}
		for _, r := range p.Rows {
			if !r.Deleted {
				want[r.ID] = string(r.Value)
			}
		}
		req.Cursor = p.Next
	}
	st, err := fold.Map(ctx, w.opts(), topic)
	if err != nil {
		w.t.Fatal(err)
	}
	for k, v := range want {
		if got, ok := st.Live[k]; !ok || string(got.Value) != v {
			w.t.Errorf("key %s: topic has %q, table has %s", k, got.Value, v)
		}
	}
	for k := range st.Live {
		if _, ok := want[k]; !ok {
			w.t.Errorf("key %s live in the topic but not in the table", k)
		}
	}
	for k, vs := range st.Publications {
		for v, n := range vs {
			if n > 1 {
				w.t.Errorf("key %s: %q published %d times", k, v, n)
			}
		}
	}
}

// TestCLIRunAndStatusNeverPrintPassword: run --once, status (text and
// JSON) and check succeed against the real PostgreSQL and Kafka, the topic
// equals the table, and no output contains the DSN password.
func TestCLIRunAndStatusNeverPrintPassword(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx := context.Background()
	code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once")
	if code != exitOK {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "completion record:") {
		t.Errorf("run --once printed no completion record:\n%s", out)
	}
	w.assertTopicEqualsTable("items")
	code, out, errOut = w.cli(ctx, "status", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "matches the configuration") || !strings.Contains(out, "phase:        idle") {
		t.Errorf("status: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "status", "--config", cfg, "--json")
	if code != exitOK || !strings.Contains(out, `"connector": "`+cliName+`"`) {
		t.Errorf("status --json: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "check", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "preflight passed") {
		t.Errorf("check: exit %d\n%s\n%s", code, out, errOut)
	}
	// A run that cannot connect waits for the database, says so naming the
	// DSN it tries, redacted (w.cli checks every output for the password),
	// and gives up after sync.once_retry_timeout with exit 1.
	u, _ := url.Parse(w.dsn)
	u.Host = "127.0.0.1:1"
	unreachable := *w
	unreachable.dsn = u.String()
	code, out, errOut = w.cli(ctx, "run", "--config", unreachable.config("unreachable.yaml", "items", ""), "--once", "--sync.once_retry_timeout", "2s")
	if code != exitFailure || !strings.Contains(errOut, "127.0.0.1:1") || !strings.Contains(errOut, "start-up: waiting for the source") || !strings.Contains(errOut, "did not answer within 2s") {
		t.Errorf("run against an unreachable PostgreSQL: exit %d, want %d, the waits and the redacted DSN\n%s\n%s", code, exitFailure, out, errOut)
	}
}

// TestCLIConfigChangeIsSafetyStop: after a run, changing source.columns or
// the table is refused with exit 3, the message names what changed, and
// nothing is written.
func TestCLIConfigChangeIsSafetyStop(t *testing.T) {
	w := newCLIWorld(t)
	ctx := context.Background()
	if code, out, errOut := w.cli(ctx, "run", "--config", w.config("a.yaml", "items", ""), "--once"); code != exitOK {
		t.Fatalf("first run: exit %d\n%s\n%s", code, out, errOut)
	}
	seq := w.seq()
	for _, tc := range []struct {
		name, file, table, src, want string
	}{
		{"columns", "b.yaml", "items", "  columns: [id, updated_at, v]", `source.columns: "" -> "id,updated_at,v"`},
		{"table", "c.yaml", "items2", "", `source.table: "items" -> "items2"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := w.cli(ctx, "run", "--config", w.config(tc.file, tc.table, tc.src), "--once")
			if code != exitDecision {
				t.Fatalf("exit %d, want %d\n%s\n%s", code, exitDecision, out, errOut)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("the message does not name the change %s:\n%s", tc.want, errOut)
			}
			if got := w.seq(); got != seq {
				t.Errorf("checkpoint seq moved from %d to %d: the refused run wrote", seq, got)
			}
			code, out, _ = w.cli(ctx, "status", "--config", w.config(tc.file, tc.table, tc.src))
			if code != exitOK || !strings.Contains(out, "DIFFERS") || !strings.Contains(out, tc.want) {
				t.Errorf("status with the changed config: exit %d\n%s", code, out)
			}
		})
	}
	w.assertTopicEqualsTable("items")
}

// TestCLIBadConfigExit2: a bad configuration exits 2 and names the key.
func TestCLIBadConfigExit2(t *testing.T) {
	w := newCLIWorld(t)
	ctx := context.Background()
	write := func(name, text string) string {
		p := filepath.Join(w.dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := w.config("good.yaml", "items", "")
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"page_size_not_a_number", []string{"run", "--config", good, "--set", "sync.page_size=lots"}, []string{"sync.page_size"}},
		{"unknown_key", []string{"run", "--config", write("unknown.yaml", "name: x\nsync:\n  pagesize: 5\n")}, []string{"sync.pagesize", "sync.page_size"}},
		{"missing_table", []string{"status", "--config", write("notable.yaml", fmt.Sprintf("name: x\nsource:\n  dsn: %q\nkafka:\n  brokers: [%s]\n", w.dsn, w.kafka.Brokers[0]))}, []string{"source.table"}},
		{"table_does_not_exist", []string{"run", "--once", "--config", w.config("nosuch.yaml", "no_such_table", "")}, []string{"no_such_table"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := w.cli(ctx, tc.args...)
			if code != exitConfig {
				t.Fatalf("exit %d, want %d\n%s\n%s", code, exitConfig, out, errOut)
			}
			for _, s := range tc.want {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr does not name %q:\n%s", s, errOut)
				}
			}
		})
	}
}

// TestCLISecondInstanceFencesFirst: a continuous run is fenced by a second
// instance of the same connector; the first exits 4 at its next
// transaction and writes nothing after the fence.
func TestCLISecondInstanceFencesFirst(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type result struct {
		code     int
		out, err string
	}
	first := make(chan result, 1)
	go func() {
		var o, e harness.SyncBuffer
		code := run(ctx, []string{"run", "--config", cfg}, &o, &e)
		first <- result{code, o.String(), e.String()}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for w.seq() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the first instance committed nothing within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once"); code != exitOK {
		t.Fatalf("second instance: exit %d\n%s\n%s", code, out, errOut)
	}
	seq := w.seq()
	// A change gives the first instance something to publish: its next
	// transaction meets the fence.
	w.db.Exec(t, `INSERT INTO items (id, updated_at, v) VALUES (100, now(), 'after the fence')`)
	select {
	case r := <-first:
		w.noSecret("run", r.out, r.err)
		if r.code != exitFenced {
			t.Fatalf("first instance: exit %d, want %d\n%s\n%s", r.code, exitFenced, r.out, r.err)
		}
		if !strings.Contains(r.err, "another instance") {
			t.Errorf("first instance: the message does not say it was fenced:\n%s", r.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first instance did not stop within 30s of the fence")
	}
	if got := w.seq(); got != seq {
		t.Errorf("checkpoint seq moved from %d to %d after the fence", seq, got)
	}
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once"); code != exitOK {
		t.Fatalf("third run: exit %d\n%s\n%s", code, out, errOut)
	}
	w.assertTopicEqualsTable("items")
}
