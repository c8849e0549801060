package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/feed"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/test/harness"
	"github.com/twmb/franz-go/pkg/kgo"
)

// httpWorld is a PostgreSQL table, a Kafka cluster and a directory for
// config files, for the http source through the CLI.
type httpWorld struct {
	t     *testing.T
	db    *harness.DB
	kafka *harness.Kafka
	table *postgres.Source
	dir   string
}

const httpName = "http-sync"

func newHTTPWorld(t *testing.T, rows int) *httpWorld {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, v text, doc jsonb, updated_at timestamptz NOT NULL, deleted_at timestamptz);
		CREATE INDEX ON items (updated_at, id)`)
	db.Exec(t, `INSERT INTO items (id, v, doc, updated_at, deleted_at)
		SELECT i, 'v' || i, jsonb_build_object('n', i), '2026-01-01T00:00:00Z'::timestamptz + i * interval '1 microsecond',
		       CASE WHEN i % 7 = 0 THEN now() END
		FROM generate_series(1, $1) AS i`, rows)
	table, err := postgres.New(context.Background(), postgres.Config{DSN: db.URL, Schema: db.Schema, Table: "items", DeletedAtColumn: "deleted_at"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(table.Close)
	return &httpWorld{t: t, db: db, kafka: harness.NewKafka(t), table: table, dir: t.TempDir()}
}

// httpConfig writes a config for source.kind http at endpoint.
func (w *httpWorld) httpConfig(endpoint, extra string) string {
	w.t.Helper()
	text := fmt.Sprintf(`name: %s
source:
  kind: http
  dsn: %s
  http:
    value_path: data
    deleted_path: deleted
    has_more_path: has_more
    max_limit: 500
%s
kafka:
  brokers: [%s]
  topic: items-http
sync:
  page_size: 4
  txn_max_records: 4
  margin: 10s
  poll_interval: 50ms
log:
  level: warn
  format: text
