package feed

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// Limits of the limit parameter (docs/http-source.md).
const (
	DefaultLimit = 100
	MaxLimit     = 500
)

// Table is the upstream a Server serves: a keyset walk in (updated_at, id)
// order that can be positioned strictly after a sort key. *postgres.Source
// implements it.
type Table interface {
	// Page reads the next page; see connector.Source.
	Page(ctx context.Context, req connector.PageRequest) (connector.Page, error)
	// CursorAfter returns the Table's own cursor for "strictly after
	// (updatedAt, id)".
	CursorAfter(updatedAt time.Time, id string) string
}

// Config configures a Server.
type Config struct {
	// Table is the data served. Required.
	Table Table
	// Key authenticates cursors (HMAC-SHA256): at least 16 bytes with real
	// entropy (CheckKey), 32 random bytes recommended. Servers that share a key recognise each other's
	// cursors as foreign rather than tampered. Required.
	Key []byte
	// Collection, Filter and Tenant name what is served. They are not
	// interpreted here (the Table applies any filter); their fingerprint
	// binds every cursor, so a cursor minted for another collection, filter
	// or tenant is refused with cursor_foreign.
	Collection, Filter, Tenant string
	// CursorTTL, when positive, refuses cursors older than this with
	// 410 cursor_expired. Default 0: cursors never expire.
	CursorTTL time.Duration
	// AuthToken, when set, requires "Authorization: Bearer <AuthToken>".
	// Default "": no authentication.
	AuthToken string
	// PublicURL, when set, is the changes endpoint's public URL (scheme,
	// host and path, e.g. https://api.example.com/v1/changes): next links
	// are built on it. Default "": next links are references relative to
	// the request (/changes?cursor=...), never built from the client's
	// Host header.
	PublicURL string
	// TrustForwarded builds next links from X-Forwarded-Proto and
	// X-Forwarded-Host when PublicURL is not set. Set it only behind a
	// proxy that sets (or strips) both. Default false.
	TrustForwarded bool
	// Faults injects failures for tests; nil in production. It can be
	// changed later with SetFaults.
	Faults Faults
	// Now is the clock for minting and expiring cursors; default time.Now.
	Now func() time.Time
	// Logger; default slog.Default(). The cursors clients hold and tokens
	// are never logged; a failed page names the table position it read
	// after (updated_at and id), which is no secret.
	Logger *slog.Logger
}

// Server serves a Table as a cursor-paginated changes API (docs/http-source.md):
//
//	GET <path>?since=<RFC 3339>&cursor=<opaque>&limit=<1..500>
//
// It is an http.Handler; mount it on any path.
type Server struct {
	cfg    Config
	fp     [fpLen]byte
	faults atomic.Pointer[Faults]
	n      atomic.Int64
}

// New returns a Server.
func New(cfg Config) (*Server, error) {
	if cfg.Table == nil {
		return nil, errors.New("feed: Config.Table is required")
	}
	if err := CheckKey(cfg.Key); err != nil {
		return nil, fmt.Errorf("feed: %w", err)
	}
	if cfg.PublicURL != "" {
		u, err := url.Parse(cfg.PublicURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
			return nil, fmt.Errorf("feed: the public URL %q is not an http(s) URL of the endpoint without user info, query or fragment; write e.g. https://api.example.com/v1/changes", cfg.PublicURL)
		}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &Server{cfg: cfg, fp: Fingerprint(cfg.Collection, cfg.Filter, cfg.Tenant)}
	s.SetFaults(cfg.Faults)
	return s, nil
}

// SetFaults replaces the fault hook (nil: none). Safe while serving.
func (s *Server) SetFaults(f Faults) {
	if f == nil {
		s.faults.Store(nil)
		return
	}
	s.faults.Store(&f)
}

// page reads one page. Like a pass of the connector, a walk's first page
// (no cursor) reads the table's shape again first (one catalog row), so a
// column added or retyped is served from then on; a page that fails does
// too, and is read once more: a column retyped during a walk fails its
// pages until the shape is read again.
func (s *Server) page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	rs, ok := s.cfg.Table.(connector.Reshaper)
	reshape := func() error {
		ch, err := rs.Reshape(ctx)
		if ch != nil {
			s.cfg.Logger.Warn("feed: the table's columns changed: items from now on carry the new shape",
				"added", ch.Added, "dropped", ch.Dropped, "retyped", ch.Retyped, "table_replaced", ch.Replaced, "old", ch.Old, "new", ch.New)
		}
		return err
	}
	if ok && req.Cursor == "" {
		if err := reshape(); err != nil {
			return connector.Page{}, err
		}
	}
	page, err := s.cfg.Table.Page(ctx, req)
	if err != nil && ok && ctx.Err() == nil {
		if rerr := reshape(); rerr != nil {
			return connector.Page{}, rerr
		}
		page, err = s.cfg.Table.Page(ctx, req)
	}
	return page, err
}

