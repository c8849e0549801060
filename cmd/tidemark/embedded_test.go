package main

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/test/harness"
)

// produceOne creates topic and writes one record to it at addr.
func produceOne(t *testing.T, addr, topic, value string) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, -1, nil, topic); err != nil {
		t.Fatal(err)
	}
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: []byte(value)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
}

// Item 8: the embedded broker's directories are 0700 and its files 0600,
// including those of an older data_dir made before.
func TestEmbeddedFilesPrivate(t *testing.T) {
	dataDir := t.TempDir()
	old := filepath.Join(dataDir, "kafka", "data")
	if err := os.MkdirAll(old, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(old, "left-over"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	emb, addrs, err := startEmbedded(dataDir, "", log)
	if err != nil {
		t.Fatal(err)
	}
	produceOne(t, addrs[0], "private", "v")
	emb.Close()
	n := 0
	err = filepath.WalkDir(filepath.Join(dataDir, "kafka"), func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		want := fs.FileMode(0o600)
		if d.IsDir() {
			want = 0o700
		}
		if got := info.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v, want %v", p, got, want)
		}
		n++
		return nil
	})
	if err != nil || n < 5 {
		t.Fatalf("walked %d entries: %v", n, err)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// `tidemark broker` serves the embedded data on embedded.listen, for kcat
// and friends; what was written is there after a restart.
func TestBrokerCommand(t *testing.T) {
	dir := t.TempDir()
	addr := freePort(t)
	cfg := filepath.Join(dir, "tidemark.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("name: b\ndata_dir: %s\nembedded:\n  listen: %s\nsource:\n  dsn: postgres://u@127.0.0.1:1/db\n  table: t\nlog:\n  format: text\n", filepath.Join(dir, "data"), addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	serve := func() (stop func() string) {
		ctx, cancel := context.WithCancel(context.Background())
		var out, errOut harness.SyncBuffer
		done := make(chan int, 1)
		go func() { done <- run(ctx, []string{"broker", "--config", cfg}, &out, &errOut) }()
		for deadline := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), addr); {
			if time.Now().After(deadline) {
				cancel()
				t.Fatalf("tidemark broker did not say it serves %s:\n%s\n%s", addr, out.String(), errOut.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
		return func() string {
			cancel()
			if code := <-done; code != exitOK {
				t.Errorf("tidemark broker: exit %d\n%s", code, errOut.String())
			}
			return out.String()
		}
	}
	stop := serve()
	if b, err := os.ReadFile(filepath.Join(dir, "data", "kafka", "broker.addr")); err != nil || strings.TrimSpace(string(b)) != addr {
		t.Errorf("broker.addr holds %q (%v), want %s", b, err, addr)
	}
	produceOne(t, addr, "inspect", "kept")
	out := stop()
	if !regexp.MustCompile(`kcat -b ` + regexp.QuoteMeta(addr)).MatchString(out) {
		t.Errorf("the broker command does not say how to attach kcat:\n%s", out)
	}
	stop = serve()
	defer stop()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("inspect"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	fetches := cl.PollFetches(ctx)
	if recs := fetches.Records(); len(recs) != 1 || string(recs[0].Value) != "kept" {
		t.Errorf("after a restart the topic holds %d records (%v)", len(recs), fetches.Errors())
	}
	for _, bad := range []string{"0.0.0.0:9092", "10.1.2.3:9092", "9092"} {
		if _, err := LoadConfig("", func(string) string { return "" }, []string{"name=n", "source.dsn=host=h", "source.table=t", "embedded.listen=" + bad}); err == nil || !strings.Contains(err.Error(), "embedded.listen") {
			t.Errorf("embedded.listen=%s: %v, want a refusal", bad, err)
		}
	}
}

// `tidemark broker` needs only where the data is: a configuration without
// name, source or topic serves it.
func TestBrokerCommandNeedsOnlyDataDir(t *testing.T) {
	dir := t.TempDir()
	addr := freePort(t)
	cfg := filepath.Join(dir, "broker.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("data_dir: %s\nembedded:\n  listen: %s\nlog:\n  format: text\n", filepath.Join(dir, "data"), addr)), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out, errOut harness.SyncBuffer
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"broker", "--config", cfg}, &out, &errOut) }()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(out.String(), addr) {
		select {
		case code := <-done:
			t.Fatalf("tidemark broker with only data_dir: exit %d\n%s\n%s", code, out.String(), errOut.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("tidemark broker did not say it serves %s:\n%s\n%s", addr, out.String(), errOut.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Errorf("tidemark broker: exit %d\n%s", code, errOut.String())
	}
	// Keys it does not use are not checked, but a misspelt one still is.
	if err := os.WriteFile(cfg, []byte("data_dir: d\nsorce:\n  table: t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, _, e := edgeCLI(t, nil, "broker", "--config", cfg); code != exitConfig || !strings.Contains(e, "sorce") {
		t.Errorf("broker with a misspelt key: exit %d\n%s", code, e)
	}
}
