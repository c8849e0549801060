package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

var (
	_ connector.Source      = (*Source)(nil)
	_ connector.Horizoner   = (*Source)(nil)
	_ connector.Snapshotter = (*Source)(nil)
	_ connector.Marker      = (*Source)(nil)
)

// Source reads one PostgreSQL table as a delta feed in (updated_at, id)
// order. It is safe for concurrent use; each Page call uses one pooled
// connection.
type Source struct {
	cfg    Config
	pool   *pgxpool.Pool
	shared bool // the pool is Connect's, shared with other sources: Close leaves it open
	// sh is the table's shape and the queries built from it, replaced
	// whole when the table changes (Reshape).
	sh atomic.Pointer[shape]
	// sigSQL and reshapeNowSQL are signatureSQLFor and reshapeNowSQLFor
	// of cfg, built once.
	sigSQL, reshapeNowSQL string
	// pending is a shape change a view took on, not yet reported by
	// Reshape.
	pending atomic.Pointer[connector.ShapeChange]
	// rowBytes and idBytes remember the last page's average value and id
	// size, so the next page's buffers are allocated once at about the
	// right size instead of growing by doubling.
	rowBytes, idBytes atomic.Int64
	warned            atomic.Bool
	// covered keeps covers' answers for relations that differ.
	coverMu sync.Mutex
	covered map[string]bool
}

// queries are the three page statements, built once from quoted
// identifiers and the operator filter. Each takes, as its last three
// parameters, the skip mark's transaction id (NULL = no skip; see fresh)
// and the steps' bounds and marks (NULL = none; see steps).
type queries struct {
	all   string // first page, no lower bound: $1 limit, $2 skip, $3 and $4 steps
	since string // first page: $1 since, $2 limit, $3 skip, $4 and $5 steps
	next  string // later pages: $1 updated_at, $2 id text, $3 limit, $4 skip, $5 and $6 steps
	// sinceBefore and nextBefore are since and next bounded above by a
	// window's end (PageRequest.Before): $6 and $7. Statements of their
	// own, so that the bound stops the index scan whatever the plan.
	sinceBefore, nextBefore string
	// mark is markSQL for the table (markSQLFor).
	mark string
	// formats requests updated_at in binary (8-byte microseconds, no
	// parsing) and everything else as text, which is what the value
	// encoder converts.
	formats pgx.QueryResultFormats
	// prefix is the number of leading key columns before the value
	// columns: updated_at, id, with deleted_at a deleted flag, and with
	// marks the row version's xmin. width is the number of columns
	// selected.
	prefix, width int
	// valueAt is, for each value column, the index of its column in a
	// result row, or valueUpdatedAt: the id and updated_at are not
	// selected twice. cols are the value columns to encode them by
	// (updated_at's is verbatim: readRows formats it from the key column).
	valueAt []int
	cols    []valueColumn
	// types are the type OIDs (domains resolved, as PostgreSQL describes
	// a result) of the width columns selected, and names their names:
	// readRows checks every page's result against them.
	types []uint32
	names []string
	// marks: the relation has row versions (xmin), so passes can be
	// marked (not a view or a foreign table).
	marks bool
	// load are the page statements of an initial load in key order
	// (load.go), indexed by loadVariant: with or without a lower and an
	// upper bound on the id.
	load [4]string
}

// checkTypes fails when a page's result does not have the columns and
// types the page statement was built for: the table changed during the
// pass (a statement prepared on another connection, or planned again, reads
// the new shape). Encoding a value by its old type could publish invalid
// JSON (text pasted as a number); the next pass reshapes first.
func (q *queries) checkTypes(ident string, fds []pgconn.FieldDescription) error {
	if len(fds) != len(q.types) {
		return fmt.Errorf("got %d columns, want %d: the table changed during the pass; the next pass reads its new shape", len(fds), len(q.types))
	}
	for i, fd := range fds {
		if fd.DataTypeOID != q.types[i] {
			return fmt.Errorf("column %s of %s changed type during the pass (type oid %d, was %d); the next pass reads its new shape", quote(q.names[i]), ident, fd.DataTypeOID, q.types[i])
		}
	}
	return nil
}

