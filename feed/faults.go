package feed

import (
	"net/url"
	"time"
)

// FaultRequest describes one request to a Faults hook.
type FaultRequest struct {
	// N counts the requests this server has received, from 1.
	N int64
	// Cursor is the request's cursor parameter ("" on a first page).
	Cursor string
	// Query is the request's whole query.
	Query url.Values
}

// Fault is what a Faults hook wants done to one request. The zero Fault
// serves the request normally.
type Fault struct {
	// Delay holds the answer back this long (or until the client gives up).
	Delay time.Duration
	// Status, when non-zero, answers with this status and a JSON error
	// instead of a page: 429 (code rate_limited), 503 (unavailable), any
	// other status (internal).
	Status int
	// RetryAfter, when set, is sent as the Retry-After header: seconds
	// ("7") or an HTTP-date.
	RetryAfter string
	// Truncate serves the real page but cuts its body in half and drops the
	// connection, with a Content-Length announcing the whole body.
	Truncate bool
	// RejectCursor, when set to a cursor error code (cursor_expired,
	// invalid_cursor, ...), rejects a request that carries a cursor as if
	// the cursor had failed that check. Ignored on first pages.
	RejectCursor string
}

// Faults decides, per request, whether to misbehave. Servers call it for
// every request; it must be safe for concurrent use. Tests use it; a
// production server leaves it nil.
type Faults func(FaultRequest) Fault
