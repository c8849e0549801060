package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

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
