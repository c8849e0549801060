package feed

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func newTestServer(t *testing.T, cfg Config) (*Server, *httptest.Server) {
	t.Helper()
	if cfg.Key == nil {
		cfg.Key = testKey
	}
	if cfg.Collection == "" {
		cfg.Collection = "public.items"
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(s)
	t.Cleanup(hs.Close)
	return s, hs
}

type answer struct {
	status int
	hdr    http.Header
	resp   Response
	err    ErrorBody
	raw    string
}

func get(t *testing.T, base string, q url.Values) answer {
	t.Helper()
	u := base + "/changes"
	if q != nil {
		u += "?" + q.Encode()
	}
	r, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		t.Fatal(err)
	}
	a := answer{status: r.StatusCode, hdr: r.Header, raw: string(b)}
	if r.StatusCode == 200 {
		err = json.Unmarshal(b, &a.resp)
	} else {
		err = json.Unmarshal(b, &a.err)
	}
	if err != nil {
		t.Fatalf("body %q: %v", b, err)
	}
	return a
}

func seed(m *memTable, n int) {
	for i := range n {
		m.set(fmt.Sprintf("k%04d", i), t0.Add(time.Duration(i/3)*time.Microsecond), false) // ties of 3, 1 µs apart
	}
}

func TestLimit(t *testing.T) {
	m := newMem()
	seed(m, 700)
	_, hs := newTestServer(t, Config{Table: m})
	for _, bad := range []string{"0", "-1", "501", "abc", "", "1e2", "+5", " 5", "99999999999999999999"} {
		a := get(t, hs.URL, url.Values{"limit": {bad}})
		if a.status != 400 || a.err.Error.Code != CodeInvalidLimit || a.err.Error.Message == "" {
			t.Errorf("limit %q: got %d %s", bad, a.status, a.raw)
		}
	}
	if a := get(t, hs.URL, url.Values{"limit": {"1", "2"}}); a.status != 400 || a.err.Error.Code != CodeInvalidLimit {
		t.Errorf("two limits: %d %s", a.status, a.raw)
	}
	a := get(t, hs.URL, nil)
	if a.status != 200 || len(a.resp.Items) != 100 || a.resp.Limit != 100 || !a.resp.HasMore || a.resp.NextCursor == nil {
		t.Errorf("no limit: %d, %d items, limit %d, has_more %v", a.status, len(a.resp.Items), a.resp.Limit, a.resp.HasMore)
	}
	for _, n := range []int{1, 37, 500} {
		a := get(t, hs.URL, url.Values{"limit": {fmt.Sprint(n)}})
		if a.status != 200 || len(a.resp.Items) != n || a.resp.Limit != n {
			t.Errorf("limit %d: %d, %d items, echoed %d", n, a.status, len(a.resp.Items), a.resp.Limit)
		}
	}
}

// walkAll follows next_cursor to the end and returns the ids in order.
func walkAll(t *testing.T, base string, q url.Values) []string {
	t.Helper()
	var ids []string
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("walk does not end")
		}
		a := get(t, base, q)
		if a.status != 200 {
			t.Fatalf("page %d: %d %s", i, a.status, a.raw)
		}
		for _, it := range a.resp.Items {
			ids = append(ids, it.ID)
		}
		if a.resp.NextCursor == nil {
			if a.resp.HasMore || a.hdr.Get("Link") != "" {
				t.Fatalf("end page has has_more %v, Link %q", a.resp.HasMore, a.hdr.Get("Link"))
			}
			return ids
		}
		if !a.resp.HasMore {
			t.Fatal("next_cursor without has_more")
		}
		link := a.hdr.Get("Link")
		if !strings.Contains(link, `rel="next"`) || !strings.Contains(link, url.QueryEscape(*a.resp.NextCursor)) {
			t.Fatalf("Link %q does not carry the next cursor", link)
		}
		q = url.Values{"cursor": {*a.resp.NextCursor}, "limit": q["limit"]}
	}
}

