package postgres

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/test/tlsca"
)

// renewTLS reads nothing for a DSN without TLS; for one with TLS, a CA
// file gone mid-run fails the new connection with an error that names the
// file and never the DSN's password.
func TestRenewTLSErrors(t *testing.T) {
	const pw = "Sup3r-S3cret-pw"
	plain, err := pgx.ParseConfig("postgres://u:" + pw + "@127.0.0.1:1/d?sslmode=disable")
	if err != nil {
		t.Fatal(err)
	}
	if err := renewTLS(plain); err != nil || plain.TLSConfig != nil {
		t.Errorf("sslmode=disable: %v, TLS %v; want nothing done", err, plain.TLSConfig)
	}

	dir := t.TempDir()
	ca := filepath.Join(dir, "root.crt")
	if err := os.WriteFile(ca, tlsca.New(t, "tidemark test CA").PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	cc, err := pgx.ParseConfig("postgres://u:" + pw + "@127.0.0.1:1/d?sslmode=verify-ca&sslrootcert=" + ca)
	if err != nil {
		t.Fatal(err)
	}
	old := cc.TLSConfig
	if err := renewTLS(cc); err != nil {
		t.Fatal(err)
	}
	if cc.TLSConfig == nil || cc.TLSConfig == old {
		t.Errorf("TLS config %p after renewTLS, %p before: want a new one", cc.TLSConfig, old)
	}
	if err := os.Remove(ca); err != nil {
		t.Fatal(err)
	}
	err = renewTLS(cc)
	if err == nil || !strings.Contains(err.Error(), ca) || strings.Contains(err.Error(), pw) {
		t.Errorf("renewTLS with the CA file gone: %v; want an error naming %s and not the password", err, ca)
	}
}

// Every connection attempt of a multi-host DSN with sslmode=prefer (one
// with TLS, one without, for each host) gets its own TLS settings back;
// a parse that gives other hosts or modes fails the connection instead.
func TestRenewTLSFallbacks(t *testing.T) {
	cc, err := pgx.ParseConfig("postgres://u@127.0.0.1:1,127.0.0.2:2/d?sslmode=prefer")
	if err != nil {
		t.Fatal(err)
	}
	shape := func() string {
		var b strings.Builder
		for i, c := range append([]*pgconn.FallbackConfig{{Host: cc.Host, Port: cc.Port, TLSConfig: cc.TLSConfig}}, cc.Fallbacks...) {
			fmt.Fprintf(&b, "%d %s:%d tls %t; ", i, c.Host, c.Port, c.TLSConfig != nil)
		}
		return b.String()
	}
	before := shape()
	if err := renewTLS(cc); err != nil {
		t.Fatal(err)
	}
	if after := shape(); after != before || len(cc.Fallbacks) != 3 {
		t.Errorf("attempts after renewTLS: %s; want %s (4 attempts)", after, before)
	}
	// prefer skips verification; as if a service file now said
	// verify-full for the first host, or gave another host list:
	cc.TLSConfig.InsecureSkipVerify = false
	if err := renewTLS(cc); err == nil || !strings.Contains(err.Error(), "restart tidemark") {
		t.Errorf("renewTLS with another TLS verification: %v; want an error that says to restart", err)
	}
	cc.TLSConfig.InsecureSkipVerify = true
	cc.Fallbacks[1].Host = "127.0.0.9"
	if err := renewTLS(cc); err == nil || !strings.Contains(err.Error(), "restart tidemark") {
		t.Errorf("renewTLS with another host list: %v; want an error that says to restart", err)
	}
}
