package metrics_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/metrics"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// gather returns every sample as "name{labels}" -> value, with the
// connector label left out.
func gather(t *testing.T, m *metrics.Metrics) map[string]float64 {
	t.Helper()
	fams, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, s := range f.GetMetric() {
			name := f.GetName() + labels(s)
			switch {
			case s.Counter != nil:
				out[name] = s.Counter.GetValue()
			case s.Gauge != nil:
				out[name] = s.Gauge.GetValue()
			case s.Histogram != nil:
				out[f.GetName()+"_count"+labels(s)] = float64(s.Histogram.GetSampleCount())
				out[f.GetName()+"_sum"+labels(s)] = s.Histogram.GetSampleSum()
			}
		}
	}
	return out
}

func labels(s *dto.Metric) string {
	var parts []string
	for _, l := range s.GetLabel() {
		if l.GetName() == "connector" || l.GetName() == "version" || l.GetName() == "goversion" {
			continue
		}
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	if len(parts) == 0 {
		return ""
	}
	return "{" + strings.Join(parts, ",") + "}"
}

func TestObserverSeries(t *testing.T) {
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	m := metrics.New(metrics.Config{Connector: "orders", Now: clk.now})

	got := gather(t, m)
	for _, name := range []string{"tidemark_rows_published_total", "tidemark_retries_total{reason=kafka}", "tidemark_stops_total{kind=safety_stop}", "tidemark_ready"} {
		if _, ok := got[name]; !ok {
			t.Errorf("fresh registry lacks %s", name)
		}
	}
	if _, ok := got["tidemark_watermark_lag_seconds"]; ok {
		t.Errorf("watermark lag exported before any watermark is known")
	}

	m.ObservePage(20*time.Millisecond, 3)
	m.ObserveReread(2, 1)
	m.ObserveFutureDated(4)
	m.ObservePage(10*time.Millisecond, 0)
	wm := clk.now().Add(-90 * time.Second)
	m.ObserveCommit(connector.CommitInfo{Seq: 1, Took: 5 * time.Millisecond, Span: 40 * time.Millisecond,
		Records: 3, Pages: 2, Raw: 3, Published: 3, Tombstones: 1, Watermark: wm,
		NewestUpdatedAt: wm, CommittedAt: clk.now(), PassEnded: true})
	m.ObserveCommit(connector.CommitInfo{Seq: 2, Watermark: wm, CommittedAt: clk.now(), PassEnded: true, HeadPass: true})
	m.ObserveCommit(connector.CommitInfo{Seq: 3, Watermark: wm, CommittedAt: clk.now(), HeadPass: true}) // not a pass end
	m.ObserveRetry("kafka")
	m.ObserveRetry("something new")
	m.ObserveAbort()
	clk.add(30 * time.Second)

	got = gather(t, m)
	want := map[string]float64{
		"tidemark_rows_read_total":                          3,
		"tidemark_rows_published_total":                     3,
		"tidemark_rows_tombstoned_total":                    1,
		"tidemark_transactions_committed_total":             3,
		"tidemark_transactions_aborted_total":               1,
		"tidemark_passes_completed_total":                   2,
		"tidemark_head_passes_total":                        1,
		"tidemark_page_fetch_duration_seconds_count":        2,
		"tidemark_transaction_duration_seconds_count":       1,
		"tidemark_commit_duration_seconds_count":            3,
		"tidemark_source_to_topic_latency_seconds_sum":      90,
		"tidemark_retries_total{reason=kafka}":              1,
		"tidemark_retries_total{reason=other}":              1,
		"tidemark_watermark_lag_seconds":                    120,
		"tidemark_checkpoint_age_seconds":                   30,
		"tidemark_caught_up_age_seconds":                    30,
		"tidemark_watermark_timestamp_seconds":              float64(wm.Unix()),
		"tidemark_ready":                                    0, // the kafka retry has not been followed by a commit
		"tidemark_stops_total{kind=fenced}":                 0,
		"tidemark_build_info":                               1,
		"tidemark_verify_runs_total{result=ok}":             0,
		"tidemark_transaction_duration_seconds_sum":         0.04,
		"tidemark_source_to_topic_latency_seconds_count":    1,
		"tidemark_page_fetch_duration_seconds_sum":          0.03,
		"tidemark_rows_deduped_total":                       1,
		"tidemark_rows_reread_total":                        2,
		"tidemark_rows_future_dated_total":                  4,
		"tidemark_sweeps_total":                             0,
		"tidemark_stops_total{kind=fatal}":                  0,
		"tidemark_retries_total{reason=source}":             0,
		"tidemark_verify_runs_total{result=failed}":         0,
		"tidemark_retries_total{reason=checkpoint}":         0,
		"tidemark_stops_total{kind=safety_stop}":            0,
		"tidemark_sweep_repaired_total":                     0,
		"tidemark_sweep_tombstoned_total":                   0,
		"tidemark_last_commit_timestamp_seconds":            float64(clk.now().Add(-30 * time.Second).Unix()),
		"tidemark_commit_duration_seconds_sum":              0.005,
		"tidemark_transactions_committed_total{reason=xyz}": -1, // must not exist
	}
	for name, w := range want {
		g, ok := got[name]
		if w == -1 {
			if ok {
				t.Errorf("%s exists", name)
			}
			continue
		}
		if !ok {
			t.Errorf("%s missing", name)
		} else if diff := g - w; diff > 1e-9 || diff < -1e-9 {
			t.Errorf("%s = %v, want %v", name, g, w)
		}
	}

	m.SweepResult(2, 1)
	m.VerifyResult(false, 1, 2, 3)
	got = gather(t, m)
	for name, w := range map[string]float64{
		"tidemark_sweeps_total": 1, "tidemark_sweep_tombstoned_total": 2, "tidemark_sweep_repaired_total": 1,
		"tidemark_verify_runs_total{result=failed}": 1, "tidemark_verify_discrepancies{kind=extra}": 2,
		"tidemark_verify_discrepancies{kind=mismatched}": 3, "tidemark_verify_last_ok": 0,
	} {
		if got[name] != w {
			t.Errorf("%s = %v, want %v", name, got[name], w)
		}
	}
	if _, ok := got["tidemark_last_sweep_timestamp_seconds"]; !ok {
		t.Errorf("no last sweep timestamp")
	}
}

func TestCaughtUpUndoneByAbort(t *testing.T) {
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	m := metrics.New(metrics.Config{Connector: "c", Now: clk.now})
	m.ObservePage(time.Millisecond, 0)
	clk.add(time.Minute)
	m.ObservePage(time.Millisecond, 5)
	m.ObservePage(time.Millisecond, 0) // end, but the commit fails
	m.ObserveAbort()
	clk.add(time.Minute)
	if got := gather(t, m)["tidemark_caught_up_age_seconds"]; got != 120 {
		t.Errorf("caught up age %v, want 120 (the aborted end does not count)", got)
	}
}

func TestReadiness(t *testing.T) {
	clk := &clock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
	var kafkaErr error
	m := metrics.New(metrics.Config{Connector: "c", Now: clk.now, MaxLag: time.Minute, CheckInterval: time.Nanosecond})
	m.AddCheck("kafka", func(context.Context) error { return kafkaErr })
	ctx := context.Background()

	expect := func(want bool, reason string) {
		t.Helper()
		clk.add(time.Millisecond) // let the checks run again
		ok, reasons := m.Ready(ctx)
		if ok != want {
			t.Fatalf("ready = %v, want %v (%q)", ok, want, reasons)
		}
		if reason != "" && !strings.Contains(strings.Join(reasons, "\n"), reason) {
			t.Fatalf("reasons %q lack %q", reasons, reason)
		}
	}
	expect(false, "starting")
	m.ObserveCheckpoint(time.Time{}, time.Time{})
	expect(false, "initial load in progress")
	m.ObservePage(time.Millisecond, 0)
	expect(true, "")
	clk.add(2 * time.Minute)
	expect(false, "lag 2m0s exceeds 1m0s")
	m.ObservePage(time.Millisecond, 0)
	expect(true, "")
	kafkaErr = errors.New("broker unreachable")
	expect(false, "kafka check failed: broker unreachable")
	kafkaErr = nil
	expect(true, "")
	m.ObserveRetry("source")
	expect(false, "source:")
	m.ObservePage(time.Millisecond, 0)
	expect(true, "")
	m.ObserveStop("safety_stop")
	expect(false, "safety stop")
	m.ObservePage(time.Millisecond, 0)
	expect(false, "safety stop") // a stop is final
}

func TestServer(t *testing.T) {
	m := metrics.New(metrics.Config{Connector: "c"})
	srv, err := m.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/healthz"); code != 200 {
		t.Errorf("/healthz %d", code)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, "starting") {
		t.Errorf("/readyz %d %q", code, body)
	}
	m.ObservePage(time.Millisecond, 0)
	if code, body := get("/readyz"); code != 200 {
		t.Errorf("/readyz %d %q", code, body)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `tidemark_rows_read_total{connector="c"} 0`) || !strings.Contains(body, "go_goroutines") {
		t.Errorf("/metrics %d:\n%s", code, body)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestNotifySeries(t *testing.T) {
	m := metrics.New(metrics.Config{Connector: "c"})
	var notes, again atomic.Int64
	m.ObserveNotify(notes.Load, again.Load)
	notes.Add(7)
	again.Add(2)
	got := gather(t, m)
	for name, want := range map[string]float64{
		"tidemark_notify_notifications_total": 7,
		"tidemark_notify_reconnects_total":    2,
	} {
		if got[name] != want {
			t.Errorf("%s = %v, want %v", name, got[name], want)
		}
	}
}
