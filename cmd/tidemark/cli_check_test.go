package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/test/harness"
)

// checkJSON decodes every JSON object check --json printed.
func checkJSON(t *testing.T, out string) []map[string]any {
	t.Helper()
	var objs []map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("check --json printed something that is not JSON (%v):\n%s", err, out)
		}
		objs = append(objs, m)
	}
	return objs
}

// findings maps "check severity" to the message of each finding.
func findings(t *testing.T, obj map[string]any) map[string]string {
	t.Helper()
	list, ok := obj["findings"].([]any)
	if !ok {
		t.Fatalf("no findings list in %v", obj)
	}
	out := map[string]string{}
	for _, f := range list {
		m, _ := f.(map[string]any)
		check, _ := m["check"].(string)
		sev, _ := m["severity"].(string)
		msg, _ := m["message"].(string)
		if check == "" || sev == "" || msg == "" {
			t.Errorf("a finding without check, severity or message: %v", m)
		}
		out[check+" "+sev] = msg
	}
	return out
}

// TestCLICheckJSON: check --json prints one object with the findings
// (check, severity, message) and the verdict; with tables, one per task.
func TestCLICheckJSON(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx := context.Background()
	code, out, errOut := w.cli(ctx, "check", "--config", cfg, "--json")
	if code != exitOK {
		t.Fatalf("check --json: exit %d\n%s\n%s", code, out, errOut)
	}
	objs := checkJSON(t, out)
	if len(objs) != 1 || objs[0]["ok"] != true || objs[0]["connector"] != cliName {
		t.Fatalf("check --json: want one object, ok, naming the connector:\n%s", out)
	}
	fs := findings(t, objs[0])
	for _, k := range []string{"id ok", "updated_at ok", "topic ok", "checkpoint ok"} {
		if _, ok := fs[k]; !ok {
			t.Errorf("check --json lacks a finding %q: %v", k, fs)
		}
	}

	// A table that does not meet the requirements: exit 2, ok false, and
	// why (opening the source inspects the table).
	w.db.Exec(t, `CREATE TABLE noid (k bigint, updated_at timestamptz NOT NULL)`)
	bad := w.config("bad.yaml", "noid", "  id_column: k\n")
	code, out, errOut = w.cli(ctx, "check", "--config", bad, "--json")
	objs = checkJSON(t, out)
	if code != exitConfig || len(objs) != 1 || objs[0]["ok"] != false {
		t.Fatalf("check --json of a table without a unique id: exit %d\n%s\n%s", code, out, errOut)
	}
	if msg, _ := objs[0]["error"].(string); !strings.Contains(msg, `id column "k"`) {
		t.Errorf("check --json does not say what is wrong with the id column:\n%s", out)
	}

	tasks := w.tasksConfig("")
	code, out, errOut = w.cli(ctx, "check", "--config", tasks, "--json")
	if code != exitOK {
		t.Fatalf("check --json with tables: exit %d\n%s\n%s", code, out, errOut)
	}
	objs = checkJSON(t, out)
	if len(objs) != 3 {
		t.Fatalf("check --json with tables printed %d objects, want one per task:\n%s", len(objs), out)
	}
	for _, o := range objs {
		task, _ := o["task"].(string)
		if task == "" || o["connector"] != cliName+"-"+task || o["ok"] != true {
			t.Errorf("check --json with tables: an object without its task, connector or verdict: %v", o)
		}
		findings(t, o)
	}
}