// valueUpdatedAt in queries.valueAt: the value's updated_at, formatted
// from the row's key column.
const valueUpdatedAt = -1

// fresh is the SQL test "this row version was written by a transaction
// that had not finished when the mark was taken", against $n, the mark's
// transaction id modulo 2^32. A mark is the oldest transaction id still
// running at a moment (its snapshot's xmin): every transaction below it had
// finished, and every one at or above it might not have. Transaction ids
// are compared modulo 2^32 within 2^31 of each other, as PostgreSQL does;
// ids 0 to 2 (invalid, bootstrap, frozen) are old. A version written by a
// subtransaction carries the subtransaction's id, which is above its parent
// and so never below a mark its parent was running at.
func fresh(n int) string { return freshOf(fmt.Sprintf("$%d::bigint", n)) }

// freshOf is fresh against the mark p, an SQL expression.
func freshOf(p string) string {
	x := "xmin::text::bigint"
	return fmt.Sprintf("(%s IS NULL OR (%s > 2 AND ((%s - %s) BETWEEN 0 AND 2147483647 OR (%s - %s) < -2147483648)))", p, x, x, p, x, p)
}

func buildQueries(cfg Config, t *table) queries {
	ua, id := quote(t.updatedAt.name), quote(t.id.name)
	var sel strings.Builder
	sel.WriteString("SELECT ")
	sel.WriteString(ua + ", " + id)
	types := []uint32{t.updatedAt.base, t.id.base}
	names := []string{t.updatedAt.name, t.id.name}
	if t.deletedAt != nil {
		sel.WriteString(", (" + quote(t.deletedAt.name) + " IS NOT NULL)")
		types, names = append(types, oidBool), append(names, t.deletedAt.name)
	}
	marks := t.relkind == 'r' || t.relkind == 'p' || t.relkind == 'm'
	if marks {
		sel.WriteString(", xmin") // binary: 4 bytes, the xid modulo 2^32
		types, names = append(types, oidXID), append(names, "xmin")
	}
	prefix := len(types)
	// The value's id and updated_at are the key columns already selected:
	// PostgreSQL need not send them twice, nor format updated_at as text.
	valueAt := make([]int, len(t.value))
	cols := slices.Clone(t.value)
	width := prefix
	for i, c := range t.value {
		switch c.name {
		case t.id.name:
			valueAt[i] = 1
		case t.updatedAt.name:
			valueAt[i] = valueUpdatedAt
			cols[i].kind = kindVerbatim
		default:
			valueAt[i] = width
			width++
			sel.WriteString(", ")
			sel.WriteString(quote(c.name))
			types, names = append(types, t.col(c.name).base), append(names, c.name)
		}
	}
	sel.WriteString(" FROM " + t.ident)
	head := sel.String()
	filter := ""
	if cfg.Filter != "" {
		filter = " AND (" + cfg.Filter + "\n)" // see checkFilter
	}
	order := " ORDER BY " + ua + ", " + id + " LIMIT "
	formats := make(pgx.QueryResultFormats, width)
	formats[0] = pgx.BinaryFormatCode
	if marks {
		formats[prefix-1] = pgx.BinaryFormatCode
	}
	// skip(n) tests the skip mark $n, and the steps (see steps): their
	// lower bounds $n+1, ascending, and marks $n+2. A version is left out
	// by the step of the last bound at or below its updated_at, if any.
	skip := func(n int) string {
		lows, stepMarks := fmt.Sprintf("$%d::timestamptz[]", n+1), fmt.Sprintf("$%d::bigint[]", n+2)
		if !marks {
			return fmt.Sprintf(" AND $%d::bigint IS NULL AND %s IS NULL AND %s IS NULL", n, lows, stepMarks)
		}
		bucket := "width_bucket(" + ua + ", " + lows + ")"
		return fmt.Sprintf(" AND %s AND (%s IS NULL OR %s = 0 OR %s)", fresh(n), lows, bucket, freshOf("("+stepMarks+")["+bucket+"]"))
	}
	// The id cast target comes from the idKind whitelist, never from text
	// in the configuration. The cursor's id is compared with the id
	// column's own collation (a parameter has the default collation, which
	// yields to the column's), the same ordering as ORDER BY.
	var load [4]string
	for v := range load {
		var where []string
		n := 1
		if v&loadAfter != 0 {
			where = append(where, fmt.Sprintf("%s > $%d::text::%s", id, n, t.idKind.sqlType()))
			n++
		}
		if v&loadUpTo != 0 {
			where = append(where, fmt.Sprintf("%s <= $%d::text::%s", id, n, t.idKind.sqlType()))
			n++
		}
		where = append(where, "true")
		load[v] = head + " WHERE " + strings.Join(where, " AND ") + filter + " ORDER BY " + id + " LIMIT $" + strconv.Itoa(n)
	}
	after := " WHERE (" + ua + ", " + id + ") > ($1, $2::text::" + t.idKind.sqlType() + ")" + skip(4)
	return queries{
		load:        load,
		all:         head + " WHERE true" + skip(2) + filter + order + "$1",
		since:       head + " WHERE " + ua + " >= $1" + skip(3) + filter + order + "$2",
		next:        head + after + filter + order + "$3",
		sinceBefore: head + " WHERE " + ua + " >= $1 AND " + ua + " < $6" + skip(3) + filter + order + "$2",
		nextBefore:  head + after + " AND " + ua + " < $7" + filter + order + "$3",
		mark:        markSQLFor(t.ident),
		formats:     formats,
		prefix:      prefix,
		width:       width,
		valueAt:     valueAt,
		cols:        cols,
		types:       types,
		names:       names,
		marks:       marks,
	}
}

