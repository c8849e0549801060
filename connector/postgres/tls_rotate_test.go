package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
	"github.com/tidemark/tidemark/test/tlsca"
)

// TestRenewedTLSFilesAreReadForNewConnections: the CA, client certificate
// and key that source.dsn names (sslrootcert, sslcert, sslkey) are read
// again for every new connection, as a password file is, so that files
// renewed in place (cert-manager, a Kubernetes secret) need no restart. Here
// the server moves to a new CA and the old client certificate stops being
// accepted; the sessions are cut; the pool and the listener must log in
// again with the new files.
func TestRenewedTLSFilesAreReadForNewConnections(t *testing.T) {
	p := harness.StartPostgres(t)
	const user = "tm_cert_rotate"
	ca1, ca2 := tlsca.New(t, "tidemark test CA 1"), tlsca.New(t, "tidemark test CA 2")
	s1, s1key := ca1.Issue(t, "127.0.0.1")
	p.RequireClientCerts(t, user, ca1.PEM, s1, s1key)
	db := harness.NewDBOn(t, p)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	db.Exec(t, `INSERT INTO items VALUES (1, now())`)
	db.Exec(t, fmt.Sprintf(`CREATE ROLE %s LOGIN`, user))
	db.Exec(t, fmt.Sprintf(`GRANT USAGE ON SCHEMA %q TO %s`, db.Schema, user))
	db.Exec(t, fmt.Sprintf(`GRANT SELECT ON %q.items TO %s`, db.Schema, user))

	dir := t.TempDir()
	files := map[string]string{"root": filepath.Join(dir, "root.crt"), "cert": filepath.Join(dir, "client.crt"), "key": filepath.Join(dir, "client.key")}
	write := func(root, cert, key []byte) {
		t.Helper()
		for name, b := range map[string][]byte{"root": root, "cert": cert, "key": key} {
			// Replaced as a Kubernetes secret volume is: a new file
			// renamed over the old.
			if err := os.WriteFile(files[name]+".new", b, 0o600); err != nil {
				t.Fatal(err)
			}
			if err := os.Rename(files[name]+".new", files[name]); err != nil {
				t.Fatal(err)
			}
		}
	}
	c1, c1key := ca1.Issue(t, user)
	write(ca1.PEM, c1, c1key)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("sslmode", "verify-ca")
	q.Set("sslrootcert", files["root"])
	q.Set("sslcert", files["cert"])
	q.Set("sslkey", files["key"])
	u.RawQuery, u.User = q.Encode(), url.User(user)
	cfg := postgres.Config{DSN: u.String(), Schema: db.Schema, Table: "items"}

	ctx := context.Background()
	src := open(t, cfg)
	read := func() error {
		page, err := src.Page(ctx, connector.PageRequest{Limit: 10})
		if err == nil && len(page.Rows) != 1 {
			err = fmt.Errorf("%d rows, want 1", len(page.Rows))
		}
		return err
	}
	if err := read(); err != nil {
		t.Fatalf("before the rotation: %v", err)
	}
	l, err := postgres.Listen(ctx, cfg, postgres.ListenConfig{Channel: "tls_rotate", MaxBackoff: 200 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()

	// The rotation: the server trusts CA 2 only and presents a certificate
	// of CA 2; the client's files are renewed to CA 2's; then the sessions
	// made with the old ones are cut.
	s2, s2key := ca2.Issue(t, "127.0.0.1")
	p.RequireClientCerts(t, user, ca2.PEM, s2, s2key)
	c2, c2key := ca2.Issue(t, user)
	write(ca2.PEM, c2, c2key)
	oldPID := l.PID()
	if oldPID == 0 {
		t.Fatal("the listener has no session before the rotation")
	}
	db.Exec(t, fmt.Sprintf(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '%s'`, user))

	deadline := time.Now().Add(10 * time.Second)
	for err := read(); err != nil; err = read() {
		if time.Now().After(deadline) {
			t.Fatalf("the pool does not log in again after the files were renewed: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The listener's new session is another backend, logged in with the
	// client certificate of CA 2.
	for {
		var issuer string
		pid := l.PID()
		if pid != 0 && pid != oldPID {
			err := db.Pool.QueryRow(ctx, `SELECT coalesce(s.issuer_dn, '') FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.pid = $1 AND a.usename = $2`, int(pid), user).Scan(&issuer)
			if err != nil && !errors.Is(err, pgx.ErrNoRows) {
				t.Fatal(err)
			}
		}
		if strings.Contains(issuer, "CA 2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the listener does not log in again after the files were renewed (session %d, before %d; client certificate issuer %q)", pid, oldPID, issuer)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
