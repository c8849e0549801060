package httpsrc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/httpsrc"
)

// fakeClock records the waits a Source asks for and advances without
// spending them.
type fakeClock struct {
	mu    sync.Mutex
	now   time.Time
	waits []time.Duration
	ends  []time.Time // the clock after each wait
}

func newClock() *fakeClock { return &fakeClock{now: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Sleep(ctx context.Context, d time.Duration) error {
	c.mu.Lock()
	c.waits = append(c.waits, d)
	c.now = c.now.Add(d)
	c.ends = append(c.ends, c.now)
	c.mu.Unlock()
	return ctx.Err()
}

func (c *fakeClock) Ends() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.ends...)
}

func (c *fakeClock) Waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Duration(nil), c.waits...)
}

// canned serves one answer per request, in order, and records the
// requests.
type canned struct {
	mu      sync.Mutex
	answers []func(w http.ResponseWriter, r *http.Request)
	reqs    []*http.Request
}

func (c *canned) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	i := len(c.reqs)
	c.reqs = append(c.reqs, r)
	c.mu.Unlock()
	if i >= len(c.answers) {
		http.Error(w, "no more answers", 599)
		return
	}
	c.answers[i](w, r)
}

func body(status int, s string, hdr ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.WriteHeader(status)
		fmt.Fprint(w, s)
	}
}

func newSource(t *testing.T, h http.Handler, cfg httpsrc.Config) (*httpsrc.Source, *fakeClock, *httptest.Server) {
	t.Helper()
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	clk := newClock()
	if cfg.Endpoint == "" {
		cfg.Endpoint = hs.URL + "/changes?tenant=acme"
	}
	cfg.Clock = clk
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(testWriter{t}, nil))
	}
	s, err := httpsrc.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, clk, hs
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

var since = time.Date(2026, 1, 1, 0, 0, 0, 1, time.UTC).Truncate(time.Microsecond).Add(7 * time.Microsecond)

func TestPageRequestAndRows(t *testing.T) {
	c := &canned{answers: []func(http.ResponseWriter, *http.Request){
		body(200, `{"data":{"changes":[
			{"key": 42, "ts": "2026-01-01T00:00:00.000008Z", "row": {"b": 1.50, "a": "x" }},
			{"key": "s-1", "ts": "2026-01-01T01:00:01+01:00", "gone": true},
			{"key": "s-2", "ts": "2026-01-01T00:00:00.000009Z", "del_at": "2026-01-02T00:00:00Z", "row": {}}
		]}, "meta": {"next": "opaque+/=?&cursor", "more": true}}`),
	}}
	s, _, _ := newSource(t, c, httpsrc.Config{
		SinceParam: "from", CursorParam: "after", LimitParam: "n", MaxLimit: 50,
		ItemsPath: "data.changes", IDPath: "key", UpdatedAtPath: "ts", DeletedPath: "gone", DeletedAtPath: "del_at",
		ValuePath: "row", NextCursorPath: "meta.next", HasMorePath: "meta.more",
	})
	p, err := s.Page(context.Background(), connector.PageRequest{Since: since, Cursor: "c0 /+", Limit: 1000})
	if err != nil {
		t.Fatal(err)
	}
	q := c.reqs[0].URL.Query()
	if q.Get("from") != "2026-01-01T00:00:00.000007Z" || q.Get("after") != "c0 /+" || q.Get("n") != "50" || q.Get("tenant") != "acme" {
		t.Errorf("query %v", q)
	}
	if p.End || p.Next != "opaque+/=?&cursor" || len(p.Rows) != 3 {
		t.Fatalf("page %+v", p)
	}
	r := p.Rows[0]
	if r.ID != "42" || r.Deleted || string(r.Value) != `{"b": 1.50, "a": "x" }` || !r.UpdatedAt.Equal(time.Date(2026, 1, 1, 0, 0, 0, 8000, time.UTC)) {
		t.Errorf("row 0 %+v %s", r, r.Value)
	}
	if r := p.Rows[1]; r.ID != "s-1" || !r.Deleted || r.Value != nil || r.UpdatedAt.Location() != time.UTC {
		t.Errorf("row 1 %+v", r)
	}
	if r := p.Rows[2]; !r.Deleted || r.Value != nil {
		t.Errorf("row 2 %+v", r)
	}
}

