package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/test/harness"
)

// freeAddr returns a 127.0.0.1 address with a port that was free a moment
// ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func httpGet(url string) (int, string, error) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sample returns the value of the series `name{connector="cli-sync"...}`
// in a scrape (the first match), and whether it is there.
func sample(scrape, name string) (float64, bool) {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? ([0-9.eE+-]+|NaN)$`)
	m := re.FindStringSubmatch(scrape)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(m[2], 64)
	return v, err == nil
}

// withMetrics appends a metrics section to a config file.
func withMetrics(t *testing.T, path, section string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(filepath.Dir(path), "m-"+filepath.Base(path))
	if err := os.WriteFile(out, append(b, []byte(section)...), 0o600); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCLIMetricsAfterSync runs `tidemark run` with the metrics server on,
// scrapes /metrics once the table is synced and checks the key series;
// then a run with a changed configuration stops with a safety stop, and
// /readyz answers 503 while metrics.hold_on_stop keeps the server up.
func TestCLIMetricsAfterSync(t *testing.T) {
	w := newCLIWorld(t)
	addr := freeAddr(t)
	cfg := withMetrics(t, w.config("tidemark.yaml", "items", ""), fmt.Sprintf("metrics:\n  listen: %s\n  ready_max_lag: 1h\n", addr))

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	var stderr string
	go func() {
		code, _, e := w.cli(ctx, "run", "--config", cfg)
		stderr = e
		done <- code
	}()

	var scrape string
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, body, err := httpGet("http://" + addr + "/metrics")
		if err == nil {
			if v, _ := sample(body, "tidemark_rows_published_total"); v == 7 {
				// Caught up is seen at the empty page, before the
				// commit that ends the pass: wait for that commit too.
				_, caught := sample(body, "tidemark_caught_up_age_seconds")
				_, committed := sample(body, "tidemark_checkpoint_age_seconds")
				if caught && committed {
					scrape = body
					break
				}
			}
		}
		if time.Now().After(deadline) {
			cancel()
			t.Fatalf("no scrape with 7 rows published within 30s; last error %v, body:\n%s\nstderr:\n%s", err, body, stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	for name, check := range map[string]func(float64) bool{
		"tidemark_rows_published_total":                         func(v float64) bool { return v == 7 },
		"tidemark_rows_read_total":                              func(v float64) bool { return v >= 7 },
		"tidemark_transactions_committed_total":                 func(v float64) bool { return v > 0 },
		"tidemark_transactions_aborted_total":                   func(v float64) bool { return v == 0 },
		"tidemark_passes_completed_total":                       func(v float64) bool { return v >= 1 },
		"tidemark_page_fetch_duration_seconds_count":            func(v float64) bool { return v >= 4 }, // 7 rows at page_size 2 + the empty page
		"tidemark_transaction_duration_seconds_count":           func(v float64) bool { return v > 0 },
		"tidemark_source_to_topic_latency_seconds_count":        func(v float64) bool { return v > 0 },
		"tidemark_watermark_lag_seconds":                        func(v float64) bool { return v > 0 }, // rows are from 2024
		"tidemark_checkpoint_age_seconds":                       func(v float64) bool { return v >= 0 && v < 60 },
		"tidemark_caught_up_age_seconds":                        func(v float64) bool { return v >= 0 && v < 60 },
		"tidemark_stops_total":                                  func(v float64) bool { return v == 0 },
		`tidemark_check_up{check="kafka",connector="cli-sync"}`: nil,
	} {
		if check == nil {
			continue
		}
		v, ok := sample(scrape, name)
		if !ok || !check(v) {
			t.Errorf("%s = %v (present %v)", name, v, ok)
		}
	}
	if !strings.Contains(scrape, `tidemark_rows_published_total{connector="cli-sync"} 7`) {
		t.Errorf("series lack the connector label:\n%s", scrape)
	}
	if code, body, err := httpGet("http://" + addr + "/healthz"); err != nil || code != 200 {
		t.Errorf("/healthz: %d %v %s", code, err, body)
	}
	// Readiness: the checks (source, kafka) pass and the lag is under 1h
	// because the pass reached the end of the table just now.
	waitFor(t, func() (bool, string) {
		code, body, err := httpGet("http://" + addr + "/readyz")
		return err == nil && code == 200, fmt.Sprint(code, body, err)
	})
	_, scrape, _ = httpGet("http://" + addr + "/metrics")
	for _, want := range []string{`tidemark_check_up{check="kafka",connector="cli-sync"} 1`, `tidemark_check_up{check="source",connector="cli-sync"} 1`, `tidemark_ready{connector="cli-sync"} 1`} {
		if !strings.Contains(scrape, want) {
			t.Errorf("scrape lacks %s", want)
		}
	}
	cancel()
	if code := <-done; code != exitOK {
		t.Fatalf("run exit %d\n%s", code, stderr)
	}
	if _, _, err := httpGet("http://" + addr + "/healthz"); err == nil {
		t.Errorf("the metrics server still answers after run returned")
	}

	// A changed configuration is a safety stop: /readyz flips to 503 and
	// says why while hold_on_stop keeps the process serving.
	addr2 := freeAddr(t)
	changed := withMetrics(t, w.config("changed.yaml", "items", "  columns: [id, updated_at, v]"),
		fmt.Sprintf("metrics:\n  listen: %s\n  hold_on_stop: 1m\n", addr2))
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	done2 := make(chan int, 1)
	var stderr2 harness.SyncBuffer
	go func() {
		code, _, e := w.cli(ctx2, "run", "--config", changed)
		stderr2.Write([]byte(e))
		done2 <- code
	}()
	var body string
	waitFor(t, func() (bool, string) {
		var code int
		var err error
		code, body, err = httpGet("http://" + addr2 + "/readyz")
		return err == nil && code == 503 && strings.Contains(body, "safety stop"), fmt.Sprint(code, body, err)
	})
	_, scrape, _ = httpGet("http://" + addr2 + "/metrics")
	if v, _ := sample(scrape, `tidemark_stops_total{connector="cli-sync",kind="safety_stop"}`); v != 1 {
		t.Errorf("safety stop not counted:\n%s", scrape)
	}
	if v, ok := sample(scrape, "tidemark_ready"); !ok || v != 0 {
		t.Errorf("tidemark_ready = %v (present %v) after a safety stop", v, ok)
	}
	cancel2() // ends the hold
	if code := <-done2; code != exitDecision {
		t.Fatalf("changed config: exit %d, want %d\n%s", code, exitDecision, stderr2.String())
	}
	if !strings.Contains(stderr2.String(), `action="either restore the previous configuration`) {
		t.Errorf("the final log line lacks the action:\n%s", stderr2.String())
	}
}

func waitFor(t *testing.T, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ok, last := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within 30s; last: %s", last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