// New connects, checks the table against docs/design.md, "Source table requirements" and prepares the page
// queries. A table that does not meet the requirements, or a filter or
// column list PostgreSQL rejects, is an error wrapping ErrBadConfig; run
// Check for the full report including warnings.
func New(ctx context.Context, cfg Config) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pool, err := connect(ctx, cfg, 0)
	if err != nil {
		return nil, err
	}
	s, err := newSource(ctx, cfg, pool)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return s, nil
}

// Connect opens a connection pool for cfg's DSN and password, with the
// session settings a Source needs, holding at least conns connections (unless
// the DSN sets pool_max_conns), for sources that share it (NewOnPool): the
// tasks of a configuration with tables.
func Connect(ctx context.Context, cfg Config, conns int) (*pgxpool.Pool, error) {
	cfg = cfg.withDefaults()
	return connect(ctx, cfg, int32(conns))
}

// NewOnPool is New on a pool from Connect, shared with other sources; the
// Source's Close leaves it open. An initial load in key order still needs
// sync.load_workers + 2 connections of it.
func NewOnPool(ctx context.Context, cfg Config, pool *pgxpool.Pool) (*Source, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if need := int32(cfg.LoadWorkers + 2); cfg.LoadWorkers > 0 && pool.Config().MaxConns < need {
		return nil, fmt.Errorf("%w: the shared pool holds %d connections, below what an initial load with %d workers holds (%d): raise pool_max_conns or lower sync.load_workers",
			ErrBadConfig, pool.Config().MaxConns, cfg.LoadWorkers, need)
	}
	s, err := newSource(ctx, cfg, pool)
	if err != nil {
		return nil, err
	}
	s.shared = true
	return s, nil
}