// Only an explicit signal ends a walk; empty and short pages with a next
// cursor continue.
func TestEndSignals(t *testing.T) {
	cases := []struct {
		name, body, hasMore string
		end                 bool
		next, err           string
	}{
		{"empty page, more to come", `{"items":[],"next_cursor":"c2"}`, "", false, "c2", ""},
		{"short page, more to come", `{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00Z"}],"next_cursor":"c2","has_more":true}`, "has_more", false, "c2", ""},
		{"null cursor", `{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00Z"}],"next_cursor":null}`, "", true, "", ""},
		{"has_more false", `{"items":[],"next_cursor":"ignored","has_more":false}`, "has_more", true, "", ""},
		{"numeric cursor", `{"items":[],"next_cursor":12345}`, "", false, "12345", ""},
		{"missing cursor", `{"items":[]}`, "", false, "", `no "next_cursor"`},
		{"empty cursor", `{"items":[],"next_cursor":""}`, "", false, "", "empty string"},
		{"contradiction", `{"items":[],"next_cursor":null,"has_more":true}`, "has_more", false, "", "contradicts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, _, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(200, tc.body)}}, httpsrc.Config{HasMorePath: tc.hasMore})
			p, err := s.Page(context.Background(), connector.PageRequest{Cursor: "c1", Limit: 10})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || !errors.Is(err, connector.ErrPermanent) {
					t.Fatalf("want a permanent error with %q, got %v", tc.err, err)
				}
				return
			}
			if err != nil || p.End != tc.end || p.Next != tc.next {
				t.Fatalf("got %+v, %v", p, err)
			}
		})
	}
}

// An item dated before the since the request sent fails the page: an API
// that ignores the parameter (another name for it, say) would otherwise
// return the whole feed on every pass, and every row below the dedupe
// set's floor would be published again each time.
func TestRowsBeforeSince(t *testing.T) {
	page := `{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00.000007Z"},{"id":"b","updated_at":"2025-12-31T23:59:59Z"}],"next_cursor":"c2"}`
	for _, cursor := range []string{"", "c1"} {
		s, _, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(200, page)}}, httpsrc.Config{SinceParam: "from"})
		_, err := s.Page(context.Background(), connector.PageRequest{Since: since, Cursor: cursor, Limit: 10})
		if err == nil || !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), `id "b"`) || !strings.Contains(err.Error(), "source.http.since_param") || !strings.Contains(err.Error(), `"from"`) {
			t.Errorf("cursor %q: want a permanent error naming the item and source.http.since_param, got %v", cursor, err)
		}
	}
	// Without a since (the first pass), any date is fine.
	s, _, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(200, page)}}, httpsrc.Config{})
	if p, err := s.Page(context.Background(), connector.PageRequest{Limit: 10}); err != nil || len(p.Rows) != 2 {
		t.Errorf("no since: %+v, %v", p, err)
	}
}

// A malformed page fails as a whole, naming the item and field.
func TestMalformedPage(t *testing.T) {
	cases := map[string]string{
		`<html>oops</html>`: "not JSON",
		`{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00Z"}`: "not JSON",
		`{"things":[]}`: `no items array at "items"`,
		`{"items":{}}`:  "not an array",
		`{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00Z"},{"updated_at":"2026-01-01T00:00:00Z"}],"next_cursor":null}`: `item 1: field "id": missing`,
		`{"items":[{"id":"a","updated_at":"yesterday"}],"next_cursor":null}`:                                                  `item 0: id "a": field "updated_at"`,
		`{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00.0000001Z"}],"next_cursor":null}`:                               "sub-microsecond",
		`{"items":[{"id":1.5,"updated_at":"2026-01-01T00:00:00Z"}],"next_cursor":null}`:                                       "neither a string nor an integer",
		`{"items":[{"id":"a"}],"next_cursor":null}`:                                                                           `field "updated_at": missing`,
		`{"items":[3],"next_cursor":null}`:                                                                                    "item 0: not a JSON object",
		`{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00Z","deleted":"yes"}],"next_cursor":null}`:                       `field "deleted"`,
	}
	for b, want := range cases {
		s, _, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(200, b)}}, httpsrc.Config{DeletedPath: "deleted"})
		_, err := s.Page(context.Background(), connector.PageRequest{Limit: 10})
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, connector.ErrPermanent) || connector.Fatal(err) == false {
			t.Errorf("%s: want a permanent error with %q, got %v", b, want, err)
		}
	}
}

