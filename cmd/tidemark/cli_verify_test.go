package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/failpoint"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// The tests of `tidemark verify` and `tidemark sweep` (docs/design.md, Proof) at
// the CLI level, against a real PostgreSQL and kfake.

// vfWorld is a schema with an items table (20 rows), a Kafka cluster and a
// config file for both.
type vfWorld struct {
	t     *testing.T
	db    *harness.DB
	kafka *harness.Kafka
	cfg   string
}

const (
	vfName  = "verify-cli"
	vfTopic = "items-topic"
)

func newVFWorld(t *testing.T, sync string) *vfWorld {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at timestamptz, v text);
		CREATE INDEX ON items (updated_at, id)`)
	for i := 1; i <= 20; i++ {
		db.Exec(t, `INSERT INTO items (id, updated_at, v) VALUES ($1, $2, $3)`, i, time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).Add(time.Duration(i)*time.Hour), fmt.Sprintf("v%d", i))
	}
	w := &vfWorld{t: t, db: db, kafka: harness.NewKafka(t)}
	if sync == "" {
		sync = "  page_size: 5\n"
	}
	text := fmt.Sprintf(`name: %s
source:
  dsn: %q
  schema: %s
  table: items
  deleted_at_column: deleted_at
kafka:
  brokers: [%s]
  topic: %s
sync:
  margin: 1s
%slog:
  level: warn
  format: text
