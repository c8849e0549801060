package feed

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
)

// linkFor GETs the first page of two items with extra request headers and
// returns the Link header.
func linkFor(t *testing.T, base string, hdr map[string]string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, base+"/changes?limit=2", nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	return resp.Header.Get("Link")
}

// The next link never comes from the client's Host header: by default it is
// a reference relative to the request; with PublicURL it is that URL; the
// X-Forwarded-Proto and X-Forwarded-Host headers count only with
// TrustForwarded.
func TestLinkNotFromHostHeader(t *testing.T) {
	m := newMem()
	seed(m, 5)
	_, plain := newTestServer(t, Config{Table: m})
	_, public := newTestServer(t, Config{Table: m, PublicURL: "https://api.example.com/v1/changes"})
	_, trusted := newTestServer(t, Config{Table: m, TrustForwarded: true})
	evil := map[string]string{"Host": "evil.example", "X-Forwarded-Host": "evil.example", "X-Forwarded-Proto": "https"}
	for _, tc := range []struct {
		name, base string
		hdr        map[string]string
		prefix     string
	}{
		{"default, hostile Host", plain.URL, evil, "</changes?"},
		{"public URL, hostile Host", public.URL, evil, "<https://api.example.com/v1/changes?"},
		{"trusted proxy", trusted.URL, map[string]string{"X-Forwarded-Host": "feed.example.com", "X-Forwarded-Proto": "https"}, "<https://feed.example.com/changes?"},
		{"trusted proxy, bad host", trusted.URL, map[string]string{"X-Forwarded-Host": "a b>; rel=x", "X-Forwarded-Proto": "https"}, "</changes?"},
		{"trusted proxy, no headers", trusted.URL, map[string]string{"Host": "evil.example"}, "</changes?"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link := linkFor(t, tc.base, tc.hdr)
			if !strings.HasPrefix(link, tc.prefix) || !strings.HasSuffix(link, `>; rel="next"`) {
				t.Errorf("Link %q, want it to start with %q", link, tc.prefix)
			}
			if strings.Contains(link, "evil") {
				t.Errorf("Link %q follows the client's headers", link)
			}
			target := strings.TrimPrefix(strings.SplitN(link, ">", 2)[0], "<")
			u, err := url.Parse(target)
			if err != nil || u.Query().Get("cursor") == "" || u.Query().Get("limit") != "2" {
				t.Errorf("Link target %q lacks the cursor or the limit", target)
			}
		})
	}
	for _, bad := range []string{"api.example.com/changes", "ftp://x/changes", "https://x/changes?a=b", "https:///changes"} {
		if _, err := New(Config{Table: m, Key: testKey, PublicURL: bad}); err == nil {
			t.Errorf("PublicURL %q accepted", bad)
		}
	}
}

// A cursor key needs real entropy, not only 16 bytes.
func TestWeakKeyRefused(t *testing.T) {
	for _, k := range []string{"aaaaaaaaaaaaaaaa", "abababababababababababababababab", "aaaaaaaabbbbbbbbccccccccdddddddd", "0000000000000000000000000000000000000000"} {
		if _, err := New(Config{Table: newMem(), Key: []byte(k)}); err == nil || !strings.Contains(err.Error(), "urandom") {
			t.Errorf("key %q: %v, want a refusal saying how to make a key", k, err)
		}
	}
	for _, k := range []string{string(testKey), "k7Qp2Zr9XvB4mN8s", "3q2+7w1XJ0b4eVl8Tn6YpA9cRz5uKm0HgSd/Fi1LxWo=", "9f86d081884c7d659a2feaa0c55ad015"} {
		if _, err := New(Config{Table: newMem(), Key: []byte(k)}); err != nil {
			t.Errorf("key %q refused: %v", k, err)
		}
	}
}