func newSource(ctx context.Context, cfg Config, pool *pgxpool.Pool) (*Source, error) {
	tbl, rep, err := inspect(ctx, pool, cfg)
	if err != nil {
		return nil, err
	}
	if err := rep.Err(); err != nil {
		return nil, err
	}
	sigSQL := signatureSQLFor(cfg)
	sig, err := signature(ctx, pool, cfg, sigSQL)
	if err != nil {
		return nil, err
	}
	sh := &shape{tbl: tbl, q: buildQueries(cfg, tbl), sig: sig}
	if err := prepare(ctx, pool, sh); err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg, pool: pool, sigSQL: sigSQL, reshapeNowSQL: reshapeNowSQLFor(cfg)}
	s.sh.Store(sh)
	return s, nil
}

// prepare parses each page statement once so that a bad filter or column
// fails at startup, not at the first page. pgx caches the statements per
// connection on use.
func prepare(ctx context.Context, pool *pgxpool.Pool, sh *shape) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Release()
	for _, sql := range append([]string{sh.q.all, sh.q.since, sh.q.next, sh.q.sinceBefore, sh.q.nextBefore}, sh.q.load[:]...) {
		if _, err := conn.Conn().Prepare(ctx, "", sql); err != nil {
			if rerr := rowSecurity(ctx, conn.Conn(), sh.tbl, err); rerr != nil {
				return rerr
			}
			if ctx.Err() == nil && isQueryError(err) {
				return fmt.Errorf("%w: the page query for %s is rejected by PostgreSQL (check filter and columns): %w", ErrBadConfig, sh.tbl.ident, err)
			}
			return fmt.Errorf("prepare page query: %w", err)
		}
	}
	return nil
}

// SetCredentials gives pc cfg's password: Password, or PasswordFile read
// for each new connection (the pool's first too), so that the connection
// the pool opens after a rotation logs in with the new password; and reads
// the TLS files the DSN names for each new connection too (renewTLS). A
// file that cannot be read fails that connection only; the engine's retry
// tries again.
func SetCredentials(pc *pgxpool.Config, cfg Config) {
	if cfg.Password != "" {
		pc.ConnConfig.Password = cfg.Password
	}
	pc.BeforeConnect = func(_ context.Context, cc *pgx.ConnConfig) error {
		if err := passwordFromFile(cfg.PasswordFile, &cc.Config); err != nil {
			return err
		}
		return renewTLS(cc)
	}
}

