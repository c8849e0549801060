package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// TestCLINotifyWakesRun: on a table whose name holds quotes and a space,
// with a channel holding quotes, a backslash, a dollar-quote tag and SQL,
// `check --print-notify-sql` prints SQL that installs as printed; `check`
// warns before it is installed and finds it after; then `run` with a poll
// interval of an hour publishes each committed row within a second: the
// notification woke it.
func TestCLINotifyWakesRun(t *testing.T) {
	w := newCLIWorld(t)
	ctx := context.Background()
	table := `we"ird ta'ble`
	channel := `it's "odd" $tidemark$ \'); --`
	ident := pgx.Identifier{table}.Sanitize()
	w.db.Exec(t, `CREATE TABLE `+ident+` (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT clock_timestamp(), deleted_at timestamptz, v text);
		CREATE INDEX ON `+ident+` (updated_at, id)`)
	insert := func(id int) {
		w.db.Exec(t, `INSERT INTO `+ident+` (id, v) VALUES ($1, $2)`, id, fmt.Sprintf("v%d", id))
	}
	for id := 1; id <= 3; id++ {
		insert(id)
	}
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) } // a JSON string is a YAML string
	cfg := w.config("notify.yaml", q(table), "  notify: "+q(channel))

	code, out, errOut := w.cli(ctx, "check", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "warn  notify") || !strings.Contains(out, "--print-notify-sql") {
		t.Errorf("check without the trigger: exit %d, want 0 and a notify warning naming --print-notify-sql\n%s\n%s", code, out, errOut)
	}
	code, sql, errOut := w.cli(ctx, "check", "--config", cfg, "--print-notify-sql")
	if code != exitOK || !strings.Contains(sql, "FOR EACH STATEMENT") || !strings.Contains(sql, "pg_notify(") {
		t.Fatalf("check --print-notify-sql: exit %d\n%s\n%s", code, sql, errOut)
	}
	code, dsql, errOut := w.cli(ctx, "check", "--config", cfg, "--print-notify-sql", "--notify-trigger", "deferred")
	if code != exitOK || !strings.Contains(dsql, "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW") || !strings.Contains(dsql, "pg_try_advisory_xact_lock") {
		t.Fatalf("check --print-notify-sql --notify-trigger deferred: exit %d\n%s\n%s", code, dsql, errOut)
	}
	if code, out, errOut := w.cli(ctx, "check", "--config", cfg, "--print-notify-sql", "--notify-trigger", "every"); code != exitConfig ||
		!strings.Contains(errOut, "--notify-trigger") || !strings.Contains(errOut, "statement, deferred") {
		t.Errorf("check --notify-trigger every: exit %d, want %d and the kinds named\n%s\n%s", code, exitConfig, out, errOut)
	}
	if code, out, errOut := w.cli(ctx, "check", "--config", cfg, "--notify-trigger", "deferred"); code != exitConfig || !strings.Contains(errOut, "add --print-notify-sql") {
		t.Errorf("check --notify-trigger without --print-notify-sql: exit %d, want %d and the missing flag named\n%s\n%s", code, exitConfig, out, errOut)
	}
	if _, err := w.db.Pool.Exec(ctx, sql); err != nil {
		t.Fatalf("the printed SQL does not install: %v\n%s", err, sql)
	}
	code, out, errOut = w.cli(ctx, "check", "--config", cfg)
	if code != exitOK || !strings.Contains(out, "ok    notify") {
		t.Errorf("check with the trigger: exit %d, want 0 and an ok notify line\n%s\n%s", code, out, errOut)
	}

	addr := freeAddr(t)
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		code     int
		out, err string
	}
	done := make(chan result, 1)
	var stderr harness.SyncBuffer
	go func() {
		var o harness.SyncBuffer
		code := run(rctx, []string{"run", "--config", cfg, "--sync.poll_interval", "1h", "--log.level", "info", "--metrics.listen", addr}, &o, &stderr)
		done <- result{code, o.String(), stderr.String()}
	}()
	has := func(key string) bool {
		st, err := fold.Map(ctx, w.opts(), "items-topic")
		if err != nil {
			t.Fatal(err)
		}
		_, ok := st.Live[key]
		return ok
	}
	waitKey := func(key string, d time.Duration) time.Duration {
		start := time.Now()
		for !has(key) {
			if time.Since(start) > d {
				t.Fatalf("row %s not in the topic %s after its commit (poll interval 1h); run's log:\n%s", key, d, stderr.String())
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	waitKey("3", 30*time.Second) // the initial load
	var took []time.Duration
	for id := 4; id <= 8; id++ {
		time.Sleep(50 * time.Millisecond) // past source.notify_min_gap: the run is idle
		insert(id)
		// 10 s, far below the poll interval of an hour, proves the
		// wake-up; tighter would only measure the CI machine's load.
		took = append(took, waitKey(fmt.Sprint(id), 10*time.Second))
	}
	t.Logf("commit -> in the topic, poll interval 1h: %v", took)
	_, body, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := sample(body, "tidemark_notify_notifications_total"); !ok || v < 5 {
		t.Errorf("tidemark_notify_notifications_total = %v (present %v), want at least 5 (one per insert)", v, ok)
	}
	if _, ok := sample(body, "tidemark_notify_reconnects_total"); !ok {
		t.Error("no tidemark_notify_reconnects_total")
	}
	cancel()
	r := <-done
	w.noSecret("run", r.out, r.err)
	if r.code != exitOK {
		t.Fatalf("run: exit %d\n%s\n%s", r.code, r.out, r.err)
	}
	if !strings.Contains(r.err, "listening for change notifications") {
		t.Errorf("run did not say it listens:\n%s", r.err)
	}
	w.assertTopicEqualsTable(table)
}

// TestCLINotifyRefusals: source.notify and source.notify_min_gap are
// refused with source.kind http, naming the key; a channel PostgreSQL
// cannot listen on as given is refused saying why; --print-notify-sql
// without source.notify names it. Each exits 2.
func TestCLINotifyRefusals(t *testing.T) {
	dir := t.TempDir()
	http := "name: h\nsource:\n  kind: http\n  dsn: http://127.0.0.1:1/changes\n%skafka:\n  brokers: [127.0.0.1:1]\n  topic: t\n"
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"http_notify", []string{"run", "--config", writeFile(t, dir, "h1.yaml", fmt.Sprintf(http, "  notify: changes\n"))},
			[]string{"source.notify", "only used with source.kind postgres"}},
		{"http_min_gap", []string{"check", "--config", writeFile(t, dir, "h2.yaml", fmt.Sprintf(http, "  notify_min_gap: 50ms\n"))},
			[]string{"source.notify_min_gap", "only used with source.kind postgres"}},
		{"line_break", []string{"run", "--config", writeEdgeConfig(t, dir, "p1.yaml", "postgres://u@127.0.0.1:1/d", "  notify: \"a\\nb\"\n")},
			[]string{"source.notify", "control character"}},
		{"too_long", []string{"check", "--print-notify-sql", "--config", writeEdgeConfig(t, dir, "p2.yaml", "postgres://u@127.0.0.1:1/d", "  notify: "+strings.Repeat("x", 64)+"\n")},
			[]string{"source.notify", "at most 63 bytes"}},
		{"negative_gap", []string{"run", "--config", writeEdgeConfig(t, dir, "p3.yaml", "postgres://u@127.0.0.1:1/d", "  notify: c\n  notify_min_gap: -1s\n")},
			[]string{"source.notify_min_gap", "negative"}},
		{"negative_lookback", []string{"run", "--config", writeEdgeConfig(t, dir, "p6.yaml", "postgres://u@127.0.0.1:1/d", "  notify: c\n  notify_lookback: -100ms\n")},
			[]string{"source.notify_lookback", "negative", "0s"}},
		{"http_lookback", []string{"check", "--config", writeFile(t, dir, "h3.yaml", fmt.Sprintf(http, "  notify_lookback: 50ms\n"))},
			[]string{"source.notify_lookback", "only used with source.kind postgres"}},
		{"print_without_notify", []string{"check", "--print-notify-sql", "--config", writeEdgeConfig(t, dir, "p4.yaml", "postgres://u@127.0.0.1:1/d", "")},
			[]string{"source.notify", "is not set"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := edgeCLI(t, nil, tc.args...)
			if code != exitConfig {
				t.Fatalf("exit %d, want %d\n%s\n%s", code, exitConfig, out, errOut)
			}
			for _, s := range tc.want {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr does not say %q:\n%s", s, errOut)
				}
			}
		})
	}
	// --print-notify-sql connects to nothing: the DSN and brokers are
	// unreachable here.
	code, out, errOut := edgeCLI(t, nil, "check", "--print-notify-sql", "--config",
		writeEdgeConfig(t, dir, "p5.yaml", "postgres://u@127.0.0.1:1/d", "  schema: s\n  notify: orders_changes\n"))
	if code != exitOK || !strings.Contains(out, `ON "s"."items"`) || !strings.Contains(out, `pg_notify('orders_changes', '')`) {
		t.Errorf("--print-notify-sql: exit %d\n%s\n%s", code, out, errOut)
	}
}

