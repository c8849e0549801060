package httpsrc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// ErrBadConfig marks configuration errors; cmd maps it to exit code 2.
var ErrBadConfig = errors.New("bad HTTP source configuration")

// Pagination selects where the next page's cursor comes from.
type Pagination string

const (
	// PaginateCursor reads the next cursor from the body (NextCursorPath)
	// and sends it back in CursorParam. The end is next_cursor: null, or
	// has_more: false when HasMorePath is set.
	PaginateCursor Pagination = "cursor"
	// PaginateLink follows the RFC 8288 Link header's rel="next" URL,
	// verbatim. The end is a page without a rel="next" link.
	PaginateLink Pagination = "link"
)

// Config configures a Source. Zero values take the documented defaults.
//
// JSON paths are dot-separated object keys ("data.items", "meta.next");
// ItemsPath "." means the body is the array; ValuePath "" that the whole
// item is the value.
type Config struct {
	// Endpoint is the changes API URL, http or https; its own query
	// parameters are kept. Required.
	Endpoint string
	// SinceParam, CursorParam and LimitParam name the query parameters.
	// Defaults "since", "cursor", "limit". since is sent (RFC 3339 UTC with
	// microseconds) on every request of a pass that has a lower bound.
	SinceParam, CursorParam, LimitParam string
	// MaxLimit caps the limit sent (the engine asks for sync.page_size);
	// default 0: no cap. The reference feed refuses limits above 500.
	MaxLimit int

	// ItemsPath is the array of items in the body. Default "items"; "."
	// is the body itself (with link pagination only: a bare array has no
	// place for a next cursor).
	ItemsPath string
	// IDPath is the item's id: a string, or an integer written as a JSON
	// number (its decimal text becomes the key). Default "id".
	IDPath string
	// UpdatedAtPath is the item's change time, RFC 3339 with at most
	// microseconds (finer precision is refused, never rounded). Default
	// "updated_at".
	UpdatedAtPath string
	// DeletedPath, when set, is a boolean: true marks a deletion.
	DeletedPath string
	// DeletedAtPath, when set, is a timestamp or null: non-null marks a
	// deletion. Either or both may be set; a deletion is published as a
	// tombstone.
	DeletedAtPath string
	// ValuePath selects the part of the item published as the record
	// value; it must be a JSON object. Default "": the whole item. The
	// reference feed wants "data".
	ValuePath string

	// Pagination is PaginateCursor (default) or PaginateLink.
	Pagination Pagination
	// NextCursorPath is the next cursor in the body. Default "next_cursor".
	NextCursorPath string
	// HasMorePath, when set, is a boolean in the body; false ends the pass.
	// Default "" (only next_cursor: null ends it).
	HasMorePath string

	// AuthHeader and AuthValue add one header to every request, e.g.
	// "Authorization" and "Bearer ...". The value is a secret: it is never
	// logged or put in an error. Default: none.
	AuthHeader, AuthValue string
	// AuthValueFile, when set, holds the header's value (one trailing
	// newline trimmed) and is read again for every request, so a rotated
	// token takes effect at once; it replaces AuthValue. A file that
	// cannot be read fails that request, as a transient failure. Default:
	// none.
	AuthValueFile string

	// RejectStatuses are the statuses that, on a request carrying a cursor,
	// can mean "this cursor is rejected". Default 400 and 410.
	RejectStatuses []int
	// RejectCodes are the error codes (at ErrorCodePath) that name the
	// cursor. Default: invalid_cursor, cursor_tampered, cursor_foreign,
	// cursor_version, cursor_expired (the reference feed's). A response with
	// a reject status and no code at all is a rejection when the status is
	// 410 or its body mentions "cursor".
	RejectCodes []string
	// ErrorCodePath is the error code in an error body. Default
	// "error.code".
	ErrorCodePath string

	// RequestTimeout bounds one request including reading the body.
	// Default 30s.
	RequestTimeout time.Duration
	// MaxRetries is how many times one page is retried (429, 5xx,
	// connection errors, timeouts, truncated bodies) before Page returns a
	// transient error. Default 8.
	MaxRetries int
	// BackoffBase and BackoffMax shape the exponential backoff with jitter
	// used when the server sends no Retry-After: attempt n waits a random
	// time in [d/2, d], d = min(BackoffBase * 2^(n-1), BackoffMax).
	// Defaults 500ms and 30s.
	BackoffBase, BackoffMax time.Duration
	// MaxRetryAfter caps how long a Retry-After is honoured; a server asking
	// for longer fails the page (transient) instead of stalling. Default 5m.
	MaxRetryAfter time.Duration
	// MaxEmptyPages is how many pages in a row may come back with no items
	// while saying there is more. Each is followed by a wait (the backoff
	// above, restarted by a page with items); the MaxEmptyPages-th is a
	// safety stop: the server makes no progress. Default 20.
	MaxEmptyPages int

	// Client is the HTTP client; default a client with RequestTimeout.
	Client *http.Client
	// Clock is the time source for backoff and HTTP-date Retry-After;
	// default the wall clock. Tests inject one.
	Clock Clock
	// Logger; default slog.Default().
	Logger *slog.Logger
}