// items_path "." reads a body that is itself the array of items (with
// link pagination: a bare array has no place for a next cursor).
func TestBareArrayBody(t *testing.T) {
	c := &canned{answers: []func(http.ResponseWriter, *http.Request){
		body(200, `[{"id":"a","updated_at":"2026-01-01T00:00:00Z"},{"id":7,"updated_at":"2026-01-01T00:00:01Z"}]`),
	}}
	s, _, _ := newSource(t, c, httpsrc.Config{Pagination: httpsrc.PaginateLink, ItemsPath: "."})
	p, err := s.Page(context.Background(), connector.PageRequest{Limit: 3})
	if err != nil || !p.End || ids(p.Rows) != "a,7" {
		t.Fatalf("page: %+v %v", p, err)
	}
	err = httpsrc.Config{Endpoint: "https://api.example.com/v1/changes", ItemsPath: "."}.Validate()
	if err == nil || !strings.Contains(err.Error(), "pagination: link") {
		t.Errorf("a bare array with cursor pagination: %v", err)
	}
}

func ids(rows []connector.Row) string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return strings.Join(out, ",")
}

func TestLinkPagination(t *testing.T) {
	var hsURL string
	c := &canned{}
	c.answers = []func(http.ResponseWriter, *http.Request){
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Add("Link", `<https://elsewhere.example/x>; rel="prev"`)
			w.Header().Add("Link", `</changes?page=2&limit=3>; title="a, b"; rel="next last"`)
			fmt.Fprint(w, `{"items":[]}`)
		},
		func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", `<`+hsURL+`/changes?page=3>; rel=next`)
			fmt.Fprint(w, `{"items":[]}`)
		},
		body(200, `{"items":[]}`),
		body(200, `{"items":[]}`, "Link", `<https://evil.example/steal>; rel="next"`),
	}
	s, _, hs := newSource(t, c, httpsrc.Config{Pagination: httpsrc.PaginateLink, AuthHeader: "X-Api-Key", AuthValue: "k3y"})
	hsURL = hs.URL
	p, err := s.Page(context.Background(), connector.PageRequest{Limit: 3})
	if err != nil || p.End || p.Next != hs.URL+"/changes?page=2&limit=3" {
		t.Fatalf("page 1: %+v %v", p, err)
	}
	p, err = s.Page(context.Background(), connector.PageRequest{Cursor: p.Next, Limit: 3})
	if err != nil || p.End || p.Next != hs.URL+"/changes?page=3" {
		t.Fatalf("page 2: %+v %v", p, err)
	}
	if got := c.reqs[1].URL.RawQuery; got != "page=2&limit=3" {
		t.Errorf("the link was not followed verbatim: %q", got)
	}
	p, err = s.Page(context.Background(), connector.PageRequest{Cursor: p.Next, Limit: 3})
	if err != nil || !p.End {
		t.Fatalf("page 3: %+v %v", p, err)
	}
	if _, err := s.Page(context.Background(), connector.PageRequest{Limit: 3}); err == nil || !strings.Contains(err.Error(), "another origin") {
		t.Fatalf("cross-origin link: %v", err)
	}
	if _, err := s.Page(context.Background(), connector.PageRequest{Cursor: "https://evil.example/x", Limit: 3}); !errors.Is(err, connector.ErrPermanent) {
		t.Fatalf("cross-origin stored link: %v", err)
	}
	for _, r := range c.reqs {
		if r.Header.Get("X-Api-Key") != "k3y" {
			t.Errorf("auth header missing on %s", r.URL)
		}
	}
}