func TestWalkTiesSinceAndDeletedAnchor(t *testing.T) {
	m := newMem()
	seed(m, 20)
	m.set("gone", t0.Add(time.Hour), true)
	_, hs := newTestServer(t, Config{Table: m})
	ids := walkAll(t, hs.URL, url.Values{"limit": {"4"}})
	if len(ids) != 21 || ids[0] != "k0000" || ids[20] != "gone" {
		t.Fatalf("walk: %v", ids)
	}
	// since is an inclusive lower bound.
	ids = walkAll(t, hs.URL, url.Values{"limit": {"4"}, "since": {"2026-01-01T00:00:00.000003Z"}})
	if len(ids) != 21-9 || ids[0] != "k0009" {
		t.Fatalf("since: %v", ids)
	}
	// The anchor of a cursor is hard-deleted: the walk goes on after it.
	a := get(t, hs.URL, url.Values{"limit": {"5"}})
	m.del("k0004")
	b := get(t, hs.URL, url.Values{"limit": {"5"}, "cursor": {*a.resp.NextCursor}})
	if b.status != 200 || b.resp.Items[0].ID != "k0005" {
		t.Fatalf("after a deleted anchor: %d %s", b.status, b.raw)
	}
	// Soft deletes are served as deletions with null data.
	a = get(t, hs.URL, url.Values{"since": {"2026-01-01T01:00:00Z"}})
	if len(a.resp.Items) != 1 || !a.resp.Items[0].Deleted || string(a.resp.Items[0].Data) != "null" || a.resp.HasMore {
		t.Fatalf("deleted: %s", a.raw)
	}
	if a := get(t, hs.URL, url.Values{"since": {"yesterday"}}); a.status != 400 || a.err.Error.Code != CodeInvalidSince {
		t.Errorf("bad since: %d %s", a.status, a.raw)
	}
	if a := get(t, hs.URL, url.Values{"since": {"2026-01-01T00:00:00.0000001Z"}}); a.status != 400 || a.err.Error.Code != CodeInvalidSince {
		t.Errorf("sub-microsecond since: %d %s", a.status, a.raw)
	}
}

func TestCursorRejections(t *testing.T) {
	m := newMem()
	seed(m, 10)
	now := t0
	clock := func() time.Time { return now }
	_, hs := newTestServer(t, Config{Table: m, Filter: "region = 'eu'", Tenant: "acme", Now: clock, CursorTTL: time.Hour})
	_, otherFilter := newTestServer(t, Config{Table: m, Filter: "region = 'us'", Tenant: "acme", Now: clock})
	_, otherTenant := newTestServer(t, Config{Table: m, Filter: "region = 'eu'", Tenant: "globex", Now: clock})
	_, otherKey := newTestServer(t, Config{Table: m, Filter: "region = 'eu'", Tenant: "acme", Now: clock, Key: []byte("another key, 16 bytes or more")})

	a := get(t, hs.URL, url.Values{"limit": {"3"}})
	cur := *a.resp.NextCursor
	dec, cerr := DecodeCursor(testKey, cur)
	if cerr != nil || dec.ID != "k0002" || !dec.UpdatedAt.Equal(t0) {
		t.Fatalf("decode own cursor: %+v %v", dec, cerr)
	}
	raw, _ := b64(cur)
	flipped := append([]byte(nil), raw...)
	flipped[len(flipped)-40] ^= 1 // inside the id / key
	future := append([]byte{2}, raw[1:len(raw)-macLen]...)

	cases := []struct {
		name, base, cursor string
		status             int
		code               string
	}{
		{"tampered", hs.URL, enc(flipped), 400, CodeCursorTampered},
		{"truncated", hs.URL, enc(raw[:len(raw)-6]), 400, CodeCursorTampered},
		{"garbage", hs.URL, "abc", 400, CodeInvalidCursor},
		{"not base64", hs.URL, "!!!!", 400, CodeInvalidCursor},
		{"empty", hs.URL, "", 400, CodeInvalidCursor},
		{"sql", hs.URL, "1; DROP TABLE items; --", 400, CodeInvalidCursor},
		{"other key", otherKey.URL, cur, 400, CodeCursorTampered},
		{"foreign filter", otherFilter.URL, cur, 400, CodeCursorForeign},
		{"foreign tenant", otherTenant.URL, cur, 400, CodeCursorForeign},
		{"unsupported version", hs.URL, seal(testKey, future), 400, CodeCursorVersion},
	}
	for _, c := range cases {
		a := get(t, c.base, url.Values{"cursor": {c.cursor}})
		if a.status != c.status || a.err.Error.Code != c.code || a.err.Error.Message == "" {
			t.Errorf("%s: got %d %s, want %d %s", c.name, a.status, a.raw, c.status, c.code)
		}
	}
	// Expiry: the same cursor is fine within the TTL and 410 after it.
	now = t0.Add(59 * time.Minute)
	if a := get(t, hs.URL, url.Values{"cursor": {cur}}); a.status != 200 {
		t.Errorf("within TTL: %d %s", a.status, a.raw)
	}
	now = t0.Add(61 * time.Minute)
	if a := get(t, hs.URL, url.Values{"cursor": {cur}}); a.status != 410 || a.err.Error.Code != CodeCursorExpired {
		t.Errorf("expired: %d %s", a.status, a.raw)
	}
}