// DefaultRejectCodes are the reference feed's cursor error codes.
var DefaultRejectCodes = []string{"invalid_cursor", "cursor_tampered", "cursor_foreign", "cursor_version", "cursor_expired"}

func (c Config) withDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.SinceParam, "since")
	def(&c.CursorParam, "cursor")
	def(&c.LimitParam, "limit")
	def(&c.ItemsPath, "items")
	def(&c.IDPath, "id")
	def(&c.UpdatedAtPath, "updated_at")
	def(&c.NextCursorPath, "next_cursor")
	def(&c.ErrorCodePath, "error.code")
	if c.Pagination == "" {
		c.Pagination = PaginateCursor
	}
	if c.RejectStatuses == nil {
		c.RejectStatuses = []int{http.StatusBadRequest, http.StatusGone}
	}
	if c.RejectCodes == nil {
		c.RejectCodes = DefaultRejectCodes
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = 30 * time.Second
	}
	if c.MaxRetries <= 0 {
		c.MaxRetries = 8
	}
	if c.BackoffBase <= 0 {
		c.BackoffBase = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.MaxRetryAfter <= 0 {
		c.MaxRetryAfter = 5 * time.Minute
	}
	if c.MaxEmptyPages <= 0 {
		c.MaxEmptyPages = 20
	}
	if c.Clock == nil {
		c.Clock = wallClock{}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate reports every problem at once; the error wraps ErrBadConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if u, err := url.Parse(c.Endpoint); c.Endpoint == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		errs = append(errs, errors.New("endpoint must be an http(s) URL with a host"))
	}
	switch c.Pagination {
	case PaginateCursor, PaginateLink:
	default:
		errs = append(errs, fmt.Errorf("pagination %q: use cursor or link", c.Pagination))
	}
	for name, p := range map[string]string{"id path": c.IDPath, "updated_at path": c.UpdatedAtPath, "next_cursor path": c.NextCursorPath} {
		if strings.TrimSpace(p) == "" {
			errs = append(errs, fmt.Errorf("%s is empty", name))
		}
	}
	for name, p := range map[string]string{"items": c.ItemsPath, "id": c.IDPath, "updated_at": c.UpdatedAtPath, "deleted": c.DeletedPath,
		"deleted_at": c.DeletedAtPath, "value": c.ValuePath, "next_cursor": c.NextCursorPath, "has_more": c.HasMorePath, "error code": c.ErrorCodePath} {
		if name == "items" && p == "." {
			if c.Pagination != PaginateLink {
				errs = append(errs, errors.New(`items path "." (the body is the array) leaves no place for a next cursor: use pagination: link`))
			}
			continue
		}
		if p != "" && (strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..")) {
			errs = append(errs, fmt.Errorf("%s path %q has an empty segment", name, p))
		}
	}
	if c.SinceParam == c.CursorParam || c.SinceParam == c.LimitParam || c.CursorParam == c.LimitParam {
		errs = append(errs, errors.New("since, cursor and limit parameter names must differ"))
	}
	if c.MaxLimit < 0 {
		errs = append(errs, fmt.Errorf("max limit %d: use 0 (no cap) or more", c.MaxLimit))
	}
	if (c.AuthHeader == "") != (c.AuthValue == "" && c.AuthValueFile == "") {
		errs = append(errs, errors.New("auth header name and value go together: set both or neither"))
	}
	if c.AuthHeader != "" && strings.ContainsAny(c.AuthHeader, " :\r\n") {
		errs = append(errs, fmt.Errorf("auth header name %q is not a header name", c.AuthHeader))
	}
	if strings.ContainsAny(c.AuthValue, "\r\n") {
		errs = append(errs, errors.New("auth header value contains a line break (a trailing newline in the file?)"))
	}
	for _, s := range c.RejectStatuses {
		if s < 400 || s > 499 {
			errs = append(errs, fmt.Errorf("reject status %d: use 4xx statuses (5xx are retried)", s))
		}
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, fmt.Errorf("backoff max %s is below backoff base %s", c.BackoffMax, c.BackoffBase))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}

// Clock is the time the Source waits on. Tests inject one to check waits
// without spending them.
type Clock interface {
	Now() time.Time
	// Sleep waits d or until ctx is done, returning ctx.Err() then.
	Sleep(ctx context.Context, d time.Duration) error
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
