package main

// Start-up of the one-shot commands (README, Exit codes): verify, status and
// ledger wait for PostgreSQL and Kafka like `run --once`, bounded by
// sync.once_retry_timeout; check is a diagnostic and reports at once what it
// could not reach.

import (
	"context"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// lateProxy returns a loopback address that refuses connections until
// delay has passed and then forwards each to target: a server that is
// still starting.
func lateProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	addr := freePort(t)
	var mu sync.Mutex
	var ln net.Listener
	closed := false
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		closed = true
		if ln != nil {
			ln.Close()
		}
	})
	go func() {
		time.Sleep(delay)
		mu.Lock()
		if closed {
			mu.Unlock()
			return
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			mu.Unlock()
			t.Errorf("late proxy: %v", err)
			return
		}
		ln = l
		mu.Unlock()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				go func() { _, _ = io.Copy(up, c); up.Close() }()
				_, _ = io.Copy(c, up)
			}()
		}
	}()
	return addr
}

// TestCLIOneShotCommandsWaitAtStartUp: status, ledger and verify started
// while PostgreSQL and Kafka do not answer yet wait for them (logging what
// they wait for) and then succeed.
func TestCLIOneShotCommandsWaitAtStartUp(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx := context.Background()
	if code, out, errOut := w.cli(ctx, "run", "--config", cfg, "--once"); code != exitOK {
		t.Fatalf("run --once: exit %d\n%s\n%s", code, out, errOut)
	}
	text, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(w.dsn)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.kafka.Brokers) != 1 {
		t.Skipf("needs one seed broker, have %v", w.kafka.Brokers)
	}
	// late writes the configuration with both addresses behind proxies
	// that answer only after a second and a half.
	late := func(name string) string {
		pg := lateProxy(t, u.Host, 1500*time.Millisecond)
		kafka := lateProxy(t, w.kafka.Brokers[0], 1500*time.Millisecond)
		s := strings.Replace(string(text), u.Host, pg, 1)
		s = strings.Replace(s, "brokers: ["+w.kafka.Brokers[0]+"]", "brokers: ["+kafka+"]", 1)
		return writeFile(t, w.dir, name, s)
	}
	for _, tc := range []struct {
		args []string
		out  string
		wait string
	}{
		{[]string{"status"}, "committed:", "start-up: waiting for Kafka"},
		{[]string{"ledger"}, "started", "start-up: waiting for Kafka"},
		{[]string{"verify"}, "MATCH", "start-up: waiting for the source"},
	} {
		args := append(tc.args, "--config", late(tc.args[0]+".yaml"))
		began := time.Now()
		code, out, errOut := w.cli(ctx, args...)
		if code != exitOK || !strings.Contains(out, tc.out) {
			t.Errorf("%v while the servers start: exit %d\n%s\n%s", args, code, out, errOut)
			continue
		}
		if !strings.Contains(errOut, tc.wait) || time.Since(began) < time.Second {
			t.Errorf("%v: it did not wait (%s), or said nothing of it:\n%s", args, time.Since(began), errOut)
		}
	}
}

// TestCLIOneShotCommandsGiveUp: status, ledger and verify give up on a
// server that never answers after sync.once_retry_timeout, with exit 1
// and a message that says so.
func TestCLIOneShotCommandsGiveUp(t *testing.T) {
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db?sslmode=disable", "sync:\n  once_retry_timeout: 1s\n")
	for _, cmd := range []string{"status", "ledger", "verify"} {
		code, _, errOut := edgeCLI(t, nil, cmd, "--config", cfg)
		if code != exitFailure || !strings.Contains(errOut, "did not answer within 1s") || !strings.Contains(errOut, "after retries") {
			t.Errorf("%s against closed ports: exit %d, want 1 after the retry timeout:\n%s", cmd, code, errOut)
		}
	}
}

// TestCLICheckDoesNotWait: check reports at once what it could not reach,
// and does not claim to have retried.
func TestCLICheckDoesNotWait(t *testing.T) {
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db?sslmode=disable", "")
	began := time.Now()
	code, _, errOut := edgeCLI(t, nil, "check", "--config", cfg)
	if code != exitFailure || strings.Contains(errOut, "after retries") || !strings.Contains(errOut, "check does not wait") ||
		!strings.Contains(errOut, "could not reach the source (source.dsn)") {
		t.Errorf("check against a closed port: exit %d\n%s", code, errOut)
	}
	if d := time.Since(began); d > 10*time.Second {
		t.Errorf("check took %s against a closed port; it should fail fast", d)
	}
}
