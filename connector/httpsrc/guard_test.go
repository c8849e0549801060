package httpsrc_test

// The progress guard (docs/http-source.md, "When the server makes no
// progress"): hostile servers that repeat a cursor, alternate between two,
// or answer with empty pages that say there is more.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/httpsrc"
)

// script answers every request with next(cursor parameter, request number):
// the body's items and its next cursor ("" for null).
type script struct {
	mu   sync.Mutex
	n    int
	seen []string
	next func(cursor string, n int) (items string, next string)
}

func (s *script) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.n++
	n := s.n
	cur := r.URL.Query().Get("cursor")
	s.seen = append(s.seen, cur)
	s.mu.Unlock()
	items, next := s.next(cur, n)
	nc, more := "null", "false"
	if next != "" {
		nc, more = fmt.Sprintf("%q", next), "true"
	}
	fmt.Fprintf(w, `{"items":[%s],"next_cursor":%s,"has_more":%s}`, items, nc, more)
}

func (s *script) requests() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

const oneItem = `{"id":"a","updated_at":"2026-01-01T00:00:00.000001Z"}`

// walk drives s as the engine does: every request carries the previous
// page's next cursor, until the end, an error or max pages.
func walk(s *httpsrc.Source, max int) (pages int, err error) {
	req := connector.PageRequest{Limit: 10}
	for pages < max {
		p, err := s.Page(context.Background(), req)
		if err != nil {
			return pages, err
		}
		pages++
		if p.End {
			return pages, nil
		}
		req.Cursor = p.Next
	}
	return pages, nil
}

func wantStop(t *testing.T, err error, fragments ...string) {
	t.Helper()
	var stop *connector.StopError
	if !errors.As(err, &stop) {
		t.Fatalf("want a safety stop (*connector.StopError, exit 3), got %v", err)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Errorf("the stop does not name %q:\n%v", f, err)
		}
	}
}

// A page whose next cursor is its own request cursor would be read again
// forever: the second request already stops, naming the cursor.
func TestGuardRepeatedCursor(t *testing.T) {
	srv := &script{next: func(string, int) (string, string) { return oneItem, "c-same" }}
	s, _, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more"})
	pages, err := walk(s, 200)
	wantStop(t, err, `"c-same"`, "tidemark reset")
	if pages != 1 || srv.requests() != 2 {
		t.Errorf("stopped after %d pages and %d requests, want 1 and 2", pages, srv.requests())
	}
}

// Two cursors that point at each other are a cycle: the third request
// (back to the first cursor) stops.
func TestGuardAlternatingCursors(t *testing.T) {
	srv := &script{next: func(cur string, _ int) (string, string) {
		if cur == "c-a" {
			return oneItem, "c-b"
		}
		return oneItem, "c-a"
	}}
	s, _, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more"})
	pages, err := walk(s, 200)
	wantStop(t, err, `"c-a"`, `"c-b"`)
	if srv.requests() != 3 || pages != 2 {
		t.Errorf("stopped after %d pages and %d requests, want 2 and 3", pages, srv.requests())
	}
}

// Empty pages that say there is more, each with a fresh cursor: every one
// is followed by a capped, growing backoff (no hot loop), and
// MaxEmptyPages of them in a row are a safety stop naming the cursor.
func TestGuardEmptyPagesBackOffThenStop(t *testing.T) {
	srv := &script{next: func(_ string, n int) (string, string) { return "", fmt.Sprintf("e%d", n) }}
	s, clk, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more", MaxEmptyPages: 6,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
	_, err := walk(s, 200)
	wantStop(t, err, `"e5"`, "6 pages in a row")
	if srv.requests() != 6 {
		t.Errorf("%d requests, want 6", srv.requests())
	}
	caps := []time.Duration{100 * time.Millisecond, 200 * time.Millisecond, 400 * time.Millisecond, 800 * time.Millisecond, time.Second}
	waits := clk.Waits()
	if len(waits) != len(caps) {
		t.Fatalf("waits %v, want one before each request after an empty page (%d)", waits, len(caps))
	}
	for i, w := range waits {
		if w < caps[i]/2 || w > caps[i] {
			t.Errorf("wait %d = %s, want within [%s, %s]", i+1, w, caps[i]/2, caps[i])
		}
	}
}

// A sparse but honest API: runs of empty pages shorter than the bound,
// broken by pages with items, walk to the end; a page with items resets
// the count and the backoff.
func TestGuardEmptyRunsThatProgress(t *testing.T) {
	srv := &script{next: func(_ string, n int) (string, string) {
		switch {
		case n == 12:
			return oneItem, ""
		case n%3 == 0:
			return oneItem, fmt.Sprintf("p%d", n)
		}
		return "", fmt.Sprintf("p%d", n)
	}}
	s, clk, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more", MaxEmptyPages: 3,
		BackoffBase: 100 * time.Millisecond, BackoffMax: time.Second})
	pages, err := walk(s, 200)
	if err != nil || pages != 12 {
		t.Fatalf("walked %d pages: %v", pages, err)
	}
	waits := clk.Waits()
	if len(waits) != 8 { // after each of the 8 empty pages
		t.Fatalf("waits %v, want 8", waits)
	}
	for i, w := range waits {
		limit := 100 * time.Millisecond
		if i%2 == 1 {
			limit = 200 * time.Millisecond
		}
		if w > limit {
			t.Errorf("wait %d = %s: the backoff did not restart after a page with items", i+1, w)
		}
	}
}