// connect parses the DSN, pins the session settings the encoder relies on
// and checks that the server answers.
func connect(ctx context.Context, cfg Config, conns int32) (*pgxpool.Pool, error) {
	// tidemark's own parser first (dsn.go): pgx accepts some DSNs whose
	// password it would later print (an unencoded @ in a URL), and its parse
	// errors can quote the password.
	if err := CheckDSN(cfg.DSN); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, dsnError(cfg.DSN)
	}
	SetCredentials(pc, cfg)
	dialSettings(&pc.ConnConfig.Config)
	rp := pc.ConnConfig.RuntimeParams
	// The value encoding (docs/design.md, "Records") depends on these: timestamps print in
	// UTC and ISO order, floats print shortest-exact, bytea prints hex.
	rp["TimeZone"] = "UTC"
	rp["DateStyle"] = "ISO, YMD"
	rp["IntervalStyle"] = "iso_8601"
	rp["bytea_output"] = "hex"
	rp["extra_float_digits"] = "1"
	rp["client_encoding"] = "UTF8"
	// A table with row-level security shows a role its policies apply to
	// only the rows they allow, silently: the walk would lose the others,
	// and verify, reading through the same policies, could not see them
	// missing. With row_security off such a query fails instead, and
	// prepare says what to do (rowSecurity). The owner and roles with
	// BYPASSRLS are not affected.
	if !cfg.RowSecurity {
		rp["row_security"] = "off"
	}
	if rp["application_name"] == "" {
		rp["application_name"] = "tidemark"
	}
	// Every page query is planned for its own bounds. pgx prepares them
	// once per session, and after five calls PostgreSQL may keep one
	// generic plan that looks no dearer than the calls so far: a full
	// pass's wide pages make it look cheap, and it cannot see that a head
	// pass reads a few rows at the top of the index (a parallel scan per
	// page under load, 100 to 300 ms instead of 1). Planning is a fraction
	// of a millisecond. A plan_cache_mode in the DSN is kept.
	if rp["plan_cache_mode"] == "" {
		rp["plan_cache_mode"] = "force_custom_plan"
	}
	// Every page reads the (updated_at, id) index in order and stops at
	// its LIMIT (docs/design.md, "The walk"), in a pass's view, a
	// snapshot or on its own: with sorts a last resort, statistics that
	// lag a stream of updates cannot make each page read and sort every
	// row after its cursor. A statement that must sort still does; jit
	// is off so that the sort's penalty does not push its cost past the
	// JIT thresholds and have every such page compiled. An enable_sort or
	// jit in the DSN is kept.
	if rp["enable_sort"] == "" {
		rp["enable_sort"] = "off"
	}
	if rp["jit"] == "" {
		rp["jit"] = "off"
	}
	// An initial load in key order holds LoadWorkers sessions at once;
	// the clock, mark and horizon queries need more.
	if need := int32(cfg.LoadWorkers + 2); cfg.LoadWorkers > 0 && pc.MaxConns < need {
		if strings.Contains(cfg.DSN, "pool_max_conns") {
			return nil, fmt.Errorf("%w: pool_max_conns=%d in the DSN is below what an initial load with %d workers holds (%d connections): raise pool_max_conns or lower sync.load_workers",
				ErrBadConfig, pc.MaxConns, cfg.LoadWorkers, need)
		}
		pc.MaxConns = need
	}
	if pc.MaxConns < conns && !strings.Contains(cfg.DSN, "pool_max_conns") {
		pc.MaxConns = conns
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", pc.ConnConfig.Host, err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connect to %s: %w", pc.ConnConfig.Host, err)
	}
	return pool, nil
}

// Close closes the connection pool, unless it is shared (NewOnPool).
func (s *Source) Close() {
	if !s.shared {
		s.pool.Close()
	}
}

// Page returns up to req.Limit rows after req.Cursor (or, for the first
// page of a pass, from req.Since inclusive) in (updated_at, id) order, by a
// keyset seek: never OFFSET. End is true only for a page with no rows.
func (s *Source) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	q, err := s.querierFor(ctx, req)
	if err != nil {
		return connector.Page{}, err
	}
	return s.page(ctx, q, req)
}

// Windows reports that pages may be bounded to windows of updated_at
// (PageRequest.From and Before): always, for a table.
func (s *Source) Windows() bool { return true }

func (s *Source) page(ctx context.Context, q querier, req connector.PageRequest) (connector.Page, error) {
	if req.Limit <= 0 {
		return connector.Page{}, fmt.Errorf("page limit %d: must be positive", req.Limit)
	}
	sh := s.shape()
	skip, mark, err := s.marks(ctx, q, sh, req)
	if err != nil {
		return connector.Page{}, err
	}
	lows, marks, err := s.steps(ctx, q, sh, req)
	if err != nil {
		return connector.Page{}, err
	}
	var k key
	if req.Cursor != "" {
		if k, err = decodeCursor(req.Cursor, sh.tbl.idKind); err != nil {
			return connector.Page{}, err
		}
	}
	var out []connector.Row
	for attempt := 0; ; attempt++ {
		out, err = s.query(ctx, q, sh, req, k, mark, skip, lows, marks)
		// A column's type changed under a prepared statement: pgx has
		// dropped it from its cache, so running the query again
		// prepares it anew (docs/schema-changes.md); in a pass's view,
		// whose transaction the error has ended, in a new one.
		if err != nil && attempt == 0 && planChanged(err) {
			if v, ok := q.(*passView); ok {
				if rerr := v.renew(ctx); rerr != nil {
					err = rerr
					break
				}
			}
			continue
		}
		break
	}
	if err != nil {
		return connector.Page{}, fmt.Errorf("read %s after cursor %q: %w", sh.tbl.ident, req.Cursor, s.rowFailure(err))
	}
	if len(out) == 0 {
		return connector.Page{Next: req.Cursor, End: true}, nil
	}
	last := out[len(out)-1]
	// Fewer rows than the LIMIT: the statement saw nothing after the last
	// one, as an empty page after it would have.
	return connector.Page{Rows: out, Next: key{micros: last.UpdatedAt.UnixMicro(), id: last.ID}.cursor(), Last: len(out) < req.Limit}, nil
}

