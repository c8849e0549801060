// Package feed is tidemark's reference changes API: it serves a table (a
// PostgreSQL table through connector/postgres, or any Table) as a
// cursor-paginated HTTP feed that keeps the contract the HTTP source relies
// on (docs/http-source.md). It is the HTTP source's test upstream, `tidemark feed
// serve`, and a handler API owners can embed.
//
// Protocol:
//
//	GET <path>?since=<RFC 3339>&cursor=<opaque>&limit=<1..500>
//
//	200 {"items":[{"id":"42","updated_at":"2026-01-31T12:00:00.123456Z",
//	               "deleted":false,"data":{...the row...}}, ...],
//	     "next_cursor":"AaI..." | null, "has_more":true|false, "limit":100}
//	    Link: </changes?cursor=AaI...&limit=100>; rel="next"   (only when has_more;
//	          absolute on Config.PublicURL, never on the client's Host header)
//
//	4xx/5xx {"error":{"code":"invalid_limit","message":"..."}}
//
// Rules:
//
//   - Items are in (updated_at, id) order. The first page starts at since
//     (inclusive; omitted = the beginning); every later page seeks strictly
//     after the cursor's key, (updated_at, id) > (ts, id), never OFFSET, so
//     a cursor whose anchor row was deleted still works, and ties and rows
//     1 µs apart never straddle a page boundary wrongly. The cursor
//     supersedes since.
//   - limit defaults to 100 (DefaultLimit); anything but an integer in
//     1..500 is 400 invalid_limit, never a silent clamp. The effective
//     limit is echoed in the body.
//   - The server reads limit+1 rows: has_more is true, and next_cursor set,
//     exactly when more rows existed when the page was read. next_cursor:
//     null (has_more: false, no Link) is the end of the walk.
//   - Soft-deleted rows are items with "deleted": true and "data": null.
//   - data is the Table's value encoding byte for byte (for PostgreSQL,
//     docs/design.md, Records), so a table read through the feed and read directly
//     yields identical record values.
//
// Cursors (see CursorVersion for the layout) are opaque: unpadded base64url
// of a version byte, a fingerprint of collection, filter and tenant, the
// issue time and the full sort key (updated_at in microseconds, id), under
// an HMAC-SHA256. A cursor is data, never SQL: its id reaches the database
// only as a bound parameter. Rejections carry stable codes: invalid_cursor,
// cursor_tampered, cursor_foreign (another collection, filter or tenant),
// cursor_version (400), and cursor_expired (410, with Config.CursorTTL).
//
// It must not: log cursors or tokens, interpret a cursor as anything but
// a sort key, or answer a page it could not read completely.
//
// Example:
//
//	table, err := postgres.New(ctx, postgres.Config{DSN: dsn, Table: "orders", DeletedAtColumn: "deleted_at"})
//	if err != nil {
//	return err
//	}
//	srv, err := feed.New(feed.Config{Table: table, Key: key, Collection: "public.orders", Tenant: "acme"})
//	if err != nil {
//	return err
//	}
//	http.Handle("GET /v1/orders/changes", srv)
package feed