// 429 and 5xx are retried on the same cursor, waiting what Retry-After says
// (seconds or an HTTP-date), else a capped exponential backoff.
func TestRetryHonoursRetryAfter(t *testing.T) {
	clk := newClock()
	date := clk.Now().Add(42 * time.Second).Format(http.TimeFormat)
	ok := `{"items":[{"id":"a","updated_at":"2026-01-01T00:00:00Z"}],"next_cursor":null}`
	c := &canned{answers: []func(http.ResponseWriter, *http.Request){
		body(429, `{"error":{"code":"rate_limited","message":"slow down"}}`, "Retry-After", "7"),
		body(503, `upstream down`, "Retry-After", date),
		body(500, `boom`),
		body(502, `bad gateway`),
		func(w http.ResponseWriter, r *http.Request) { // a body cut short
			w.Header().Set("Content-Length", "1000")
			fmt.Fprint(w, `{"items":[`)
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		},
		body(200, ok),
	}}
	hs := httptest.NewServer(c)
	t.Cleanup(hs.Close)
	var logs bytes.Buffer
	s, err := httpsrc.New(httpsrc.Config{Endpoint: hs.URL, Clock: clk, BackoffBase: time.Second, BackoffMax: 3 * time.Second,
		AuthHeader: "Authorization", AuthValue: "Bearer sup3rs3cret", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p, err := s.Page(context.Background(), connector.PageRequest{Cursor: "same", Limit: 10})
	if err != nil || !p.End || len(p.Rows) != 1 {
		t.Fatalf("%+v %v", p, err)
	}
	for i, r := range c.reqs {
		if r.URL.Query().Get("cursor") != "same" {
			t.Errorf("request %d used cursor %q", i, r.URL.Query().Get("cursor"))
		}
	}
	w := clk.Waits()
	// The HTTP-date is 42s after the start, and 7s have passed by then.
	if len(w) != 5 || w[0] != 7*time.Second || w[1] != 35*time.Second {
		t.Fatalf("waits %v", w)
	}
	// Backoff without Retry-After: attempt n waits in [d/2, d], d = 1s * 2^(n-1) capped at 3s.
	for i, max := range map[int]time.Duration{2: 3 * time.Second, 3: 3 * time.Second, 4: 3 * time.Second} {
		if w[i] < max/2 || w[i] > max {
			t.Errorf("wait %d = %s, want in [%s, %s]", i, w[i], max/2, max)
		}
	}
	if strings.Contains(logs.String(), "sup3rs3cret") {
		t.Error("the auth value was logged")
	}
	if !strings.Contains(logs.String(), "retrying the same cursor") {
		t.Errorf("retries not logged: %s", logs.String())
	}
}

func TestRetriesExhaustedIsTransient(t *testing.T) {
	var answers []func(http.ResponseWriter, *http.Request)
	for range 4 {
		answers = append(answers, body(503, "down"))
	}
	s, clk, _ := newSource(t, &canned{answers: answers}, httpsrc.Config{MaxRetries: 3})
	_, err := s.Page(context.Background(), connector.PageRequest{Limit: 10})
	if err == nil || connector.Fatal(err) || !strings.Contains(err.Error(), "after 4 attempts") {
		t.Fatalf("want a transient error after 4 attempts, got %v", err)
	}
	if len(clk.Waits()) != 3 {
		t.Errorf("waits %v", clk.Waits())
	}
	// A Retry-After beyond the cap fails the page instead of stalling.
	s, _, _ = newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(429, "", "Retry-After", "3600")}}, httpsrc.Config{MaxRetryAfter: time.Minute})
	if _, err := s.Page(context.Background(), connector.PageRequest{Limit: 10}); err == nil || connector.Fatal(err) || !strings.Contains(err.Error(), "longer than") {
		t.Fatalf("long Retry-After: %v", err)
	}
}