// query runs one page query and decodes its rows.
// skips are the skip mark and the steps' bounds and marks (see
// buildQueries' skip).
func (s *Source) query(ctx context.Context, q querier, sh *shape, req connector.PageRequest, k key, mark *int64, skips ...any) ([]connector.Row, error) {
	var (
		rows pgx.Rows
		err  error
	)
	since := req.Since
	if req.Cursor == "" && req.From.After(since) {
		since = req.From
	}
	before := !req.Before.IsZero()
	switch {
	case req.Cursor != "" && before:
		rows, err = q.Query(ctx, sh.q.nextBefore, append(append([]any{sh.q.formats, k.time(), k.id, req.Limit}, skips...), req.Before)...)
	case req.Cursor != "":
		rows, err = q.Query(ctx, sh.q.next, append([]any{sh.q.formats, k.time(), k.id, req.Limit}, skips...)...)
	case since.IsZero() && before:
		return nil, errors.New("a page bounded above (PageRequest.Before) needs a lower bound (Since or From)")
	case since.IsZero():
		rows, err = q.Query(ctx, sh.q.all, append([]any{sh.q.formats, req.Limit}, skips...)...)
	case before:
		rows, err = q.Query(ctx, sh.q.sinceBefore, append(append([]any{sh.q.formats, since, req.Limit}, skips...), req.Before)...)
	default:
		rows, err = q.Query(ctx, sh.q.since, append([]any{sh.q.formats, since, req.Limit}, skips...)...)
	}
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	return s.readRows(sh, rows, req.Limit, mark)
}

// rowFailure makes a data exception (SQLSTATE class 22: a cast that does
// not convert, a division by zero) a configuration error naming
// source.filter when a filter is set: the operator's expression fails on a
// row, and every read of that row fails the same way, so a retry (and a
// restart) would loop for ever. Without a filter, or for the encoding
// errors (22021, 22P05) a filter cannot cause, the error passes unchanged
// and is retried as before: it may come from data the application
// corrects (a view's definition, a policy).
func (s *Source) rowFailure(err error) error {
	var pe *pgconn.PgError
	if s.cfg.Filter == "" || !errors.As(err, &pe) || !strings.HasPrefix(pe.Code, "22") || pe.Code == "22021" || pe.Code == "22P05" {
		return err
	}
	return fmt.Errorf("%w: %w: source.filter fails on a row of the table: %w; every read of that row fails the same way: make the filter safe for every row (guard its casts and divisions, e.g. with CASE or a pattern test before a cast), or fix the row", ErrBadConfig, connector.ErrPermanent, err)
}

// planChanged reports PostgreSQL's "cached plan must not change result
// type": a table changed under a prepared statement.
func planChanged(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "0A000" && strings.Contains(pgErr.Message, "cached plan must not change result type")
}

// pgEpochMicros is 2000-01-01 UTC, PostgreSQL's timestamp epoch, in Unix
// microseconds.
const pgEpochMicros = 946684800000000