func TestAuthAndMethod(t *testing.T) {
	m := newMem()
	seed(m, 1)
	_, hs := newTestServer(t, Config{Table: m, AuthToken: "s3cret"})
	if a := get(t, hs.URL, nil); a.status != 401 || a.err.Error.Code != CodeUnauthorized {
		t.Errorf("no token: %d %s", a.status, a.raw)
	}
	req, _ := http.NewRequest("GET", hs.URL+"/changes", nil)
	req.Header.Set("Authorization", "Bearer s3cret")
	r, err := http.DefaultClient.Do(req)
	if err != nil || r.StatusCode != 200 {
		t.Fatalf("with token: %v %v", r, err)
	}
	r.Body.Close()
	r, err = http.Post(hs.URL+"/changes", "application/json", nil)
	if err != nil || r.StatusCode != 405 {
		t.Fatalf("POST: %v %v", r, err)
	}
	r.Body.Close()
}

func TestFaults(t *testing.T) {
	m := newMem()
	seed(m, 10)
	s, hs := newTestServer(t, Config{Table: m})
	s.SetFaults(func(r FaultRequest) Fault {
		switch r.N {
		case 1:
			return Fault{Status: 429, RetryAfter: "7"}
		case 2:
			return Fault{Status: 503, RetryAfter: "Thu, 01 Jan 2026 00:00:09 GMT"}
		case 3:
			return Fault{Truncate: true}
		case 4:
			return Fault{RejectCursor: CodeCursorExpired}
		}
		return Fault{}
	})
	a := get(t, hs.URL, nil)
	if a.status != 429 || a.hdr.Get("Retry-After") != "7" || a.err.Error.Code != CodeRateLimited {
		t.Errorf("429: %d %v %s", a.status, a.hdr, a.raw)
	}
	a = get(t, hs.URL, nil)
	if a.status != 503 || a.hdr.Get("Retry-After") == "" || a.err.Error.Code != CodeUnavailable {
		t.Errorf("503: %d %s", a.status, a.raw)
	}
	r, err := http.Get(hs.URL + "/changes")
	if err == nil {
		_, err = io.ReadAll(r.Body)
		r.Body.Close()
	}
	if err == nil {
		t.Errorf("truncated: read the whole body")
	}
	// A first page is not cursor-rejected; request 4 has no cursor.
	if a := get(t, hs.URL, nil); a.status != 200 {
		t.Errorf("reject without cursor: %d", a.status)
	}
	s.SetFaults(func(r FaultRequest) Fault { return Fault{RejectCursor: CodeCursorExpired} })
	c := *get(t, hs.URL, url.Values{"limit": {"2"}}).resp.NextCursor
	if a := get(t, hs.URL, url.Values{"cursor": {c}}); a.status != 410 || a.err.Error.Code != CodeCursorExpired {
		t.Errorf("reject: %d %s", a.status, a.raw)
	}
	if s.Requests() < 6 {
		t.Errorf("requests: %d", s.Requests())
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{Table: newMem(), Key: []byte("short")}); err == nil {
		t.Error("short key accepted")
	}
	if _, err := New(Config{Key: testKey}); err == nil {
		t.Error("nil table accepted")
	}
}