// A rejected cursor is a safety stop offering reset; other refusals are
// permanent failures; a first page is never "cursor rejected".
func TestRejectedCursor(t *testing.T) {
	cases := []struct {
		name   string
		cursor string
		answer func(http.ResponseWriter, *http.Request)
		stop   bool
	}{
		{"410 coded", "c", body(410, `{"error":{"code":"cursor_expired","message":"too old"}}`), true},
		{"400 coded", "c", body(400, `{"error":{"code":"cursor_tampered","message":"no"}}`), true},
		{"410 uncoded", "c", body(410, `gone`), true},
		{"400 text naming the cursor", "c", body(400, `Invalid cursor parameter`), true},
		{"400 other code", "c", body(400, `{"error":{"code":"invalid_limit","message":"limit"}}`), false},
		{"401", "c", body(401, `{"error":{"code":"cursor_expired"}}`), false},
		{"first page", "", body(410, `{"error":{"code":"cursor_expired"}}`), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s, clk, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){tc.answer}}, httpsrc.Config{})
			_, err := s.Page(context.Background(), connector.PageRequest{Cursor: tc.cursor, Limit: 10})
			var stop *connector.StopError
			if got := errors.As(err, &stop); got != tc.stop {
				t.Fatalf("stop = %v, want %v: %v", got, tc.stop, err)
			}
			if tc.stop && (!strings.Contains(err.Error(), "tidemark reset") || !strings.Contains(err.Error(), "--to-watermark")) {
				t.Errorf("the stop does not offer reset choices: %v", err)
			}
			if !tc.stop && !errors.Is(err, connector.ErrPermanent) {
				t.Errorf("want permanent: %v", err)
			}
			// A refused page size names the settings that set it.
			if strings.Contains(tc.name, "other code") && (!strings.Contains(err.Error(), "source.http.max_limit") || !strings.Contains(err.Error(), "sync.page_size")) {
				t.Errorf("a refused limit does not name source.http.max_limit and sync.page_size: %v", err)
			}
			if len(clk.Waits()) != 0 {
				t.Errorf("a refusal was retried")
			}
		})
	}
}

func TestConfigValidate(t *testing.T) {
	err := httpsrc.Config{Endpoint: "ftp://x", Pagination: "pages", AuthHeader: "X-Key", SinceParam: "a", CursorParam: "a",
		RejectStatuses: []int{503}, IDPath: "a..b"}.Validate()
	for _, want := range []string{"endpoint", "pagination", "auth header", "must differ", "reject status 503", "empty segment"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("want %q in %v", want, err)
		}
	}
	if !errors.Is(err, httpsrc.ErrBadConfig) {
		t.Error("not ErrBadConfig")
	}
	if err := (httpsrc.Config{Endpoint: "https://api.example.com/v1/changes"}).Validate(); err != nil {
		t.Error(err)
	}
}