`, httpName, endpoint, extra, strings.Join(w.kafka.Brokers, ", "))
	path := filepath.Join(w.dir, "http.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// live is the feed's own encoding of the live rows.
func (w *httpWorld) live() map[string]string {
	w.t.Helper()
	out := map[string]string{}
	if _, err := w.table.ScanLive(context.Background(), func(r *connector.Row) error {
		out[r.ID] = string(r.Value)
		return nil
	}); err != nil {
		w.t.Fatal(err)
	}
	return out
}

func (w *httpWorld) assertTopic() {
	w.t.Helper()
	st, err := fold.Map(context.Background(), []kgo.Opt{kgo.SeedBrokers(w.kafka.Brokers...)}, "items-http")
	if err != nil {
		w.t.Fatal(err)
	}
	want := w.live()
	for k, v := range want {
		if got, ok := st.Live[k]; !ok || string(got.Value) != v {
			w.t.Errorf("key %s: topic has %q, feed has %s", k, got.Value, v)
		}
	}
	for k := range st.Live {
		if _, ok := want[k]; !ok {
			w.t.Errorf("key %s in the topic but not live upstream", k)
		}
	}
}

func (w *httpWorld) cli(ctx context.Context, secret string, args ...string) (int, string, string) {
	w.t.Helper()
	var o, e harness.SyncBuffer
	code := run(ctx, args, &o, &e)
	if secret != "" && (strings.Contains(o.String(), secret) || strings.Contains(e.String(), secret)) {
		w.t.Errorf("tidemark %s printed a secret:\n%s\n%s", args[0], o.String(), e.String())
	}
	return code, o.String(), e.String()
}

// A stored cursor the upstream rejects on resume: exit 3 and nothing
// guessed; `tidemark reset --yes` then a rerun completes exactly.
func TestCLIHTTPRejectedCursorThenReset(t *testing.T) {
	w := newHTTPWorld(t, 30)
	const token = "tok-Sup3rS3cret"
	t.Setenv("TIDEMARK_TEST_FEED_AUTH", "Bearer "+token)

	var mu sync.Mutex
	var hook func(n int64)
	var cursors []string
	newFeed := func(key string) *feed.Server {
		s, err := feed.New(feed.Config{Table: w.table, Key: []byte(key), Collection: w.db.Schema + ".items", AuthToken: token,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Faults: func(r feed.FaultRequest) feed.Fault {
				mu.Lock()
				h := hook
				cursors = append(cursors, r.Cursor)
				mu.Unlock()
				if h != nil {
					h(r.N)
				}
				return feed.Fault{}
			}})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	srv := newFeed("the first key, 16 bytes or more")
	hs := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		s := srv
		mu.Unlock()
		s.ServeHTTP(rw, r)
	}))
	t.Cleanup(hs.Close)
	cfg := w.httpConfig(hs.URL+"/changes", "    auth_header: Authorization\n    auth_value_env: TIDEMARK_TEST_FEED_AUTH")

	// Run 1 is stopped mid-walk (as by SIGTERM): a clean stop with a stored cursor.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mu.Lock()
	hook = func(n int64) {
		if n == 4 {
			cancel()
		}
	}
	mu.Unlock()
	if code, _, stderr := w.cli(ctx, token, "run", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("run 1: exit %d\n%s", code, stderr)
	}
	cp, err := offsets.NewStore([]kgo.Opt{kgo.SeedBrokers(w.kafka.Brokers...)}, "tidemark-offsets", httpName).Load(context.Background())
	if err != nil || cp == nil || cp.Cursor == "" {
		t.Fatalf("checkpoint after run 1: %+v %v", cp, err)
	}

	// The upstream rotates its key: the stored cursor is now void.
	mu.Lock()
	hook, cursors, srv = nil, nil, newFeed("the second key, 16 bytes or more")
	mu.Unlock()
	code, _, stderr := w.cli(context.Background(), token, "run", "--once", "--config", cfg)
	if code != exitDecision || !strings.Contains(stderr, "rejected the stored cursor") || !strings.Contains(stderr, "cursor_tampered") ||
		!strings.Contains(stderr, "tidemark reset") {
		t.Fatalf("run 2: want exit 3 offering reset, got %d\n%s", code, stderr)
	}
	mu.Lock()
	if len(cursors) != 1 || cursors[0] != cp.Cursor {
		t.Errorf("run 2 requested %q; want exactly the stored cursor, nothing guessed", cursors)
	}
	mu.Unlock()
	// check says what run would: the checkpoint is marked, exit 3 (it
	// passed with exit 0).
	if code, out, stderr := w.cli(context.Background(), token, "check", "--config", cfg); code != exitDecision || !strings.Contains(out+stderr, "needing an operator decision") {
		t.Errorf("check of a marked checkpoint: exit %d, want %d\n%s\n%s", code, exitDecision, out, stderr)
	}

	// The operator decides: start over from scratch.
	if code, out, stderr := w.cli(context.Background(), token, "reset", "--yes", "--reason", "feed key rotated", "--config", cfg); code != exitOK {
		t.Fatalf("reset: exit %d\n%s\n%s", code, out, stderr)
	}
	if code, _, stderr := w.cli(context.Background(), token, "run", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("run 3: exit %d\n%s", code, stderr)
	}
	w.assertTopic()
}

// `tidemark feed serve` serves the configured table; `tidemark run` with
// source.kind http syncs it exactly (the worked example of
// docs/http-source.md).
func TestCLIFeedServe(t *testing.T) {
	w := newHTTPWorld(t, 25)
	keyFile := filepath.Join(w.dir, "feed.key")
	if err := os.WriteFile(keyFile, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	feedCfg := filepath.Join(w.dir, "feed.yaml")
	if err := os.WriteFile(feedCfg, []byte(fmt.Sprintf("name: feed\nsource:\n  dsn: %q\n  schema: %s\n  table: items\n  deleted_at_column: deleted_at\n", w.db.URL, w.db.Schema)), 0o600); err != nil {
		t.Fatal(err)
	}
	// No key: a configuration error.
	if code, _, stderr := w.cli(context.Background(), "", "feed", "serve", "--config", feedCfg, "--listen", "127.0.0.1:0"); code != exitConfig || !strings.Contains(stderr, "hmac") {
		t.Fatalf("feed serve without a key: exit %d\n%s", code, stderr)
	}
	if code, _, _ := w.cli(context.Background(), "", "feed", "--config", feedCfg); code != exitConfig {
		t.Fatalf("feed without serve: exit %d", code)
	}

	endpoint := startFeed(t, "--config", feedCfg, "--hmac-key-file", keyFile, "--tenant", "acme") // stopped, exit 0, at the end
	var eb feed.ErrorBody
	if r := getJSON(t, endpoint+"?limit=abc", &eb); r.StatusCode != 400 || eb.Error.Code != "invalid_limit" {
		t.Errorf("limit=abc: %d %+v", r.StatusCode, eb)
	}

	cfg := w.httpConfig(endpoint, "")
	if code, _, stderr := w.cli(context.Background(), "", "run", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("run: exit %d\n%s", code, stderr)
	}
	w.assertTopic()
}

// TestHTTPAuthValueFileIsReadForEveryRequest: source.http.auth_value_file
// holds a token that is rotated while tidemark runs (a projected service
// account token, a secret store's renewal). Every request sends what the
// file holds then, not what it held at start; a file that cannot be read
// fails that request as a transient failure that names the file, and
// never shows a token.
func TestHTTPAuthValueFileIsReadForEveryRequest(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		fmt.Fprint(w, `{"items":[],"next_cursor":null}`)
	}))
	t.Cleanup(hs.Close)
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	writeToken := func(v string) {
		t.Helper()
		if err := os.WriteFile(tokenFile, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	writeToken("Bearer first-T0ken")
	path := filepath.Join(dir, "http.yaml")
	text := fmt.Sprintf("name: h\nsource:\n  kind: http\n  dsn: %s/changes\n  http:\n    auth_header: Authorization\n    auth_value_file: %s\n    max_retries: 1\nkafka:\n  brokers: [127.0.0.1:1]\n  topic: t\n", hs.URL, tokenFile)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := loadedCLI(t, path).source(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	page := func() error {
		_, err := src.Page(context.Background(), connector.PageRequest{Limit: 10})
		return err
	}
	if err := page(); err != nil {
		t.Fatal(err)
	}
	writeToken("Bearer second-T0ken")
	if err := page(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	got := slices.Clone(seen)
	mu.Unlock()
	if want := []string{"Bearer first-T0ken", "Bearer second-T0ken"}; !slices.Equal(got, want) {
		t.Fatalf("the server saw %q, want %q: the token file must be read for every request", got, want)
	}
	if err := os.Remove(tokenFile); err != nil {
		t.Fatal(err)
	}
	err = page()
	if err == nil || !strings.Contains(err.Error(), tokenFile) || strings.Contains(err.Error(), "T0ken") || errors.Is(err, connector.ErrPermanent) {
		t.Fatalf("a page with the token file gone: %v; want a transient error naming the file", err)
	}
}