// A resumed walk (the engine re-reads from its committed cursor after a
// failure) asks for a cursor again: that is not a cycle.
func TestGuardResumeIsNotACycle(t *testing.T) {
	srv := &script{next: func(cur string, _ int) (string, string) {
		switch cur {
		case "":
			return oneItem, "c1"
		case "c1":
			return oneItem, "c2"
		}
		return oneItem, ""
	}}
	s, _, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more"})
	ctx := context.Background()
	for _, step := range []struct{ cur, next string }{{"", "c1"}, {"c1", "c2"}, {"c1", "c2"}, {"c2", ""}, {"", "c1"}} {
		p, err := s.Page(ctx, connector.PageRequest{Cursor: step.cur, Limit: 10})
		if err != nil || p.Next != step.next {
			t.Fatalf("page after %q: %+v, %v", step.cur, p, err)
		}
	}
}

// With link pagination the cursor is a URL that may carry the endpoint's
// query secrets: the stop names it with them redacted.
func TestGuardLinkCursorRedacted(t *testing.T) {
	var base string
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Link", "<"+base+"/changes?api_key=s3cr3t-v4lue&page=7>; rel=next")
		fmt.Fprint(w, `{"items":[]}`)
	})
	s, _, hs := newSource(t, h, httpsrc.Config{Pagination: httpsrc.PaginateLink})
	base = hs.URL
	_, err := walk(s, 50)
	wantStop(t, err, "page=7", "REDACTED")
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("the stop prints the api key: %v", err)
	}
}

// Through the engine: a server repeating its cursor stops the run with a
// safety stop (exit 3) within a few requests, instead of looping, and the
// checkpoint is marked as needing a decision.
func TestGuardStopsTheEngine(t *testing.T) {
	srv := &script{next: func(cur string, _ int) (string, string) {
		if cur == "" {
			return oneItem, "c-loop"
		}
		return `{"id":"b","updated_at":"2026-01-01T00:00:00.000002Z"}`, "c-loop"
	}}
	s, _, _ := newSource(t, srv, httpsrc.Config{HasMorePath: "has_more"})
	r := newRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := r.engine(s, connector.Config{PageSize: 10}).Run(ctx, connector.Once)
	wantStop(t, err, `"c-loop"`)
	if n := srv.requests(); n > 3 {
		t.Errorf("%d requests before the stop", n)
	}
	cp, err := r.store().Load(context.Background())
	if err != nil || cp == nil || !strings.Contains(cp.NeedsDecision, "c-loop") {
		t.Errorf("the checkpoint is not marked as needing a decision naming the cursor: %+v, %v", cp, err)
	}
}

// An upstream's error body reaches messages escaped: no terminal escape, no
// carriage return or line feed that could forge a log line.
func TestErrorBodiesEscaped(t *testing.T) {
	for name, answer := range map[string]func(http.ResponseWriter, *http.Request){
		"plain 403":  body(403, "\x1b[2J\x1b[31mdenied\r\ntime=2026-01-01 level=INFO msg=\"all good\"\x07\xff"),
		"JSON 401":   body(401, `{"error":{"code":"nope\u001b[0m","message":"bad\r\nlevel=INFO msg=forged"}}`),
		"JSON 503":   body(503, `{"error":{"message":"down\u001b]0;title\u0007\n"}}`),
		"rejected":   body(410, "\x1b[1mgone\ncursor\r"),
		"plain 5xx":  body(500, "\x9b31m\u2028oops"),
		"text retry": body(429, "slow down\x1b[0m\n"),
	} {
		t.Run(name, func(t *testing.T) {
			s, _, _ := newSource(t, http.HandlerFunc(answer), httpsrc.Config{MaxRetries: 1})
			_, err := s.Page(context.Background(), connector.PageRequest{Cursor: "c", Limit: 10})
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			if name == "rejected" {
				msg = strings.SplitN(msg, "\n  what to do:", 2)[0] // the hint's own line break
			}
			if strings.ContainsAny(msg, "\x1b\r\n\x07\x9b\u2028") || !utf8Valid(msg) {
				t.Errorf("unescaped control characters reach the message: %q", msg)
			}
			if !strings.Contains(msg, `\x1b`) && !strings.Contains(msg, `\u2028`) && !strings.Contains(msg, `\n`) {
				t.Errorf("the message lost the body instead of escaping it: %q", msg)
			}
		})
	}
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\uFFFD") == s }

// A rejected link cursor is named with the endpoint's query secrets
// redacted: the stop's reason is printed and stored in the checkpoint.
func TestRejectedLinkCursorRedacted(t *testing.T) {
	s, _, hs := newSource(t, http.HandlerFunc(body(410, `{"error":{"code":"cursor_expired"}}`)), httpsrc.Config{Pagination: httpsrc.PaginateLink})
	_, err := s.Page(context.Background(), connector.PageRequest{Cursor: hs.URL + "/changes?page=9&access_token=s3cr3t-v4lue", Limit: 10})
	wantStop(t, err, "page=9", "access_token=REDACTED")
	if strings.Contains(err.Error(), "s3cr3t") {
		t.Errorf("the stop prints the token: %v", err)
	}
}