// TestNotifyWarnings: settings that do nothing are warned about.
func TestNotifyWarnings(t *testing.T) {
	c := mustLoad(t, writeConfig(t, minimal+"  notify_min_gap: 50ms\n"), nil)
	wantContains(t, strings.Join(c.Warnings(), "\n"), "source.notify_min_gap is set but source.notify is not")
	c = mustLoad(t, writeConfig(t, minimal+"  notify: c\n  notify_min_gap: 2s\n"), nil)
	wantContains(t, strings.Join(c.Warnings(), "\n"), "not below sync.poll_interval")
	c = mustLoad(t, writeConfig(t, minimal+"  notify_lookback: 1s\n"), nil)
	wantContains(t, strings.Join(c.Warnings(), "\n"), "source.notify_lookback is set but source.notify is not")
	c = mustLoad(t, writeConfig(t, minimal+"  notify: c\n  notify_lookback: 20s\nsync:\n  margin: 5s\n"), nil)
	wantContains(t, strings.Join(c.Warnings(), "\n"), "source.notify_lookback 20s is more than sync.margin 5s")
	// The default lookback is not the operator's doing: no warning when
	// the margin is below it.
	c = mustLoad(t, writeConfig(t, minimal+"  notify: c\n  horizon: true\nsync:\n  margin: 0s\n"), nil)
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("sync.margin 0s with the default lookback warns: %q", w)
	}
	c = mustLoad(t, writeConfig(t, minimal+"  notify: c\n"), nil)
	if w := c.Warnings(); len(w) != 0 || c.Source.NotifyMinGap.Duration != 20*time.Millisecond || c.Source.NotifyLookback.Duration != 100*time.Millisecond {
		t.Errorf("defaults: warnings %q, min gap %s, lookback %s", w, c.Source.NotifyMinGap, c.Source.NotifyLookback)
	}
}