// Requests returns how many requests the server has received.
func (s *Server) Requests() int64 { return s.n.Load() }

// Response is the body of a successful page.
type Response struct {
	// Items in (updated_at, id) order.
	Items []Item `json:"items"`
	// NextCursor is the cursor of the next page, or null at the end of the
	// walk.
	NextCursor *string `json:"next_cursor"`
	// HasMore is false exactly when NextCursor is null.
	HasMore bool `json:"has_more"`
	// Limit is the effective limit of this page.
	Limit int `json:"limit"`
}

// Item is one row's current state.
type Item struct {
	// ID is the row's id as text.
	ID string `json:"id"`
	// UpdatedAt is RFC 3339 UTC with exactly six fractional digits.
	UpdatedAt string `json:"updated_at"`
	// Deleted is true for a soft-deleted row; Data is then null.
	Deleted bool `json:"deleted"`
	// Data is the row as a JSON object in the Table's encoding (for
	// PostgreSQL, docs/design.md, Records).
	Data json.RawMessage `json:"data"`
}

// ErrorBody is the body of every error answer.
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

var limitRE = regexp.MustCompile(`^[0-9]{1,9}$`)

// ServeHTTP serves one page.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, CodeMethod, "use GET", "")
		return
	}
	if tok := s.cfg.AuthToken; tok != "" {
		got := r.Header.Get("Authorization")
		if subtle.ConstantTimeCompare([]byte(got), []byte("Bearer "+tok)) != 1 {
			writeError(w, http.StatusUnauthorized, CodeUnauthorized, "send Authorization: Bearer <token>", "")
			return
		}
	}
	q := r.URL.Query()
	n := s.n.Add(1)
	var fault Fault
	if f := s.faults.Load(); f != nil {
		fault = (*f)(FaultRequest{N: n, Cursor: q.Get("cursor"), Query: q})
	}
	if fault.Delay > 0 {
		t := time.NewTimer(fault.Delay)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if fault.Status != 0 {
		code := CodeInternal
		switch fault.Status {
		case http.StatusTooManyRequests:
			code = CodeRateLimited
		case http.StatusServiceUnavailable:
			code = CodeUnavailable
		}
		writeError(w, fault.Status, code, "injected fault", fault.RetryAfter)
		return
	}

	limit, cerr := parseLimit(q)
	if cerr != nil {
		writeError(w, cerr.Status, cerr.Code, cerr.Msg, "")
		return
	}
	req := connector.PageRequest{Limit: limit + 1} // one more to know whether there is more
	if vs, ok := q["since"]; ok {
		since, err := schemas.ParseTime(vs[0])
		if len(vs) != 1 || err != nil {
			writeError(w, http.StatusBadRequest, CodeInvalidSince, "since must be one RFC 3339 timestamp with at most microseconds, e.g. 2026-01-31T12:00:00.000000Z", "")
			return
		}
		req.Since = since
	}
	if vs, ok := q["cursor"]; ok {
		if len(vs) != 1 {
			writeError(w, http.StatusBadRequest, CodeInvalidCursor, "give one cursor", "")
			return
		}
		if fault.RejectCursor != "" {
			st := http.StatusBadRequest
			if fault.RejectCursor == CodeCursorExpired {
				st = http.StatusGone
			}
			writeError(w, st, fault.RejectCursor, "injected fault: the cursor is rejected", "")
			return
		}
		c, cerr := s.checkCursor(vs[0])
		if cerr != nil {
			writeError(w, cerr.Status, cerr.Code, cerr.Msg, "")
			return
		}
		// The cursor is past since already; it supersedes it.
		req.Cursor = s.cfg.Table.CursorAfter(c.UpdatedAt, c.ID)
	}

	page, err := s.page(r.Context(), req)
	if err != nil {
		if r.Context().Err() != nil {
			return
		}
		s.cfg.Logger.Error("feed: read page", "err", err)
		status, msg := http.StatusInternalServerError, "reading the table failed; retry later"
		var stop *connector.StopError
		if errors.As(err, &stop) {
			status, msg = http.StatusServiceUnavailable, "the table changed and no longer meets the requirements; the server log says what to do"
		}
		writeError(w, status, CodeInternal, msg, "")
		return
	}
	rows := page.Rows
	more := len(rows) > limit
	if more {
		rows = rows[:limit]
	}
	var next string
	if more {
		last := rows[len(rows)-1]
		next = EncodeCursor(s.cfg.Key, Cursor{Fingerprint: s.fp, Issued: s.cfg.Now(), UpdatedAt: last.UpdatedAt, ID: last.ID})
		w.Header().Set("Link", "<"+s.nextURL(r, next, limit)+`>; rel="next"`)
	}
	body := appendPage(make([]byte, 0, 256+len(rows)*256), rows, next, limit)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if fault.Truncate {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body[:len(body)/2])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		panic(http.ErrAbortHandler) // drop the connection mid-body
	}
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
}

