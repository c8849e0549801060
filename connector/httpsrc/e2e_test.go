package httpsrc_test

// End-to-end: a real PostgreSQL table served by the reference feed
// (package feed), read by the HTTP source, walked by the engine into kfake.
// The folded topic must equal the table as the feed itself encodes it.

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/httpsrc"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/feed"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var feedKey = []byte("feed-test-key-0123456789abcdef!!")

// upstream is a PostgreSQL table behind a reference feed server.
type upstream struct {
	t     *testing.T
	db    *harness.DB
	table *postgres.Source
	srv   *feed.Server
	http  *httptest.Server

	mu      sync.Mutex
	cursors []string // the cursor parameter of every request, in order
	hook    func(n int64)
	fault   feed.Faults
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (
		id bigint PRIMARY KEY, name text NOT NULL, price numeric, tags text[], doc jsonb,
		updated_at timestamptz NOT NULL, deleted_at timestamptz)`)
	db.Exec(t, `CREATE INDEX ON items (updated_at, id)`)
	u := &upstream{t: t, db: db}
	src, err := postgres.New(context.Background(), postgres.Config{DSN: db.URL, Schema: db.Schema, Table: "items", DeletedAtColumn: "deleted_at"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(src.Close)
	u.table = src
	u.serve(feedKey)
	return u
}

// serve (re)starts the feed server with a key; a new key makes every old
// cursor "tampered".
func (u *upstream) serve(key []byte) {
	srv, err := feed.New(feed.Config{Table: u.table, Key: key, Collection: u.db.Schema + ".items",
		Logger: slog.New(slog.NewTextHandler(testWriter{u.t}, nil)),
		Faults: func(r feed.FaultRequest) feed.Fault {
			u.mu.Lock()
			u.cursors = append(u.cursors, r.Cursor)
			hook, fault := u.hook, u.fault
			u.mu.Unlock()
			if hook != nil {
				hook(r.N)
			}
			if fault != nil {
				return fault(r)
			}
			return feed.Fault{}
		}})
	if err != nil {
		u.t.Fatal(err)
	}
	u.srv = srv
	if u.http == nil {
		u.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u.mu.Lock()
			s := u.srv
			u.mu.Unlock()
			s.ServeHTTP(w, r)
		}))
		u.t.Cleanup(u.http.Close)
	} else {
		u.mu.Lock()
		u.srv = srv
		u.cursors = nil
		u.mu.Unlock()
	}
}

func (u *upstream) set(hook func(n int64), fault feed.Faults) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.hook, u.fault = hook, fault
}

func (u *upstream) requests() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.cursors)
}

func (u *upstream) exec(sql string, args ...any) { u.t.Helper(); u.db.Exec(u.t, sql, args...) }

// insert adds rows id..id+n-1 at ts + i*step.
func (u *upstream) insert(from, n int, ts time.Time, step time.Duration) {
	u.t.Helper()
	u.exec(`INSERT INTO items (id, name, price, tags, doc, updated_at)
		SELECT i, 'item ' || i, (i * 1.25)::numeric, ARRAY['t' || i, 'x'], jsonb_build_object('i', i), $2::timestamptz + ($3::bigint * (i - $1)) * interval '1 microsecond'
		FROM generate_series($1::bigint, $1::bigint + $4 - 1) AS i`, from, ts, step.Microseconds(), n)
}

// live is the feed's own encoding of the live rows: what a consumer of the
// topic must rebuild.
func (u *upstream) live() map[string]string {
	u.t.Helper()
	out := map[string]string{}
	if _, err := u.table.ScanLive(context.Background(), func(r *connector.Row) error {
		out[r.ID] = string(r.Value)
		return nil
	}); err != nil {
		u.t.Fatal(err)
	}
	return out
}

func (u *upstream) source(t *testing.T, clk httpsrc.Clock) *httpsrc.Source {
	t.Helper()
	s, err := httpsrc.New(httpsrc.Config{
		Endpoint: u.http.URL + "/changes", ValuePath: "data", DeletedPath: "deleted", HasMorePath: "has_more",
		MaxLimit: feed.MaxLimit, Clock: clk, Logger: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rig is a kfake cluster with the connector's topics (as in
// connector/engine_test.go).
type rig struct {
	t     *testing.T
	opts  []kgo.Opt
	name  string
	topic string
}

func newRig(t *testing.T) *rig {
	k := harness.NewKafka(t)
	r := &rig{t: t, opts: []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}, name: "h1", topic: "data"}
	cl, err := kgo.NewClient(r.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(context.Background(), cl, producer.Topics{Data: r.topic, Partitions: 3, ReplicationFactor: -1, Offsets: "tidemark-offsets", Ledger: "tidemark-ledger"}); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) store() *offsets.Store {
	return offsets.NewStore(r.opts, "tidemark-offsets", r.name).FailClosed(offsets.NewLedger(r.opts, "tidemark-ledger", r.name), r.topic)
}

func (r *rig) engine(src connector.Source, cfg connector.Config) *connector.Engine {
	r.t.Helper()
	w, err := producer.New(context.Background(), producer.Config{Name: r.name, Topic: r.topic, OffsetsTopic: "tidemark-offsets", LedgerTopic: "tidemark-ledger", Opts: r.opts})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(w.Close)
	cfg.Name, cfg.Fingerprint = r.name, "fp-http"
	cfg.Logger = slog.New(slog.NewTextHandler(testWriter{r.t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
	e, err := connector.New(cfg, src, w, r.store())
	if err != nil {
		r.t.Fatal(err)
	}
	return e
}

func (r *rig) once(src connector.Source, cfg connector.Config) *connector.Completion {
	r.t.Helper()
	c, err := r.engine(src, cfg).Run(context.Background(), connector.Once)
	if err != nil {
		r.t.Fatalf("run: %v", err)
	}
	return c
}

func (r *rig) fold() *fold.State {
	r.t.Helper()
	st, err := fold.Map(context.Background(), r.opts, r.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// assertFolded compares the folded topic with want by key set and value,
// and reports duplicate publications.
func (r *rig) assertFolded(want map[string]string) *fold.State {
	r.t.Helper()
	st := r.fold()
	for k, v := range want {
		if got, ok := st.Live[k]; !ok {
			r.t.Errorf("key %s missing from the topic", k)
		} else if string(got.Value) != v {
			r.t.Errorf("key %s: topic has %s, feed has %s", k, got.Value, v)
		}
	}
	for k := range st.Live {
		if _, ok := want[k]; !ok {
			r.t.Errorf("key %s in the topic but not live upstream", k)
		}
	}
	for k, vs := range st.Publications {
		for v, n := range vs {
			if n > 1 {
				r.t.Errorf("key %s value %s published %d times", k, v, n)
			}
		}
	}
	return st
}

// The Core mutation scenarios through the feed: ties across pages, a page
// boundary between rows 1 µs apart, and between pages: an insert behind the
// cursor (within the margin) and one ahead, an update of a row already read,
// a soft delete, and a hard delete of the cursor's anchor row.
func TestMutationsThroughFeed(t *testing.T) {
	u := newUpstream(t)
	r := newRig(t)
	u.insert(1, 5, t0, 0)                                      // ids 1..5 tie on t0
	u.insert(6, 2, t0.Add(time.Microsecond), time.Microsecond) // 6 at +1µs, 7 at +2µs
	u.insert(8, 10, t0.Add(time.Second), time.Millisecond)
	anchor := u.live()["4"] // page 1 (limit 4) ends on id 4
	u.set(func(n int64) {
		if n == 2 { // before the second page is served
			u.exec(`UPDATE items SET name = 'updated', updated_at = $1 WHERE id = 1`, t0.Add(5*time.Second))
			u.exec(`INSERT INTO items (id, name, updated_at) VALUES (100, 'behind', $1), (101, 'ahead', $2)`, t0.Add(500*time.Millisecond), t0.Add(20*time.Second))
			u.exec(`UPDATE items SET deleted_at = $1, updated_at = $1 WHERE id = 7`, t0.Add(30*time.Second))
			u.exec(`DELETE FROM items WHERE id = 4`)
		}
	}, nil)
	c := r.once(u.source(t, nil), connector.Config{PageSize: 4, TxnMaxRecords: 4, Margin: 40 * time.Second})
	if c.Published == 0 || c.Tombstones != 1 {
		t.Errorf("completion: %+v", c)
	}
	// A second pass from W - M picks up the row inserted behind the cursor.
	u.set(nil, nil)
	r.once(u.source(t, nil), connector.Config{PageSize: 4, TxnMaxRecords: 4, Margin: 40 * time.Second})
	want := u.live()
	want["4"] = anchor // hard-deleted after it was read: only a sweep tombstones it
	st := r.assertFolded(want)
	if _, ok := st.Live["7"]; ok {
		t.Error("soft-deleted id 7 is live")
	}
	// The first request of each pass has no cursor; every later one is a
	// cursor the feed issued.
	reqs := u.requests()
	if reqs[0] != "" || len(reqs) < 5 {
		t.Errorf("requests: %q", reqs)
	}
}

// 429 and 503 storms with Retry-After (seconds and HTTP-date), slow answers
// and truncated bodies: the sync completes exactly, and every wait the
// server asked for was honoured (on the injected clock).
func TestStormsWithRetryAfter(t *testing.T) {
	u := newUpstream(t)
	r := newRig(t)
	u.insert(1, 60, t0, 250*time.Microsecond)
	clk := newClock()
	var mu sync.Mutex
	var n429 int
	var dates []time.Time // the HTTP-dates sent with 503s
	u.set(nil, func(f feed.FaultRequest) feed.Fault {
		mu.Lock()
		defer mu.Unlock()
		switch f.N % 5 {
		case 1:
			n429++
			return feed.Fault{Status: 429, RetryAfter: "3"}
		case 2:
			d := clk.Now().Add(11 * time.Second).Truncate(time.Second)
			dates = append(dates, d)
			return feed.Fault{Status: 503, RetryAfter: d.Format(http.TimeFormat)}
		case 3:
			return feed.Fault{Truncate: true}
		case 4:
			return feed.Fault{Delay: 5 * time.Millisecond}
		}
		return feed.Fault{}
	})
	r.once(u.source(t, clk), connector.Config{PageSize: 7, TxnMaxRecords: 7})
	r.assertFolded(u.live())
	mu.Lock()
	defer mu.Unlock()
	waits, ends := clk.Waits(), clk.Ends()
	if n429 < 3 || len(dates) < 3 || len(waits) != n429+2*len(dates) {
		t.Fatalf("waits %v for %d 429s, %d 503s and as many truncated bodies", waits, n429, len(dates))
	}
	got429 := 0
	for _, w := range waits {
		if w == 3*time.Second {
			got429++
		}
	}
	if got429 < n429 {
		t.Errorf("waits %v: %d of 3s for %d 429s with Retry-After: 3", waits, got429, n429)
	}
	// Each 503's wait ends exactly at the HTTP-date it named.
	for _, d := range dates {
		if !slices.ContainsFunc(ends, d.Equal) {
			t.Errorf("no wait ended at the Retry-After date %s (waits ended at %v)", d, ends)
		}
	}
}

// Kill mid-walk (cancel the engine's context) and resume: the second run's
// first request carries the stored request cursor, and the result is exact.
func TestKillMidWalkAndResume(t *testing.T) {
	u := newUpstream(t)
	r := newRig(t)
	u.insert(1, 40, t0, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	u.set(func(n int64) {
		if n == 4 {
			cancel()
		}
	}, nil)
	e := r.engine(u.source(t, nil), connector.Config{PageSize: 5, TxnMaxRecords: 5})
	if _, err := e.Run(ctx, connector.Once); err != nil {
		t.Fatalf("a cancelled run is a clean stop: %v", err)
	}
	cp, err := r.store().Load(context.Background())
	if err != nil || cp == nil || cp.Cursor == "" {
		t.Fatalf("checkpoint after the kill: %+v %v", cp, err)
	}
	before := len(u.requests())
	u.set(nil, nil)
	r.once(u.source(t, nil), connector.Config{PageSize: 5, TxnMaxRecords: 5})
	if got := u.requests()[before]; got != cp.Cursor {
		t.Errorf("resumed with cursor %q, the checkpoint stores %q", got, cp.Cursor)
	}
	r.assertFolded(u.live())
}

// A stored cursor the feed rejects on resume is a safety stop: nothing is
// guessed (no request without the cursor, nothing published), and the
// topic keeps what was committed.
func TestRejectedCursorOnResumeStops(t *testing.T) {
	u := newUpstream(t)
	r := newRig(t)
	u.insert(1, 30, t0, time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	u.set(func(n int64) {
		if n == 3 {
			cancel()
		}
	}, nil)
	if _, err := r.engine(u.source(t, nil), connector.Config{PageSize: 5, TxnMaxRecords: 5}).Run(ctx, connector.Once); err != nil {
		t.Fatal(err)
	}
	cancel()
	committed := r.fold().Records
	u.set(nil, nil)
	u.serve([]byte("a rotated key: old cursors are void")) // every stored cursor is now "tampered"
	_, err := r.engine(u.source(t, nil), connector.Config{PageSize: 5, TxnMaxRecords: 5}).Run(context.Background(), connector.Once)
	var stop *connector.StopError
	if !errors.As(err, &stop) || !strings.Contains(err.Error(), "cursor_tampered") || !strings.Contains(err.Error(), "tidemark reset") {
		t.Fatalf("want a safety stop offering reset, got %v", err)
	}
	reqs := u.requests()
	if len(reqs) != 1 || reqs[0] == "" {
		t.Errorf("after the rejection the source guessed: requests %q", reqs)
	}
	if got := r.fold().Records; got != committed {
		t.Errorf("the topic changed from %d to %d records", committed, got)
	}
}

// TestFeedFollowsSchemaChanges: the reference feed reads the table's shape
// again as a pass of the connector does: a column added is in the items
// from the next request on, and a column dropped or retyped does not leave
// every request failing until the server restarts.
func TestFeedFollowsSchemaChanges(t *testing.T) {
	u := newUpstream(t)
	u.insert(1, 3, t0, time.Second)
	get := func() (int, feed.Response) {
		t.Helper()
		resp, err := http.Get(u.http.URL + "/?limit=10")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var r feed.Response
		if resp.StatusCode == 200 {
			if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, r
	}
	if st, r := get(); st != 200 || len(r.Items) != 3 {
		t.Fatalf("before: %d %+v", st, r)
	}
	for _, c := range []struct{ ddl, want, not string }{
		{"ALTER TABLE items ADD COLUMN extra int DEFAULT 7", `"extra":7`, ""},
		{"ALTER TABLE items ALTER COLUMN extra TYPE text USING 'x' || extra", `"extra":"x7"`, ""},
		{"ALTER TABLE items DROP COLUMN extra", `"name"`, `"extra"`},
	} {
		u.exec(c.ddl)
		st, r := get()
		if st != 200 || len(r.Items) != 3 || !strings.Contains(string(r.Items[0].Data), c.want) || c.not != "" && strings.Contains(string(r.Items[0].Data), c.not) {
			t.Errorf("after %s: %d %+v", c.ddl, st, r)
		}
	}
	// A column retyped in the middle of a walk: the next page, read with
	// the walk's cursor, is served by the new type.
	resp, err := http.Get(u.http.URL + "/?limit=1")
	if err != nil {
		t.Fatal(err)
	}
	var first feed.Response
	err = json.NewDecoder(resp.Body).Decode(&first)
	resp.Body.Close()
	if err != nil || first.NextCursor == nil {
		t.Fatalf("first page: %v %+v", err, first)
	}
	u.exec("ALTER TABLE items ALTER COLUMN price TYPE text USING 'p' || price")
	resp, err = http.Get(u.http.URL + "/?limit=1&cursor=" + url.QueryEscape(*first.NextCursor))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var next feed.Response
	if resp.StatusCode != 200 || json.NewDecoder(resp.Body).Decode(&next) != nil || len(next.Items) != 1 || !strings.Contains(string(next.Items[0].Data), `"price":"p2.50"`) {
		t.Errorf("the page after a retype mid-walk: %d %+v", resp.StatusCode, next)
	}
}

// An empty page that says there is more moves the walk to its next cursor:
// the engine asks for that cursor, not the one before it again. (It once
// asked for the same cursor again, which reset the progress guard's
// count of empty pages, so the walk never ended and never backed off.)
func TestEngineFollowsTheCursorOfAnEmptyPage(t *testing.T) {
	srv := &script{next: func(cur string, n int) (string, string) {
		switch {
		case n > 50:
			return "", "" // stop a runaway walk so that the test can fail
		case cur == "":
			return "", "c2"
		case cur == "c2":
			return "", "c3"
		default:
			return oneItem, ""
		}
	}}
	s, _, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more"})
	r := newRig(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.once(s, connector.Config{PageSize: 10})
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("the walk did not end; cursors asked for: %v", srv.seen)
	}
	srv.mu.Lock()
	seen := slices.Clone(srv.seen)
	srv.mu.Unlock()
	if want := []string{"", "c2", "c3"}; !slices.Equal(seen, want) {
		t.Errorf("cursors asked for: %q, want %q", seen, want)
	}
	r.assertFolded(map[string]string{"a": oneItem})
}