func TestCancelDuringWait(t *testing.T) {
	s, err := httpsrc.New(httpsrc.Config{Endpoint: "http://127.0.0.1:1/changes"}) // wall clock, connection refused
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := s.Page(ctx, connector.PageRequest{Limit: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("got %v", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Error("the backoff ignored the context")
	}
}

// The basic-auth password of the endpoint (user info in source.dsn) is not
// copied into the next links the source returns: they are stored in the
// checkpoint and the ledger. The requests still carry it.
func TestLinkCursorHoldsNoCredentials(t *testing.T) {
	const pw = "s3cr3t-pw"
	var auth []string
	var mu sync.Mutex
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		mu.Lock()
		auth = append(auth, fmt.Sprintf("%s:%s:%t", u, p, ok))
		mu.Unlock()
		if r.URL.Query().Get("cursor") == "" {
			w.Header().Set("Link", `</changes?cursor=c2>; rel="next"`)
		}
		fmt.Fprint(w, `{"items":[]}`)
	}))
	t.Cleanup(hs.Close)
	endpoint := strings.Replace(hs.URL, "://", "://svc:"+pw+"@", 1) + "/changes"
	s, _, _ := newSource(t, http.NotFoundHandler(), httpsrc.Config{Endpoint: endpoint, Pagination: httpsrc.PaginateLink})
	p, err := s.Page(context.Background(), connector.PageRequest{Limit: 3})
	if err != nil || p.End {
		t.Fatalf("page 1: %+v %v", p, err)
	}
	if strings.Contains(p.Next, pw) || p.Next != hs.URL+"/changes?cursor=c2" {
		t.Errorf("next link %q, want %q: the stored cursor must not hold the endpoint's password", p.Next, hs.URL+"/changes?cursor=c2")
	}
	if p, err = s.Page(context.Background(), connector.PageRequest{Cursor: p.Next, Limit: 3}); err != nil || !p.End {
		t.Fatalf("page 2: %+v %v", p, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := []string{"svc:" + pw + ":true", "svc:" + pw + ":true"}; !slices.Equal(auth, want) {
		t.Errorf("basic auth of the requests: %q, want %q", auth, want)
	}
}

// With the endpoint's user info kept out of stored links, the progress
// guard still knows a link it has followed: a cycle stops the walk.
func TestLinkCycleWithUserInfoStops(t *testing.T) {
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next := map[string]string{"": "c2", "c2": "c3", "c3": "c2"}[r.URL.Query().Get("cursor")]
		w.Header().Set("Link", `</changes?cursor=`+next+`>; rel="next"`)
		fmt.Fprint(w, `{"items":[`+oneItem+`]}`)
	}))
	t.Cleanup(hs.Close)
	endpoint := strings.Replace(hs.URL, "://", "://svc:pw@", 1) + "/changes"
	s, _, _ := newSource(t, http.NotFoundHandler(), httpsrc.Config{Endpoint: endpoint, Pagination: httpsrc.PaginateLink})
	pages, err := walk(s, 50)
	wantStop(t, err, "cycle")
	if pages != 2 {
		t.Errorf("stopped after %d pages, want 2 (the third names c2 again)", pages)
	}
}

// A page that holds one id twice in two versions is a change log, not the
// current state of each row: the older version would be published again
// after the newer one on every pass. It is refused, naming both items; the
// same item twice is only a repeat.
func TestPageWithTwoVersionsOfAnIdIsRefused(t *testing.T) {
	for _, tc := range []struct{ name, items, want string }{
		{"in order", `{"id":"a","updated_at":"2026-01-01T00:00:01Z","v":1},{"id":"b","updated_at":"2026-01-01T00:00:02Z"},{"id":"a","updated_at":"2026-01-01T00:00:03Z","v":2}`, "items 0 and 2"},
		{"out of order", `{"id":"a","updated_at":"2026-01-01T00:00:03Z","v":2},{"id":"a","updated_at":"2026-01-01T00:00:01Z","v":1}`, "items 0 and 1"},
		{"same time", `{"id":7,"updated_at":"2026-01-01T00:00:01Z","v":1},{"id":7,"updated_at":"2026-01-01T00:00:01Z","v":2}`, "items 0 and 1"},
	} {
		s, _, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(200, `{"items":[`+tc.items+`],"next_cursor":null}`)}}, httpsrc.Config{})
		_, err := s.Page(context.Background(), connector.PageRequest{Limit: 10})
		if !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "change log") {
			t.Errorf("%s: %v, want a permanent error naming %s and a change log", tc.name, err, tc.want)
		}
	}
	s, _, _ := newSource(t, &canned{answers: []func(http.ResponseWriter, *http.Request){body(200, `{"items":[`+oneItem+`,`+oneItem+`],"next_cursor":null}`)}}, httpsrc.Config{})
	if p, err := s.Page(context.Background(), connector.PageRequest{Limit: 10}); err != nil || len(p.Rows) != 2 {
		t.Errorf("the same item twice: %+v %v", p, err)
	}
}
