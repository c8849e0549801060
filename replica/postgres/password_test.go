package postgres_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/replica/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestTargetReadsItsPasswordFileForEveryConnection: with Config.PasswordFile
// the target logs in with what the file holds when a connection opens, so
// a password rotated mid-run (the file replaced, then the role's password
// changed, then the sessions cut) needs no restart.
func TestTargetReadsItsPasswordFileForEveryConnection(t *testing.T) {
	p := harness.StartPostgres(t)
	p.RequirePasswords(t)
	db := harness.NewDBOn(t, p)
	db.Exec(t, `CREATE ROLE tm_replica_rotate LOGIN PASSWORD 'first-S3cret'`)
	db.Exec(t, fmt.Sprintf(`GRANT ALL ON SCHEMA %s TO tm_replica_rotate`, pgx.Identifier{db.Schema}.Sanitize()))
	file := filepath.Join(t.TempDir(), "pw")
	write := func(v string) {
		t.Helper()
		if err := os.WriteFile(file+".new", []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(file+".new", file); err != nil {
			t.Fatal(err)
		}
	}
	write("first-S3cret")
	if !strings.HasPrefix(db.URL, "postgres://postgres@") {
		t.Fatalf("unexpected test DSN form %q", db.URL)
	}
	dsn := "postgres://tm_replica_rotate@" + strings.TrimPrefix(db.URL, "postgres://postgres@")
	ctx := context.Background()
	tg, err := postgres.Open(ctx, postgres.Config{DSN: dsn, PasswordFile: file, Table: "r", Topic: "t"})
	if err != nil {
		t.Fatal(err)
	}
	defer tg.Close()
	if _, err := tg.Positions(ctx); err != nil {
		t.Fatal(err)
	}
	write("second-S3cret")
	db.Exec(t, `ALTER ROLE tm_replica_rotate PASSWORD 'second-S3cret'`)
	db.Exec(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'tm_replica_rotate'`)
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := tg.Positions(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the target does not log in again after the rotation: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