// TestCLIStatusKafkaLineWithoutCheckpoint: status prints the Kafka
// security line also before the first run.
func TestCLIStatusKafkaLineWithoutCheckpoint(t *testing.T) {
	k := harness.NewKafka(t)
	dir := t.TempDir()
	cfg := writeFile(t, dir, "c.yaml", fmt.Sprintf("name: fresh\nsource:\n  dsn: postgres://u@127.0.0.1:1/db\n  table: items\nkafka:\n  brokers: [%s]\nlog:\n  format: text\n",
		strings.Join(k.Brokers, ", ")))
	code, out, errOut := edgeCLI(t, nil, "status", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "no committed checkpoint") || !strings.Contains(out, "kafka:        tls off; sasl off") {
		t.Errorf("status before the first run: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestCLIRowLevelSecurityExit2: a role that a row-level security policy
// applies to would read only part of the table; check, run and verify
// refuse it with exit 2, naming row-level security and the fix, and do not
// blame the database's CONNECT privilege for PostgreSQL's 42501.
func TestCLIRowLevelSecurityExit2(t *testing.T) {
	w := newCLIWorld(t)
	ctx := context.Background()
	w.db.Exec(t, "ALTER TABLE items ENABLE ROW LEVEL SECURITY")
	w.db.Exec(t, "CREATE POLICY odd ON items FOR SELECT USING (id % 2 = 1)")
	ident, u := w.loginRole("rls")
	w.db.Exec(t, fmt.Sprintf("GRANT SELECT ON items TO %s", ident))
	w.dsn = u.String()
	cfg := w.config("rls.yaml", "items", "")
	for _, args := range [][]string{{"check"}, {"run", "--once"}, {"verify"}} {
		code, out, errOut := w.cli(ctx, append(args, "--config", cfg)...)
		all := out + errOut
		if code != exitConfig || !strings.Contains(all, "row-level security") || !strings.Contains(all, "BYPASSRLS") || strings.Contains(all, "GRANT CONNECT") {
			t.Errorf("%v as a role under row-level security: exit %d, want 2 naming row-level security and BYPASSRLS\n%s", args, code, all)
		}
	}

	// The database's CONNECT privilege is still named when it is what
	// PostgreSQL refused (a database of the test's own, so that no other
	// test loses it).
	dbName := pgx.Identifier{w.db.Schema + "_noconnect"}.Sanitize()
	w.db.Exec(t, "CREATE DATABASE "+dbName)
	t.Cleanup(func() { _, _ = w.db.Pool.Exec(context.Background(), "DROP DATABASE "+dbName+" WITH (FORCE)") })
	w.db.Exec(t, "REVOKE CONNECT ON DATABASE "+dbName+" FROM PUBLIC")
	u.Path = "/" + w.db.Schema + "_noconnect"
	w.dsn = u.String()
	cfg = w.config("noconnect.yaml", "items", "")
	code, out, errOut := w.cli(ctx, "check", "--config", cfg)
	if code != exitConfig || !strings.Contains(out+errOut, "GRANT CONNECT ON DATABASE") {
		t.Errorf("check without CONNECT on the database: exit %d, want 2 naming GRANT CONNECT\n%s%s", code, out, errOut)
	}
}

// TestCLICheckFailsOnAChangedConfiguration: after a run, a configuration
// whose fingerprint differs from the checkpoint's is a fail finding, and
// check exits as run would (3), not 0 with "preflight passed": a CI gate
// on check let the run through to its safety stop.
func TestCLICheckFailsOnAChangedConfiguration(t *testing.T) {
	w := newCLIWorld(t)
	ctx := context.Background()
	cfg := w.config("tidemark.yaml", "items", "")
	if code, out, errOut := w.cli(ctx, "run", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	changed := w.config("changed.yaml", "items", "  filter: id > 0\n")
	code, out, errOut := w.cli(ctx, "check", "--config", changed)
	if code != exitDecision || strings.Contains(out, "preflight passed") || !strings.Contains(out+errOut, "source.filter") {
		t.Errorf("check of a changed configuration: exit %d, want %d, naming source.filter\n%s\n%s", code, exitDecision, out, errOut)
	}
	code, out, _ = w.cli(ctx, "check", "--config", changed, "--json")
	if objs := checkJSON(t, out); code != exitDecision || len(objs) != 1 || objs[0]["ok"] != false {
		t.Errorf("check --json of a changed configuration: exit %d\n%s", code, out)
	}
}