// appendPage encodes a Response. It is written by hand rather than with
// encoding/json so that each item's data is the Table's encoding byte for
// byte (encoding/json would re-compact it): a table read through the feed
// yields the same record values as the PostgreSQL source.
func appendPage(b []byte, rows []connector.Row, next string, limit int) []byte {
	b = append(b, `{"items":[`...)
	for i, row := range rows {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, row.ID)
		b = append(b, `,"updated_at":"`...)
		b = schemas.AppendTime(b, row.UpdatedAt)
		b = append(b, `","deleted":`...)
		b = strconv.AppendBool(b, row.Deleted)
		b = append(b, `,"data":`...)
		if row.Deleted || row.Value == nil {
			b = append(b, "null"...)
		} else {
			b = append(b, row.Value...)
		}
		b = append(b, '}')
	}
	b = append(b, `],"next_cursor":`...)
	if next == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, next)
	}
	b = append(b, `,"has_more":`...)
	b = strconv.AppendBool(b, next != "")
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, int64(limit), 10)
	return append(b, "}\n"...)
}

func appendJSONString(b []byte, s string) []byte {
	q, _ := json.Marshal(s) // a string always marshals
	return append(b, q...)
}

// checkCursor decodes a cursor and checks that it belongs to this
// collection, filter and tenant and has not expired.
func (s *Server) checkCursor(raw string) (Cursor, *CursorError) {
	c, cerr := DecodeCursor(s.cfg.Key, raw)
	if cerr != nil {
		return c, cerr
	}
	if c.Fingerprint != s.fp {
		return c, &CursorError{Code: CodeCursorForeign, Status: http.StatusBadRequest,
			Msg: "the cursor belongs to another collection, filter or tenant; start a new walk without a cursor"}
	}
	if ttl := s.cfg.CursorTTL; ttl > 0 && s.cfg.Now().Sub(c.Issued) > ttl {
		return c, &CursorError{Code: CodeCursorExpired, Status: http.StatusGone,
			Msg: fmt.Sprintf("the cursor expired (cursors are valid for %s); start a new walk without a cursor", ttl)}
	}
	return c, nil
}

