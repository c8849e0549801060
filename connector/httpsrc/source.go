package httpsrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

var _ connector.Source = (*Source)(nil)

// errCrossOrigin refuses a redirect away from the endpoint's origin, which
// would carry the auth header elsewhere.
var errCrossOrigin = errors.New("refusing a redirect to another origin")

// maxBody bounds one response body.
const maxBody = 64 << 20

// Source walks a cursor-paginated HTTP changes API (docs/design.md, "The HTTP source"). It is safe
// for concurrent use; its progress guard (guard.go) follows one walk at a
// time, the engine's, and a request that does not continue it starts anew.
type Source struct {
	cfg      Config
	endpoint *url.URL
	client   *http.Client
	paths    paths
	guard    guard // guard.go
}

// New validates cfg and returns a Source. It does not contact the server.
func New(cfg Config) (*Source, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	u, _ := url.Parse(cfg.Endpoint)
	s := &Source{cfg: cfg, endpoint: u, paths: compilePaths(cfg)}
	if cfg.Client != nil {
		c := *cfg.Client
		s.client = &c
	} else {
		s.client = &http.Client{Timeout: cfg.RequestTimeout}
	}
	// Never carry the auth header to another origin: refuse redirects that
	// leave the endpoint's scheme and host.
	s.client.CheckRedirect = func(req *http.Request, via []*http.Request) error {
		if len(via) >= 5 {
			return errors.New("stopped after 5 redirects")
		}
		if !s.sameOrigin(req.URL) {
			return fmt.Errorf("%w (%s://%s)", errCrossOrigin, req.URL.Scheme, req.URL.Host)
		}
		return nil
	}
	return s, nil
}

func (s *Source) sameOrigin(u *url.URL) bool {
	return strings.EqualFold(u.Scheme, s.endpoint.Scheme) && strings.EqualFold(u.Host, s.endpoint.Host)
}

// Page fetches one page. The request cursor is the previous page's Next,
// passed back verbatim: a body cursor goes into CursorParam, a Link URL is
// requested as is. Rows keep the items' order.
//
// Errors: a rejected cursor is a *connector.StopError; a malformed page, a
// refused request (4xx other than a rejected cursor) and a cross-origin
// Link wrap connector.ErrPermanent; anything else (retries exhausted) is
// transient, and the engine resumes from its checkpoint.
func (s *Source) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	if !req.From.IsZero() || !req.Before.IsZero() {
		// The engine bounds pages only for a connector.Windower.
		return connector.Page{}, errors.New("the HTTP source cannot bound a page to a window of updated_at (PageRequest.From, Before)")
	}
	u, err := s.pageURL(req)
	if err != nil {
		return connector.Page{}, err
	}
	if err := s.before(ctx, req.Cursor); err != nil {
		return connector.Page{}, err
	}
	body, hdr, err := s.fetch(ctx, u, req.Cursor)
	if err != nil {
		return connector.Page{}, err
	}
	page, err := s.parse(body, hdr, u)
	if err == nil {
		err = s.checkSince(page, req.Since)
	}
	if err != nil {
		return connector.Page{}, fmt.Errorf("page from %s: %w", s.where(u), permanent(err))
	}
	key := req.Cursor
	if s.cfg.Pagination == PaginateLink && key == "" {
		// The first page's URL too, as a next link to it would read (with
		// no user info): a link back to it is a cycle.
		first := *u
		first.User = nil
		key = first.String()
	}
	if err := s.after(key, req.Cursor, page); err != nil {
		return connector.Page{}, err
	}
	return page, nil
}

// checkSince refuses a page with an item dated before the pass's since:
// the API did not filter by the parameter (it may call it something else).
// Such a feed returns every row on every pass, and rows below the dedupe
// set's floor would be published again each time.
func (s *Source) checkSince(page connector.Page, since time.Time) error {
	if since.IsZero() {
		return nil
	}
	for i, r := range page.Rows {
		if r.UpdatedAt.Before(since) {
			return fmt.Errorf("item %d: id %q has %s %s, before %s, the since sent as %q: the API does not filter by that parameter; set source.http.since_param to the name it uses (rows before since would be published again on every pass)",
				i, r.ID, s.cfg.UpdatedAtPath, schemas.FormatTime(r.UpdatedAt), schemas.FormatTime(since), s.cfg.SinceParam)
		}
	}
	return nil
}

