package main

// Sharp edges of the CLI (issue 14): secrets in DSN errors, exit codes and
// messages, flags and output. Tests that need no PostgreSQL or Kafka write
// configs that point at closed loopback ports: nothing is contacted before
// the failure under test.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// edgeCLI runs the CLI in-process with env (nil: none) and returns the
// exit code and both outputs.
func edgeCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var o, e syncBuffer
	a := func(k string) string { return env[k] }
	code := runEnv(context.Background(), args, &o, &e, a, func() []string {
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		return kv
	})
	return code, o.String(), e.String()
}

// writeEdgeConfig writes a postgres config whose DSN is dsn and whose
// brokers are never contacted.
func writeEdgeConfig(t *testing.T, dir, name, dsn, extra string) string {
	t.Helper()
	text := fmt.Sprintf("name: edge\nsource:\n  dsn: %q\n  table: items\n%skafka:\n  brokers: [127.0.0.1:1]\nlog:\n  format: text\n", dsn, extra)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const edgeSecret = "Pw-S3cret-9"

// Item 1: a DSN the driver cannot parse exits 2 naming the part that is
// wrong, and no output holds the password, for every command that opens a
// DSN: run, check, verify, sweep and feed serve (source.dsn), replica
// --target-dsn and verify --replica-dsn.
func TestDSNParseErrorsNeverPrintThePassword(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "feed.key")
	if err := os.WriteFile(key, []byte("k7Qp2Zr9XvB4mN8sT1wY6cE3hJ5uL0aD"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := writeEdgeConfig(t, dir, "good.yaml", "postgres://u@127.0.0.1:1/db?sslmode=disable", "")
	for name, tc := range map[string]struct{ dsn, part string }{
		"spaces around =":  {"host=127.0.0.1 password = " + edgeSecret + " sslmode=bogus", `keyword "sslmode"`},
		"space after =":    {"host=127.0.0.1 password= " + edgeSecret + " sslmode=bogus", `keyword "sslmode"`},
		"quoted with \\'":  {`host=127.0.0.1 password='Pw-S3cret\'9' sslmode=bogus`, `keyword "sslmode"`},
		"unquoted space":   {"host=127.0.0.1 password=Pw S3cret-9 dbname=x", `keyword "password"`},
		"URL, unencoded @": {"postgres://u:Pw@S3cret-9@127.0.0.1/db", "user info"},
		"URL, bad sslmode": {"postgres://u:" + edgeSecret + "@127.0.0.1/db?sslmode=bogus", `"sslmode"`},
	} {
		t.Run(name, func(t *testing.T) {
			bad := writeEdgeConfig(t, dir, "bad.yaml", tc.dsn, "")
			for _, args := range [][]string{
				{"run", "--once", "--config", bad},
				{"check", "--config", bad},
				{"verify", "--config", bad},
				{"sweep", "--config", bad},
				{"feed", "serve", "--config", bad, "--listen", "127.0.0.1:0", "--hmac-key-file", key},
				{"replica", "--config", good, "--target-table", "r", "--target-dsn", tc.dsn},
				{"verify", "--config", good, "--replica-table", "r", "--replica-dsn", tc.dsn},
			} {
				code, out, errOut := edgeCLI(t, nil, args...)
				if code != exitConfig {
					t.Errorf("%v: exit %d, want %d\n%s", args, code, exitConfig, errOut)
				}
				for _, frag := range []string{"S3cret", "Pw-", "Pw@"} {
					if strings.Contains(out+errOut, frag) {
						t.Errorf("%v: the output holds the password (%q):\n%s%s", args, frag, out, errOut)
					}
				}
				if !strings.Contains(errOut, tc.part) {
					t.Errorf("%v: stderr does not name %s:\n%s", args, tc.part, errOut)
				}
			}
		})
	}
}