// parseLimit reads the limit parameter: absent means DefaultLimit; anything
// but one decimal integer in 1..MaxLimit is a 400, never a silent clamp.
func parseLimit(q url.Values) (int, *CursorError) {
	vs, ok := q["limit"]
	if !ok {
		return DefaultLimit, nil
	}
	bad := &CursorError{Code: CodeInvalidLimit, Status: http.StatusBadRequest}
	if len(vs) != 1 {
		bad.Msg = fmt.Sprintf("give limit once, an integer in 1..%d (default %d)", MaxLimit, DefaultLimit)
		return 0, bad
	}
	n := -1
	if limitRE.MatchString(vs[0]) {
		n, _ = strconv.Atoi(vs[0])
	}
	if n < 1 || n > MaxLimit {
		bad.Msg = fmt.Sprintf("limit %q is not an integer in 1..%d (default %d)", vs[0], MaxLimit, DefaultLimit)
		return 0, bad
	}
	return n, nil
}

// nextURL is the request's URL with the next cursor and the effective limit,
// and without since (the cursor supersedes it). It is built on
// Config.PublicURL, or with Config.TrustForwarded on X-Forwarded-Proto and
// X-Forwarded-Host, else it is a reference relative to the request
// (/changes?cursor=...): never on the client's Host header, which anyone
// can set.
func (s *Server) nextURL(r *http.Request, cursor string, limit int) string {
	q := r.URL.Query()
	q.Del("since")
	q.Set("cursor", cursor)
	q.Set("limit", strconv.Itoa(limit))
	u := url.URL{Path: r.URL.Path, RawQuery: q.Encode()}
	switch {
	case s.cfg.PublicURL != "":
		pub, _ := url.Parse(s.cfg.PublicURL) // checked by New
		u.Scheme, u.Host, u.Path = pub.Scheme, pub.Host, pub.Path
	case s.cfg.TrustForwarded:
		proto := strings.ToLower(strings.TrimSpace(firstValue(r.Header.Get("X-Forwarded-Proto"))))
		host := strings.TrimSpace(firstValue(r.Header.Get("X-Forwarded-Host")))
		if (proto == "http" || proto == "https") && hostRE.MatchString(host) {
			u.Scheme, u.Host = proto, host
		}
	}
	return u.String()
}

// hostRE is a host[:port] that may go into a URL: a name, an IPv4 or a
// bracketed IPv6 address.
var hostRE = regexp.MustCompile(`^([a-zA-Z0-9.-]+|\[[0-9a-fA-F:.]+\])(:[0-9]{1,5})?$`)

// firstValue is the first of a comma-separated header value (the client's
// side of a proxy chain).
func firstValue(v string) string {
	first, _, _ := strings.Cut(v, ",")
	return first
}

// CheckKey says why key is not good enough to authenticate cursors: fewer
// than 16 bytes, fewer than 8 distinct byte values, or under 64 bits by a
// byte-frequency (Shannon) estimate, which catches 16 times "a" or a short
// repeated pattern. A key of 32 random bytes, or their base64 or hex text,
// passes.
func CheckKey(key []byte) error {
	var counts [256]int
	distinct := 0
	for _, b := range key {
		if counts[b] == 0 {
			distinct++
		}
		counts[b]++
	}
	bits := 0.0
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / float64(len(key))
			bits -= float64(c) * math.Log2(p)
		}
	}
	const how = "make one with: head -c 32 /dev/urandom | base64 > feed.key"
	switch {
	case len(key) < 16:
		return fmt.Errorf("the cursor key is %d bytes; use at least 16 (32 random bytes recommended); %s", len(key), how)
	case distinct < 8 || bits < 64:
		return fmt.Errorf("the cursor key has too little entropy (%d distinct bytes, about %.0f bits); use random bytes, not a word or a pattern; %s", distinct, bits, how)
	}
	return nil
}

func writeError(w http.ResponseWriter, status int, code, msg, retryAfter string) {
	var e ErrorBody
	e.Error.Code, e.Error.Message = code, msg
	b, _ := json.Marshal(e)
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if retryAfter != "" {
		h.Set("Retry-After", retryAfter)
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