// minMicros and maxMicros bound the updated_at values an RFC 3339
// timestamp can express: 0001-01-01T00:00:00Z to 9999-12-31T23:59:59.999999Z,
// in Unix microseconds.
const (
	minMicros = -62135596800000000
	maxMicros = 253402300799999999
)

// presizeRows bounds the rows readRows sizes its buffers for up front.
const presizeRows = 8192

// readRows decodes a page. Values and ids of all rows share two buffers
// (one allocation each per page, plus growth past presizeRows); rows slice
// them.
func (s *Source) readRows(sh *shape, rows pgx.Rows, limit int, mark *int64) ([]connector.Row, error) {
	// Buffers are sized for the whole page up to presizeRows rows (a load
	// page is 5 pages of 1000): growing them mid-page copied each one
	// again, 8% of a load's CPU.
	out := make([]connector.Row, 0, min(limit, presizeRows))
	enc := rowEncoder{cols: sh.q.cols}
	valueRow := make([][]byte, len(sh.q.valueAt))
	var stamp []byte // the value's updated_at, a JSON string
	expect := min(limit, presizeRows)
	var (
		vals  = make([]byte, 0, expect*int(max(s.rowBytes.Load(), 64))*9/8)
		ids   = make([]byte, 0, expect*int(max(s.idBytes.Load(), 8))*9/8)
		vEnds = make([]int, 0, expect) // end offset of each row's value in vals; -1 when deleted
		iEnds = make([]int, 0, expect) // end offset of each row's id in ids
	)
	prefix := sh.q.prefix
	// updated_at arrives in binary, except under
	// default_query_exec_mode=simple_protocol (for PgBouncer), where every
	// column is text.
	fds := rows.FieldDescriptions()
	textUA := len(fds) > 0 && fds[0].Format == pgx.TextFormatCode
	textXmin := sh.q.marks && len(fds) >= prefix && fds[prefix-1].Format == pgx.TextFormatCode
	if len(fds) > 0 { // none when the statement failed: rows.Err says why
		if err := sh.q.checkTypes(sh.tbl.ident, fds); err != nil {
			return nil, err
		}
	}
	for rows.Next() {
		raw := rows.RawValues()
		if len(raw) != sh.q.width {
			return nil, fmt.Errorf("got %d columns, want %d: the table changed during the pass; the next pass reads its new shape", len(raw), sh.q.width)
		}
		idv := raw[1]
		if idv == nil {
			return nil, fmt.Errorf("a row has a NULL id %s", quote(sh.tbl.id.name))
		}
		ua := raw[0]
		if ua == nil {
			return nil, fmt.Errorf("row id %q has a NULL %s; such rows would be skipped forever: backfill it and make the column NOT NULL", idv, quote(sh.tbl.updatedAt.name))
		}
		us, err := updatedAtMicros(ua, textUA)
		if err != nil {
			return nil, fmt.Errorf("row id %q: %s: %w", idv, quote(sh.tbl.updatedAt.name), err)
		}
		if us < minMicros || us > maxMicros {
			return nil, fmt.Errorf("%w: %w: row id %q: %s %s is outside years 1..9999, which an RFC 3339 timestamp (record headers, the checkpoint) cannot express: correct the row (nothing after the last committed transaction was published)",
				ErrBadConfig, connector.ErrPermanent, idv, quote(sh.tbl.updatedAt.name), schemas.FromMicros(us).Format("2006-01-02 15:04:05.999999Z07:00"))
		}
		deleted := sh.tbl.deletedAt != nil && len(raw[2]) == 1 && raw[2][0] == 't'
		settled := false
		if mark != nil {
			x, err := xminOf(raw[prefix-1], textXmin)
			if err != nil {
				return nil, fmt.Errorf("row id %q: xmin: %w", idv, err)
			}
			settled = !isFresh(x, *mark)
		}
		ids = append(ids, idv...)
		iEnds = append(iEnds, len(ids))
		if deleted {
			vEnds = append(vEnds, -1)
		} else {
			var err error
			for i, at := range sh.q.valueAt {
				if at == valueUpdatedAt {
					stamp = append(schemas.AppendTime(append(stamp[:0], '"'), schemas.FromMicros(us)), '"')
					valueRow[i] = stamp
				} else {
					valueRow[i] = raw[at]
				}
			}
			if vals, err = enc.appendRow(vals, valueRow); err != nil {
				return nil, fmt.Errorf("row id %q: %w", idv, err)
			}
			vEnds = append(vEnds, len(vals))
		}
		out = append(out, connector.Row{
			UpdatedAt: schemas.FromMicros(us),
			Deleted:   deleted,
			Settled:   settled,
		})
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if n := int64(len(out)); n > 0 {
		s.rowBytes.Store(int64(len(vals))/n + 1)
		s.idBytes.Store(int64(len(ids))/n + 1)
	}
	idStr := string(ids)
	iStart, vStart := 0, 0
	for i := range out {
		out[i].ID = idStr[iStart:iEnds[i]]
		iStart = iEnds[i]
		if e := vEnds[i]; e >= 0 {
			out[i].Value = vals[vStart:e:e]
			vStart = e
		}
	}
	return out, nil
}

// updatedAtMicros decodes updated_at (binary: microseconds since
// 2000-01-01; or text) into Unix microseconds. infinity and -infinity have
// no place in the change order and are refused.
func updatedAtMicros(v []byte, text bool) (int64, error) {
	const inf = "is infinity or -infinity, which has no place in the change order: set it to a real time"
	if text {
		if string(v) == "infinity" || string(v) == "-infinity" {
			return 0, errors.New(inf)
		}
		t, err := parseTimestamp(v)
		if err != nil {
			return 0, err
		}
		return t.UnixMicro(), nil
	}
	if len(v) != 8 {
		return 0, fmt.Errorf("%d bytes in binary, want 8", len(v))
	}
	pgus := int64(binary.BigEndian.Uint64(v))
	if pgus == math.MaxInt64 || pgus == math.MinInt64 {
		return 0, errors.New(inf)
	}
	return pgus + pgEpochMicros, nil
}

// rowSecurity turns PostgreSQL's refusal of a query that row-level
// security would filter (row_security is off: see connect) into a bad
// configuration naming the table, the role and the fix; nil for any other
// error. It asks the catalog (row_security_active), not the message, which
// depends on the server's lc_messages; a refusal caused by another table
// (one a filter reads) stays PostgreSQL's own error.
func rowSecurity(ctx context.Context, conn interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, t *table, err error) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "42501" || ctx.Err() != nil {
		return nil
	}
	var active bool
	var name string
	if conn.QueryRow(ctx, "SELECT row_security_active($1::oid), current_user", t.oid).Scan(&active, &name) != nil || !active {
		return nil
	}
	role := pgx.Identifier{name}.Sanitize()
	return fmt.Errorf("%w: table %s has row-level security, and its policies apply to role %s: PostgreSQL would show tidemark only the rows they allow and hide the others, which would never be published (and verify, reading through the same policies, could not see them missing); connect as the table's owner or as a role with BYPASSRLS (ALTER ROLE %s BYPASSRLS), or disable row-level security on the table: %w",
		ErrBadConfig, t.ident, role, role, err)
}

// isQueryError reports whether err is PostgreSQL rejecting a statement
// itself: its syntax, a name or type in it, a privilege it needs (SQLSTATE
// classes 42, 22, 0A, 21 and 3F). Anything else that comes from the server,
// a terminated backend (57P01), a shutdown, a lost connection, a lack of
// resources, is the session failing, which is transient.
func isQueryError(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || len(pgErr.Code) < 2 {
		return false
	}
	switch pgErr.Code[:2] {
	case "42", "22", "0A", "21", "3F":
		return true
	}
	return false
}
