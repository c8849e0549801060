package main

import (
	"context"
	"strings"
	"testing"
)

// TestCLIReplica: the whole loop in-process: run --once, replica --once
// into a created table, verify the replica against the source, rebuild
// with --from-beginning; usage and schema problems exit 2.
func TestCLIReplica(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx := context.Background()
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once"); code != exitOK {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut := w.cli(ctx, "replica", "--config", cfg, "--target-table", "items_replica", "--once")
	if code != exitOK || !strings.Contains(out, "applied 7 records") || !strings.Contains(out, "lag 0") {
		t.Fatalf("replica --once: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "verify", "--config", cfg, "--replica-table", "items_replica")
	if code != exitOK {
		t.Fatalf("verify --replica-table: exit %d\n%s\n%s", code, out, errOut)
	}
	// Caught up: a second run applies nothing.
	code, out, errOut = w.cli(ctx, "replica", "--config", cfg, "--target-table", "items_replica", "--once")
	if code != exitOK || !strings.Contains(out, "applied 0 records") {
		t.Fatalf("second replica --once: exit %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = w.cli(ctx, "replica", "--config", cfg, "--target-table", "items_replica", "--once", "--from-beginning")
	if code != exitOK || !strings.Contains(out, "applied 7 records") {
		t.Fatalf("replica --from-beginning: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, errOut = w.cli(ctx, "replica", "--config", cfg, "--once"); code != exitConfig || !strings.Contains(errOut, "--target-table") {
		t.Errorf("replica without --target-table: exit %d\n%s\n%s", code, out, errOut)
	}
	w.db.Exec(t, `CREATE TABLE wrong (id bigint PRIMARY KEY, updated_at timestamptz, v integer)`)
	code, out, errOut = w.cli(ctx, "replica", "--config", cfg, "--target-table", "wrong", "--once")
	if code != exitConfig || !strings.Contains(errOut, `column "v": source type text does not fit target type integer`) ||
		!strings.Contains(errOut, `missing column "deleted_at"`) {
		t.Errorf("replica into a table that does not fit: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestCLIReplicaWithoutCreateExit2: a replica role that may not create the
// replica's tables in its schema is a configuration error (exit 2) naming
// PostgreSQL's refusal, not a runtime failure and not the database's
// CONNECT privilege.
func TestCLIReplicaWithoutCreateExit2(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx := context.Background()
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once"); code != exitOK {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	_, u := w.loginRole("nocreate")
	code, out, errOut := w.cli(ctx, "replica", "--config", cfg, "--target-table", "items_replica", "--once", "--target-dsn", u.String())
	if code != exitConfig || !strings.Contains(errOut, "permission denied") || strings.Contains(errOut, "GRANT CONNECT") {
		t.Errorf("replica as a role without CREATE: exit %d, want 2 naming the refusal\n%s\n%s", code, out, errOut)
	}
}
