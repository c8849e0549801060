// Package postgres is tidemark's PostgreSQL table source: it reads one
// table as a delta feed in (updated_at, id) order and encodes each row as
// the record value (docs/design.md, "Source table requirements", "The walk" and "Watermark", "Records").
//
// It owns:
//
//   - the keyset walk. The first page of a pass is
//     WHERE updated_at >= $since ORDER BY updated_at, id LIMIT $n; later
//     pages seek strictly after the previous page's last key,
//     WHERE (updated_at, id) > ($ts, $id) ORDER BY updated_at, id LIMIT $n.
//     Never OFFSET. A page is the end of the pass only when it is empty.
//   - the cursor format ("v1:<microseconds>:<id>"), opaque to the engine,
//     exact to the microsecond, and strictly decoded: a cursor this package
//     did not write is an error, never a guess.
//   - the value encoding: a JSON object of the selected columns in column
//     order, decided per column from the catalog (numbers as numbers,
//     numeric as exact strings, timestamps in schemas.TimeLayout, bytea as
//     base64, json/jsonb embedded, arrays as arrays, NULL as null).
//   - the preflight (Check), the horizon sample for horizon mode (Horizon,
//     CheckHorizon) and the consistent initial-load view (Snapshot).
//
// It must not: splice configuration into SQL as text (schema, table and
// column names are always quoted identifiers; the operator Filter is the
// single, documented exception), talk to Kafka, or decide exit codes
// (errors that need an operator wrap ErrBadConfig; cmd maps them).
//
// Table requirements (checked by New and Check):
//
//   - id: unique (primary key or unique index on exactly that column),
//     NOT NULL, bigint, integer, smallint, text, varchar or uuid;
//   - updated_at: timestamptz NOT NULL, set on every write (NULLs would be
//     skipped forever, so they are refused);
//   - deleted_at (optional): timestamptz, NULL for live rows;
//   - an index serving ORDER BY updated_at, id, e.g.
//     CREATE INDEX CONCURRENTLY ON "s"."t" ("updated_at", "id") (a warning,
//     not a failure, when missing).
//
// Sessions run with TimeZone=UTC, DateStyle=ISO, IntervalStyle=iso_8601,
// bytea_output=hex and extra_float_digits=1 whatever the DSN says; the
// value encoding depends on them.
//
// Example:
//
//	src, err := postgres.New(ctx, postgres.Config{
//		DSN:   "postgres://tidemark@db.internal/shop",
//		Table: "orders",
//	})
//	if err != nil {
//		return err // errors.Is(err, postgres.ErrBadConfig): fix the table or config
//	}
//	defer src.Close()
//	page, err := src.Page(ctx, connector.PageRequest{Since: w.Add(-10 * time.Second), Limit: 1000})
package postgres