// where names the request in errors: scheme, host and path, no query.
func (s *Source) where(u *url.URL) string {
	return u.Scheme + "://" + u.Host + u.Path
}

func (s *Source) pageURL(req connector.PageRequest) (*url.URL, error) {
	if req.Cursor != "" && s.cfg.Pagination == PaginateLink {
		u, err := url.Parse(req.Cursor)
		if err != nil || !u.IsAbs() {
			return nil, &connector.StopError{
				Reason: fmt.Sprintf("the stored cursor %s is not an absolute URL, but pagination is link", showCursor(req.Cursor)),
				Hint:   "was source.http.pagination changed? restore it, or decide with `tidemark reset`",
			}
		}
		if !s.sameOrigin(u) {
			return nil, fmt.Errorf("the stored next link %s://%s is not on the endpoint's origin; refusing to send credentials there: %w", u.Scheme, u.Host, connector.ErrPermanent)
		}
		if u.User == nil {
			u.User = s.endpoint.User // the endpoint's basic auth, kept out of stored links
		}
		return u, nil
	}
	u := *s.endpoint
	q := u.Query()
	if !req.Since.IsZero() {
		q.Set(s.cfg.SinceParam, schemas.FormatTime(req.Since))
	}
	if req.Cursor != "" {
		q.Set(s.cfg.CursorParam, req.Cursor)
	}
	if req.Limit > 0 {
		n := req.Limit
		if s.cfg.MaxLimit > 0 {
			n = min(n, s.cfg.MaxLimit)
		}
		q.Set(s.cfg.LimitParam, strconv.Itoa(n))
	}
	u.RawQuery = q.Encode()
	return &u, nil
}

// fetch GETs u, retrying 429, 5xx, connection errors, timeouts and broken
// bodies on the same URL (so the same cursor). It returns the body of a 2xx
// answer.
func (s *Source) fetch(ctx context.Context, u *url.URL, cursor string) ([]byte, http.Header, error) {
	var last error
	for attempt := 1; ; attempt++ {
		status, hdr, body, err := s.do(ctx, u)
		if ctx.Err() != nil {
			return nil, nil, ctx.Err()
		}
		var retryAfter string
		switch {
		case err != nil && (errors.Is(err, connector.ErrPermanent) || errors.Is(err, errCrossOrigin)):
			return nil, nil, fmt.Errorf("GET %s: %w", s.where(u), permanent(err))
		case err != nil:
			// Connection refused or reset, timeouts, a body cut short: the
			// server may answer next time.
			last = fmt.Errorf("GET %s: %w", s.where(u), err)
		case status >= 200 && status < 300:
			return body, hdr, nil
		case status == http.StatusTooManyRequests || status >= 500 && status != http.StatusNotImplemented && status != http.StatusHTTPVersionNotSupported:
			// Rate limited or a server-side failure: retry on the same
			// cursor, honouring Retry-After.
			last = fmt.Errorf("GET %s: %s", s.where(u), describe(status, body, s.paths.errCode))
			retryAfter = hdr.Get("Retry-After")
		default:
			code := errorCode(body, s.paths.errCode)
			if cursor != "" && s.rejected(status, code, body) {
				return nil, nil, s.stop(status, code, body, cursor)
			}
			hint := ""
			if status == http.StatusBadRequest && strings.Contains(strings.ToLower(code+" "+errorMessage(body, s.paths.errCode)), "limit") {
				hint = fmt.Sprintf("; the API may refuse the page size asked (%s=%s): set source.http.max_limit to its largest, or lower sync.page_size",
					s.cfg.LimitParam, u.Query().Get(s.cfg.LimitParam))
			}
			return nil, nil, fmt.Errorf("GET %s refused: %s%s: %w", s.where(u), describe(status, body, s.paths.errCode), hint, connector.ErrPermanent)
		}
		if attempt > s.cfg.MaxRetries {
			return nil, nil, fmt.Errorf("giving up on this page after %d attempts: %w", attempt, last)
		}
		wait, told := s.retryAfter(retryAfter)
		if !told {
			wait = backoff(s.cfg.BackoffBase, s.cfg.BackoffMax, attempt)
		} else if wait > s.cfg.MaxRetryAfter {
			return nil, nil, fmt.Errorf("the server asks to wait %s (Retry-After: %s), longer than the %s allowed: %w", wait, retryAfter, s.cfg.MaxRetryAfter, last)
		}
		s.cfg.Logger.Warn("changes API request failed; retrying the same cursor",
			"err", last, "attempt", attempt, "of", s.cfg.MaxRetries+1, "retry_in", wait, "retry_after", retryAfter)
		if err := s.cfg.Clock.Sleep(ctx, wait); err != nil {
			return nil, nil, err
		}
	}
}

