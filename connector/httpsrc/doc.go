// Package httpsrc is tidemark's HTTP changes-API source: it walks a
// cursor-paginated feed (docs/design.md, "The HTTP source") such as the reference server in
// package feed.
//
// Each Page is one GET:
//
//	GET <endpoint>?since=<W - M>&cursor=<c>&limit=<n>
//
// with configurable parameter names, or, with PaginateLink, the previous
// page's Link rel="next" URL verbatim. Items are read at JSON paths (id,
// updated_at, a deleted flag or deleted_at, the value).
//
// It owns:
//
//   - the cursor contract: the server's cursor is passed back verbatim,
//     never parsed, built or compared; the engine stores it as the request
//     cursor of the first page not committed.
//   - the end signal: only next_cursor: null, has_more: false (when
//     HasMorePath is set) or, with PaginateLink, a page without a next
//     link end a pass. An empty or short page with a next cursor continues.
//   - retries: 429, 5xx, connection errors, timeouts and bodies cut short
//     are retried on the same URL (so the same cursor), waiting what
//     Retry-After says (seconds or HTTP-date, capped by MaxRetryAfter), else
//     capped exponential backoff with jitter. After MaxRetries the page
//     fails transiently and the engine resumes from its checkpoint. Waits go
//     through Config.Clock, so tests check them without spending them.
//   - safety stops: a request carrying a cursor answered with a reject
//     status (400, 410) and a cursor error code is a *connector.StopError
//     (exit 3) whose hint offers `tidemark reset` to scratch or to a stated
//     watermark. Nothing is guessed: no retry without the cursor.
//   - failing closed: a malformed page (not JSON, no items array, an item
//     without an id, a timestamp that is not RFC 3339 or has sub-microsecond
//     digits, a value that is not an object, no end signal and no cursor)
//     fails as a whole with a message naming the item index, id and field,
//     wrapping connector.ErrPermanent: the engine aborts the open
//     transaction, so nothing of that page is committed, and stops (exit 1)
//     rather than re-reading a page that will not change. Other refusals
//     (401, 403, 404, 400 not about the cursor) are permanent too.
//
// Records: the key is the id as text (a JSON integer id becomes its
// decimal text); the value is the item, or the object at ValuePath, byte
// for byte as sent (surrounding whitespace trimmed, nothing re-encoded);
// updated_at keeps microseconds exactly (finer precision is refused, never
// rounded). A deleted item is a tombstone.
//
// It must not: log or return the auth header value, follow a Link or a
// redirect to another origin (the auth header would go with it), or talk to
// Kafka.
//
// Example, against `tidemark feed serve`:
//
//	src, err := httpsrc.New(httpsrc.Config{
//		Endpoint:    "http://127.0.0.1:8080/changes",
//		ValuePath:   "data",
//		DeletedPath: "deleted",
//		HasMorePath: "has_more",
//		MaxLimit:    500,
//	})
//	if err != nil {
//		return err // errors.Is(err, httpsrc.ErrBadConfig)
//	}
//	page, err := src.Page(ctx, connector.PageRequest{Since: w.Add(-10 * time.Second), Limit: 500})
package httpsrc
