package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestPasswordRotation: the connector logs in as a role with a password
// from source.password_file. Mid-run the file disappears for a while and
// every session of the connector is cut (reconnecting fails meanwhile, as
// a transient failure); then the password is rotated the way a secret
// store does it (the file is replaced, then the role's password changed)
// and the sessions are cut again, as a failover or a pooler restart would. The connector must log in again with the new
// password, by itself: the pool's sessions and the notify listener's (the
// poll interval is an hour, so without the listener nothing would run).
// Nothing may be lost or duplicated, and no password may reach the logs.
func TestPasswordRotation(t *testing.T) {
	p := harness.StartPostgres(t)
	p.RequirePasswords(t)
	w := newWorld(t, p)
	const oldPW, newPW = "old-S3cret-7f1", "new-S3cret-9c4"
	w.db.Exec(t, fmt.Sprintf(`CREATE ROLE tm_rotate LOGIN PASSWORD '%s'`, oldPW))
	w.db.Exec(t, fmt.Sprintf(`GRANT USAGE ON SCHEMA %s TO tm_rotate`, pgx.Identifier{w.db.Schema}.Sanitize()))
	w.db.Exec(t, fmt.Sprintf(`GRANT SELECT ON ALL TABLES IN SCHEMA %s TO tm_rotate`, pgx.Identifier{w.db.Schema}.Sanitize()))
	sql, err := postgres.NotifySQL(w.db.Schema, "items", "chaos_rotate", postgres.NotifyStatement)
	if err != nil {
		t.Fatal(err)
	}
	w.db.Exec(t, sql.Install)

	// The connector's DSN names the role and no password; the checker
	// keeps the superuser's (w.src).
	superURL := w.db.URL
	if !strings.HasPrefix(superURL, "postgres://postgres@") {
		t.Fatalf("unexpected test DSN form %q", superURL)
	}
	w.db.URL = "postgres://tm_rotate@" + strings.TrimPrefix(superURL, "postgres://postgres@")
	defer func() { w.db.URL = superURL }()
	if c, err := pgx.Connect(context.Background(), w.dsn()); err == nil {
		c.Close(context.Background())
		t.Fatal("the role logged in without a password: the server does not require one")
	}
	pwFile := filepath.Join(w.dir, "pgpass-secret")
	writeSecret := func(v string) {
		// A secret store replaces the file (a new file renamed into place).
		tmp := pwFile + ".new"
		if err := os.WriteFile(tmp, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, pwFile); err != nil {
			t.Fatal(err)
		}
	}
	writeSecret(oldPW)
	w.source = map[string]string{"password_file": pwFile, "notify": "chaos_rotate"}
	w.sync["poll_interval"] = "1h"

	seed := seedFor(t)
	m := newMutator(w, seed)
	seedRows(t, w, m, 100)
	stopMut := m.run(20 * time.Millisecond)
	proc := w.start(nil, "run", "--config", w.config())
	commits := func() int { return strings.Count(proc.stderr.String(), `"msg":"committed"`) }
	waitFor(t, 60*time.Second, "the first commits", func() bool { return commits() >= 3 })

	cutSessions := func() int {
		t.Helper()
		var cut int
		if err := w.db.Pool.QueryRow(context.Background(),
			`SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'tm_rotate'`).Scan(&cut); err != nil {
			t.Fatal(err)
		}
		return cut
	}
	// The secret store removes the file for a moment: the connections
	// opened meanwhile fail, as transient failures that name the file, and
	// the process keeps running.
	if err := os.Remove(pwFile); err != nil {
		t.Fatal(err)
	}
	if cut := cutSessions(); cut < 2 {
		t.Fatalf("cut %d sessions of the connector; want its pool's and its listener's", cut)
	}
	waitFor(t, 30*time.Second, "warnings naming the missing password file", func() bool {
		return strings.Contains(proc.stderr.String(), "read password file "+pwFile)
	})
	if !proc.running() {
		t.Fatalf("tidemark exited %d while its password file was missing; stderr tail:\n%s", proc.code, tail(proc.stderr.String(), 3000))
	}
	writeSecret(newPW)
	w.db.Exec(t, fmt.Sprintf(`ALTER ROLE tm_rotate PASSWORD '%s'`, newPW))
	cutSessions()
	before := commits()
	cutAt := time.Now()
	deadline := cutAt.Add(90 * time.Second)
	for commits() < before+3 {
		if time.Now().After(deadline) || !proc.running() {
			stopMut()
			t.Fatalf("no commits within 90 s after the password was rotated (%d before, %d now, running %v); stderr tail:\n%s",
				before, commits(), proc.running(), tail(proc.stderr.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("committing again %s after the rotation", time.Since(cutAt).Round(time.Millisecond))
	stats := stopMut()
	proc.signal(syscall.SIGTERM)
	if code := proc.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("SIGTERM after the rotation: exit %d; stderr tail:\n%s", code, tail(proc.stderr.String(), 3000))
	}
	for _, pw := range []string{oldPW, newPW, "S3cret"} {
		if strings.Contains(proc.stderr.String()+proc.stdout.String(), pw) {
			t.Errorf("the output holds a password (%q)", pw)
		}
	}
	w.once("after the rotation")
	w.check(fmt.Sprintf("password rotation (%s)", stats))
}