// authValue is the auth header's value: Config.AuthValueFile's content,
// read now, or Config.AuthValue. Errors name the file, never its content.
func (s *Source) authValue() (string, error) {
	if s.cfg.AuthValueFile == "" {
		return s.cfg.AuthValue, nil
	}
	b, err := os.ReadFile(s.cfg.AuthValueFile)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is named below
		}
		return "", fmt.Errorf("read the auth value file %s: %v", s.cfg.AuthValueFile, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	switch {
	case v == "":
		return "", fmt.Errorf("the auth value file %s is empty; write the header's value into it", s.cfg.AuthValueFile)
	case strings.ContainsAny(v, "\r\n"):
		return "", fmt.Errorf("the auth value file %s holds more than one line; write the header's value alone", s.cfg.AuthValueFile)
	}
	return v, nil
}

// do performs one GET and reads the whole body.
func (s *Source) do(ctx context.Context, u *url.URL) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", "tidemark")
	if s.cfg.AuthHeader != "" {
		v, err := s.authValue()
		if err != nil {
			return 0, nil, nil, err
		}
		req.Header.Set(s.cfg.AuthHeader, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// *url.Error repeats the whole URL; the endpoint's query may hold
		// a key, so keep only the operation and the cause (callers name
		// scheme, host and path).
		var ue *url.Error
		if errors.As(err, &ue) {
			err = fmt.Errorf("%s: %w", ue.Op, ue.Err)
		}
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return 0, nil, nil, fmt.Errorf("read body (HTTP %d): %w", resp.StatusCode, err)
	}
	if len(body) > maxBody {
		return 0, nil, nil, fmt.Errorf("the body exceeds %d bytes; lower sync.page_size or source.http.max_limit: %w", maxBody, connector.ErrPermanent)
	}
	return resp.StatusCode, resp.Header, body, nil
}

// rejected says whether an error answer to a request carrying a cursor
// rejects that cursor: a reject status, and a reject code, or no code but
// status 410 or a body that mentions the cursor.
func (s *Source) rejected(status int, code string, body []byte) bool {
	if !slices.Contains(s.cfg.RejectStatuses, status) {
		return false
	}
	if code != "" {
		return slices.Contains(s.cfg.RejectCodes, code)
	}
	return status == http.StatusGone || strings.Contains(strings.ToLower(string(body)), "cursor")
}

func (s *Source) stop(status int, code string, body []byte, cursor string) error {
	return &connector.StopError{
		Reason: fmt.Sprintf("the changes API rejected the stored cursor %s: %s", showCursor(cursor), describe(status, body, s.paths.errCode)),
		Hint: "tidemark never guesses a nearby position. Inspect with `tidemark status --config FILE`, then decide: " +
			"`tidemark reset --config FILE --yes` re-reads the feed from the beginning and publishes every row again (the records already in the topic stay, so each row then has a repeat there), " +
			"or `tidemark reset --config FILE --to-watermark <RFC 3339> --yes` restarts at a stated watermark (rows last changed before it minus sync.margin are not read again)",
	}
}

// describe renders an error answer for a message: status, code and the
// server's message, escaped (Escape: the body is the upstream's text and
// reaches terminals and logs) and bounded.
func describe(status int, body []byte, codePath []string) string {
	s := fmt.Sprintf("HTTP %d %s", status, http.StatusText(status))
	code, msg := errorCode(body, codePath), errorMessage(body, codePath)
	if code != "" {
		s += " (" + clipText(Escape(code), 100) + ")"
	}
	if msg == "" && code == "" {
		msg = strings.TrimSpace(string(body))
	}
	if msg != "" {
		s += ": " + clipText(Escape(msg), 300)
	}
	return s
}

// clipText bounds s to about n bytes, cutting at a rune boundary.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "..."
}

// permanent marks err as one a retry cannot fix.
func permanent(err error) error { return fmt.Errorf("%w (%w)", err, connector.ErrPermanent) }