// TestNotifyLookbackReachesTheEngine: source.notify_lookback is the
// engine's HeadLookback; 0s means none (the engine's negative), as
// sync.margin 0s does.
func TestNotifyLookbackReachesTheEngine(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want time.Duration
	}{
		{"", connector.DefaultHeadLookback},
		{"  notify_lookback: 250ms\n", 250 * time.Millisecond},
		{"  notify_lookback: 0s\n", -1},
	} {
		c := mustLoad(t, writeConfig(t, minimal+"  notify: c\n"+tc.yaml), nil)
		if got := (&cli{cfg: c}).engineConfig().HeadLookback; got != tc.want {
			t.Errorf("%q: HeadLookback %s, want %s", tc.yaml, got, tc.want)
		}
	}
}

func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestFullPassLine: status names where the next full pass reads from only
// while head passes have run since the last one.
func TestFullPassLine(t *testing.T) {
	if got := fullPassLine(&schemas.Checkpoint{Watermark: "2026-12-01T10:00:00Z"}, 10*time.Second); got != "" {
		t.Errorf("without head passes: %q, want no line", got)
	}
	cp := &schemas.Checkpoint{Watermark: "2026-12-01T10:00:05Z", HeadsSinceFull: true, FullWatermark: "2026-12-01T10:00:00Z", FullMark: "x1:7"}
	got := fullPassLine(cp, 10*time.Second)
	for _, want := range []string{"due", "left the watermark at 2026-12-01T10:00:00Z", "reads from 2026-12-01T09:59:50.000000Z", "committed late"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q lacks %q", got, want)
		}
	}
	if got := fullPassLine(cp, -time.Second); !strings.Contains(got, "reads from 2026-12-01T10:00:00.000000Z") {
		t.Errorf("no margin: %q", got)
	}
}