`, vfName, db.URL, db.Schema, strings.Join(w.kafka.Brokers, ", "), vfTopic, sync)
	w.cfg = filepath.Join(t.TempDir(), "tidemark.yaml")
	if err := os.WriteFile(w.cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return w
}

func (w *vfWorld) opts() []kgo.Opt { return []kgo.Opt{kgo.SeedBrokers(w.kafka.Brokers...)} }

// cli runs tidemark in-process.
func (w *vfWorld) cli(args ...string) (code int, stdout, stderr string) {
	w.t.Helper()
	var o, e bytes.Buffer
	code = run(context.Background(), append(args, "--config", w.cfg), &o, &e)
	return code, o.String(), e.String()
}

func (w *vfWorld) mustCLI(args ...string) string {
	w.t.Helper()
	code, out, errOut := w.cli(args...)
	if code != exitOK {
		w.t.Fatalf("tidemark %s: exit %d\n%s\n%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// jsonReport runs `verify --json` and decodes it.
func (w *vfWorld) jsonReport(args ...string) (int, map[string]any) {
	w.t.Helper()
	code, out, errOut := w.cli(append([]string{"verify", "--json"}, args...)...)
	var rep map[string]any
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		w.t.Fatalf("verify --json: exit %d, not JSON: %v\n%s\n%s", code, err, out, errOut)
	}
	return code, rep
}

func strs(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}

// assertExact folds the topic read_committed and compares keys and values
// with the table (as the source encodes it); it returns the fold.
func (w *vfWorld) assertExact() *fold.State {
	w.t.Helper()
	ctx := context.Background()
	src, err := postgres.New(ctx, postgres.Config{DSN: w.db.URL, Schema: w.db.Schema, Table: "items", DeletedAtColumn: "deleted_at"})
	if err != nil {
		w.t.Fatal(err)
	}
	defer src.Close()
	want := map[string]string{}
	if _, err := src.ScanLive(ctx, func(r *connector.Row) error { want[r.ID] = string(r.Value); return nil }); err != nil {
		w.t.Fatal(err)
	}
	st, err := fold.Map(ctx, w.opts(), vfTopic)
	if err != nil {
		w.t.Fatal(err)
	}
	for k, v := range want {
		if got, ok := st.Live[k]; !ok || string(got.Value) != v {
			w.t.Errorf("key %s: the topic has %q, the table has %s", k, got.Value, v)
		}
	}
	for k := range st.Live {
		if _, ok := want[k]; !ok {
			w.t.Errorf("key %s: live in the topic but not in the table", k)
		}
	}
	return st
}

func (w *vfWorld) checkpoint() *schemas.Checkpoint {
	w.t.Helper()
	// As it stands: after a crash the killed run's transaction is open.
	ctx := fold.WithViewWait(context.Background(), fold.ViewWait{Timeout: -1})
	cp, err := offsets.NewStore(w.opts(), "tidemark-offsets", vfName).Load(ctx)
	if err != nil || cp == nil {
		w.t.Fatalf("load checkpoint: %v %v", cp, err)
	}
	return cp
}

// TestCLIVerifyMissingAndExtraExit5: the topic lacks key 4 and holds key 999
// (produced behind tidemark's back), so source rows and live keys are both
// 20. verify exits 5 and names both keys, in text and JSON; `tidemark sweep`
// repairs both and verify exits 0.
func TestCLIVerifyMissingAndExtraExit5(t *testing.T) {
	w := newVFWorld(t, "")
	w.mustCLI("run", "--once")
	if out := w.mustCLI("verify"); !strings.Contains(out, "MATCH") {
		t.Errorf("verify after a sync:\n%s", out)
	}
	cl, err := kgo.NewClient(append(w.opts(), kgo.DefaultProduceTopic(vfTopic), kgo.DisableIdempotentWrite())...)
	if err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(context.Background(),
		&kgo.Record{Key: []byte("4")}, // a tombstone: key 4 goes missing
		&kgo.Record{Key: []byte("999"), Value: []byte(`{"id":999,"v":"ghost"}`)},
	).FirstErr(); err != nil {
		t.Fatal(err)
	}
	cl.Close()

	code, out, errOut := w.cli("verify")
	t.Logf("verify:\n%s%s", out, errOut)
	if code != exitMismatch {
		t.Fatalf("verify: exit %d, want %d", code, exitMismatch)
	}
	for _, s := range []string{"source rows:   20", "live keys:     20", "missing:       1 e.g. 4", "extra:         1 e.g. 999", "mismatched:    0", "MISMATCH"} {
		if !strings.Contains(out, s) {
			t.Errorf("the report lacks %q", s)
		}
	}
	code, rep := w.jsonReport()
	if code != exitMismatch || rep["ok"] != false || rep["source_rows"] != 20.0 || rep["live_keys"] != 20.0 ||
		!slices.Equal(strs(rep["missing_sample"]), []string{"4"}) || !slices.Equal(strs(rep["extra_sample"]), []string{"999"}) {
		t.Errorf("verify --json: exit %d %v", code, rep)
	}
	for _, k := range []string{"missing", "extra", "mismatched", "duplicate_publications", "records_back_in_time", "back_in_time_sample", "back_in_time_unchecked", "misplaced_records", "source_view", "target_end", "records", "tombstones"} {
		if _, ok := rep[k]; !ok {
			t.Errorf("verify --json lacks %q", k)
		}
	}

	code, out, errOut = w.cli("sweep")
	if code != exitOK {
		t.Fatalf("sweep: exit %d\n%s\n%s", code, out, errOut)
	}
	if !strings.Contains(out, "1 tombstoned, 1 repaired") {
		t.Errorf("sweep: %s", out)
	}
	if code, out, _ := w.cli("verify"); code != exitOK {
		t.Errorf("verify after the sweep: exit %d\n%s", code, out)
	}
	w.assertExact()
}

// TestCLIVerifyReplicaTable: `verify --replica-table` compares the source
// with a copy made in SQL; one changed row is named as mismatched (exit 5).
func TestCLIVerifyReplicaTable(t *testing.T) {
	w := newVFWorld(t, "")
	w.db.Exec(t, `CREATE TABLE items_copy (LIKE items INCLUDING ALL); INSERT INTO items_copy SELECT * FROM items`)
	if code, out, errOut := w.cli("verify", "--replica-table", "items_copy"); code != exitOK {
		t.Fatalf("verify of an exact copy: exit %d\n%s\n%s", code, out, errOut)
	}
	w.db.Exec(t, `UPDATE items_copy SET v = 'drifted' WHERE id = 13`)
	code, out, _ := w.cli("verify", "--replica-table", "items_copy")
	t.Logf("verify --replica-table:\n%s", out)
	if code != exitMismatch || !strings.Contains(out, "mismatched:    1 e.g. 13") || !strings.Contains(out, "table "+w.db.Schema+".items_copy") {
		t.Errorf("verify --replica-table with a changed row: exit %d", code)
	}
	code, rep := w.jsonReport("--replica-table", "items_copy")
	if code != exitMismatch || !slices.Equal(strs(rep["mismatched_sample"]), []string{"13"}) || rep["missing"] != 0.0 || rep["extra"] != 0.0 {
		t.Errorf("verify --json --replica-table: exit %d %v", code, rep)
	}
}

// TestCLIHelperProcess is not a test: it is `tidemark` in a subprocess for
// the crash tests (TIDEMARK_FAILPOINTS exits the process as kill -9 would).
func TestCLIHelperProcess(t *testing.T) {
	if os.Getenv("TIDEMARK_CLI_HELPER") != "1" {
		t.Skip("the helper process of the crash tests")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	os.Exit(run(context.Background(), args, os.Stdout, os.Stderr))
}

// subprocess runs tidemark args in a child process with env added.
func (w *vfWorld) subprocess(env []string, args ...string) (code int, stdout, stderr string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], append([]string{"-test.run=^TestCLIHelperProcess$", "--"}, append(args, "--config", w.cfg)...)...)
	cmd.Env = append(append(os.Environ(), "TIDEMARK_CLI_HELPER=1"), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		w.t.Fatalf("start tidemark %v: %v", args, err)
	}
	return code, o.String(), e.String()
}

// TestCLISweepCrashResumes: `tidemark sweep` with two records per
// transaction crashes (TIDEMARK_FAILPOINTS during-commit) in its second
// transaction, after the first committed. The checkpoint marks the sweep
// unfinished; the next `run --once` (or `sweep`) finishes it, and the final
// state is exact: the deleted ids tombstoned, nothing else, verify exit 0.
//
// The hits of during-commit are: 1 the run-start ledger entry, 2 the
// commit that marks the sweep in progress, 3 the first sweep transaction,
// 4 the second: the crash is on hit 4.
func TestCLISweepCrashResumes(t *testing.T) {
	for _, rerun := range []string{"run --once", "sweep"} {
		t.Run(strings.ReplaceAll(rerun, " --", "_"), func(t *testing.T) {
			w := newVFWorld(t, "  page_size: 2\n  txn_max_records: 2\n")
			w.mustCLI("run", "--once")
			w.db.Exec(t, `DELETE FROM items WHERE id IN (2, 4, 6, 8, 10, 12)`)
			w.db.Exec(t, `UPDATE items SET v = 'sneaky' WHERE id IN (14, 15, 16)`) // updated_at untouched: only a sweep sees it
			code, _, _ := w.cli("verify")
			if code != exitMismatch {
				t.Fatalf("verify before the sweep: exit %d, want %d", code, exitMismatch)
			}
			code, out, errOut := w.subprocess([]string{"TIDEMARK_FAILPOINTS=" + failpoint.DuringCommit + "=4"}, "sweep")
			if code != failpoint.ExitCode {
				t.Fatalf("sweep with a failpoint: exit %d, want the crash (%d)\n%s\n%s", code, failpoint.ExitCode, out, errOut)
			}
			// The crashed process left its last transaction open on the
			// offsets topic: status still answers, from the view as it
			// stands, and says that it may be behind.
			if code, out, errOut := w.cli("status"); code != exitOK || !strings.Contains(errOut, "still open") {
				t.Errorf("status right after the crash: exit %d, want %d and a warning about the open transaction\n%s\n%s", code, exitOK, out, errOut)
			}
			cp := w.checkpoint()
			if cp.Sweep == nil || cp.Sweep.Repaired+cp.Sweep.Tombstoned != 2 {
				t.Fatalf("checkpoint after the crash: sweep %+v, want an unfinished sweep with 2 committed records", cp.Sweep)
			}
			if code, _, _ := w.cli("verify"); code != exitMismatch {
				t.Errorf("verify after the crash: exit %d, want %d (the sweep is half done)", code, exitMismatch)
			}

			args := strings.Fields(rerun)
			code, out, errOut = w.subprocess(nil, args...)
			if code != exitOK {
				t.Fatalf("tidemark %s after the crash: exit %d\n%s\n%s", rerun, code, out, errOut)
			}
			cp = w.checkpoint()
			if cp.Sweep != nil || cp.LastSweep == nil {
				t.Errorf("checkpoint after the rerun: sweep %+v last_sweep %+v; want the sweep finished", cp.Sweep, cp.LastSweep)
			}
			st := w.assertExact()
			var tomb []string
			for k, vs := range st.Publications {
				if vs["\x00tombstone"] > 0 {
					tomb = append(tomb, k)
				}
				for v, n := range vs {
					if n > 1 {
						t.Errorf("key %s: %q published %d times", k, v, n)
					}
				}
			}
			slices.Sort(tomb)
			if want := []string{"10", "12", "2", "4", "6", "8"}; !slices.Equal(tomb, want) {
				t.Errorf("keys with a tombstone: %v, want %v", tomb, want)
			}
			if code, out, _ := w.cli("verify"); code != exitOK {
				t.Errorf("verify after the rerun: exit %d\n%s", code, out)
			}
		})
	}
}
