package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Check runs the full preflight (docs/design.md, "Source table requirements") without needing a working
// Source: it connects, inspects the table, and when the table is usable
// also checks the filter and the index. The error is for connection or
// I/O failures (and invalid configuration, wrapping ErrBadConfig); unmet
// requirements are findings, and Report.Err turns Fail findings into an
// ErrBadConfig error.
func Check(ctx context.Context, cfg Config) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	pool, err := connect(ctx, cfg, 0)
	if err != nil {
		return Report{}, err
	}
	defer pool.Close()
	return check(ctx, pool, cfg)
}

// Check runs the full preflight on the source's own connection pool; see
// the package-level Check.
func (s *Source) Check(ctx context.Context) (Report, error) {
	return check(ctx, s.pool, s.cfg)
}

func check(ctx context.Context, pool *pgxpool.Pool, cfg Config) (Report, error) {
	t, rep, err := inspect(ctx, pool, cfg)
	if err != nil || t == nil {
		return rep, err
	}
	q := buildQueries(cfg, t)
	if err := checkIndex(ctx, pool, cfg, t, q, &rep); err != nil {
		return rep, err
	}
	if slices.ContainsFunc(rep.Findings, func(f Finding) bool { return f.Check == "row security" }) {
		return rep, nil // every query on the table is refused
	}
	if cfg.LoadWorkers > 0 && !slices.ContainsFunc(rep.Findings, func(f Finding) bool { return f.Check == "filter" && f.Severity == Fail }) {
		if err := checkLoadIndex(ctx, pool, t, q, &rep); err != nil {
			return rep, err
		}
	}
	err = checkTimes(ctx, pool, cfg, t, &rep)
	return rep, err
}

// checkTimes reports rows whose updated_at is ahead of the database's
// clock (published, but they never move the watermark past the clock, so
// they are read again until the clock reaches them), and fails on rows
// outside years 1..9999, which an RFC 3339 timestamp (record headers, the
// checkpoint) cannot express.
func checkTimes(ctx context.Context, pool *pgxpool.Pool, cfg Config, t *table, rep *Report) error {
	ua := quote(t.updatedAt.name)
	var ahead, outside int64
	var latest, example *string
	if err := pool.QueryRow(ctx, timesQuery(cfg, t)).Scan(&ahead, &latest, &outside, &example); err != nil {
		return fmt.Errorf("check %s: %w", ua, err)
	}
	if outside > 0 {
		rep.fail("timestamps", "%d rows of %s have %s outside years 1..9999 (e.g. id %s), which an RFC 3339 timestamp cannot express: correct them (after year 9999 is usually a sentinel such as 'infinity' written as a date)",
			outside, t.ident, ua, deref(example))
	}
	if ahead > 0 {
		rep.warn("timestamps", "%d rows of %s have %s ahead of the database clock (the latest %s): they are published, but the watermark never passes the clock, so they are read again on every pass until it reaches them; fix the writer's clock or time zone if that is not intended",
			ahead, t.ident, ua, deref(latest))
	} else if outside == 0 {
		rep.ok("timestamps", "no row of %s has %s ahead of the database clock", t.ident, ua)
	}
	return nil
}

// timesQuery counts the rows checkTimes reports (a row after year 9999 is
// outside, not ahead). It runs at every start, so
// its WHERE must be served by the (updated_at, id) index: two range scans,
// rows ahead of the clock and rows before year 1, both normally empty.
// statement_timestamp() is stable, so the planner can use it as an index
// bound; clock_timestamp() is volatile and would force a sequential scan
// of the whole table.
func timesQuery(cfg Config, t *table) string {
	ua, id := quote(t.updatedAt.name), quote(t.id.name)
	filter := ""
	if cfg.Filter != "" {
		filter = " AND (" + cfg.Filter + "\n)" // see checkFilter
	}
	const (
		first = "'0001-01-01 00:00:00+00'"
		end   = "'10000-01-01 00:00:00+00'"
	)
	outside := "NOT (" + ua + " >= " + first + " AND " + ua + " < " + end + ")"
	ahead := ua + " > statement_timestamp() AND " + ua + " < " + end
	return "SELECT count(*) FILTER (WHERE " + ahead + "),\n" +
		"\tmax(" + ua + ") FILTER (WHERE " + ahead + ")::text,\n" +
		"\tcount(*) FILTER (WHERE " + outside + "),\n" +
		"\tmin(" + id + "::text) FILTER (WHERE " + outside + ")\n" +
		"FROM " + t.ident + " WHERE (" + ua + " > statement_timestamp() OR " + ua + " < " + first + ")" + filter
}

func deref(s *string) string {
	if s == nil {
		return "?"
	}
	return *s
}

// explainParams are realistic parameters for the steady-state next-page
// query: a cursor just behind the present, a typical page size.
func explainParams(t *table) []any {
	return []any{time.Now().Add(-10 * time.Second), t.idKind.zero(), 1000, nil, nil, nil}
}

// checkIndex decides whether an index serves ORDER BY updated_at, id for
// the real next-page query (with the filter).
//
// Reading the planner's choice alone is not robust: on a small or
// unanalysed table PostgreSQL rightly prefers a Seq Scan and a Sort even
// when the index exists, and that choice flips as the table grows. So the
// query is explained twice inside a read-only transaction:
//
//  1. with enable_seqscan and enable_sort off (SET LOCAL). These settings
//     only penalise a plan; if no index can deliver the order, the plan
//     still contains a Sort. A Sort here means no usable index, an
//     Incremental Sort means an index on updated_at alone: Warn with the
//     CREATE INDEX to run.
//  2. with the session's settings, the pages' own. With sorts a last
//     resort there (see New), a Sort over a Seq Scan although an index
//     exists means the DSN turned enable_sort back on; that matters only
//     on a big table (statistics are stale or the filter defeats the
//     index): Warn with ANALYZE advice above 10,000 estimated rows, else
//     OK.
//
// A filter that PostgreSQL rejects is a Fail finding.
func checkIndex(ctx context.Context, pool *pgxpool.Pool, cfg Config, t *table, q queries, rep *Report) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("check index: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	args := explainParams(t)
	natural, err := explain(ctx, tx, q.next, args)
	if err != nil {
		// The pool may hold one connection (pool_max_conns=1): give the
		// transaction's back before rowSecurity asks the catalog.
		_ = tx.Rollback(ctx)
		if rerr := rowSecurity(ctx, pool, t, err); rerr != nil {
			rep.fail("row security", "%s", strings.TrimPrefix(rerr.Error(), ErrBadConfig.Error()+": "))
			return nil
		}
		if isQueryError(err) && ctx.Err() == nil {
			rep.fail("filter", "the page query for %s is rejected by PostgreSQL (check filter and columns): %v", t.ident, err)
			return nil
		}
		return fmt.Errorf("check index: %w", err)
	}
	if cfg.Filter != "" {
		rep.ok("filter", "filter (%s) is valid SQL", cfg.Filter)
	}
	if err := penalise(ctx, tx); err != nil {
		return fmt.Errorf("check index: %w", err)
	}
	forced, err := explain(ctx, tx, q.next, args)
	if err != nil {
		return fmt.Errorf("check index: %w", err)
	}
	cols := quote(t.updatedAt.name) + ", " + quote(t.id.name)
	concurrently := "CONCURRENTLY "
	if t.relkind == 'p' {
		concurrently = "" // not supported on a partitioned parent
	}
	switch {
	case forced.has("Sort"):
		rep.warn("index", "no index serves ORDER BY %s on %s: every page would sort the table (EXPLAIN shows a Sort). Run: CREATE INDEX %sON %s (%s);",
			cols, t.ident, concurrently, t.ident, cols)
		return nil
	case forced.has("Incremental Sort"):
		// An index on updated_at alone: each page re-reads and sorts every
		// row sharing the cursor's updated_at, which a bulk update makes
		// the whole table.
		rep.warn("index", "an index serves ORDER BY %s on %s only partly (EXPLAIN shows an Incremental Sort): rows sharing one updated_at, as after a bulk update, are re-read and sorted on every page. Run: CREATE INDEX %sON %s (%s);",
			quote(t.updatedAt.name), t.ident, concurrently, t.ident, cols)
		return nil
	}
	if natural.sortOverSeqScan() && t.reltuples >= 10000 {
		rep.warn("index", "an index can serve ORDER BY %s on %s, but the planner chose a Sort over a Seq Scan for the page query (about %.0f rows): run ANALYZE %s, and check that the filter does not defeat the index",
			cols, t.ident, t.reltuples, t.ident)
		return nil
	}
	rep.ok("index", "index %s serves ORDER BY %s", forced.indexName(), cols)
	return nil
}

// checkLoadIndex explains the key-order load's page statement (a range
// bounded on both sides; docs/design.md, "The initial load in key order")
// with sequential scans and sorts penalised, as checkIndex does: a Sort
// left in the plan means no index delivers ORDER BY id, so every load page
// would sort the rest of its range (a unique index of another operator
// class or collation than the column's serves uniqueness, not the order).
func checkLoadIndex(ctx context.Context, pool *pgxpool.Pool, t *table, q queries, rep *Report) error {
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("check the load's index: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := penalise(ctx, tx); err != nil {
		return fmt.Errorf("check the load's index: %w", err)
	}
	zero := t.idKind.zero()
	plan, err := explain(ctx, tx, q.load[loadAfter|loadUpTo], []any{zero, zero, 1000})
	if err != nil {
		return fmt.Errorf("check the load's index: %w", err)
	}
	id := quote(t.id.name)
	if plan.has("Sort") || plan.has("Incremental Sort") {
		rep.warn("load", "no index serves ORDER BY %s on %s, which the initial load in key order (sync.load_workers) reads by: every load page would sort the rest of its key range (a unique index of another operator class or collation serves uniqueness, not this order). Add a plain unique index or primary key on %s, or leave sync.load_workers at 0",
			id, t.ident, id)
		return nil
	}
	rep.ok("load", "index %s serves ORDER BY %s for the initial load in key order", plan.indexName(), id)
	return nil
}

// penalise makes sequential scans and sorts a last resort for the rest of
// tx, so that a plan that still sorts has no index to serve its order.
func penalise(ctx context.Context, tx pgx.Tx) error {
	for _, set := range []string{"SET LOCAL enable_seqscan = off", "SET LOCAL enable_sort = off"} {
		if _, err := tx.Exec(ctx, set); err != nil {
			return fmt.Errorf("%s: %w", set, err)
		}
	}
	return nil
}

// planNode is the part of EXPLAIN (FORMAT JSON) output the check reads.
type planNode struct {
	NodeType  string     `json:"Node Type"`
	IndexName string     `json:"Index Name"`
	Plans     []planNode `json:"Plans"`
}

func explain(ctx context.Context, tx querier, sql string, args []any) (planNode, error) {
	var raw []byte
	if err := tx.QueryRow(ctx, "EXPLAIN (FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
		return planNode{}, err
	}
	var out []struct {
		Plan planNode `json:"Plan"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out) == 0 {
		return planNode{}, fmt.Errorf("unexpected EXPLAIN output %.200s: %v", raw, err)
	}
	return out[0].Plan, nil
}

// has reports whether the plan contains a node of the given type.
func (n planNode) has(nodeType string) bool {
	if n.NodeType == nodeType {
		return true
	}
	for _, c := range n.Plans {
		if c.has(nodeType) {
			return true
		}
	}
	return false
}

// sortOverSeqScan reports a Sort node with a Seq Scan beneath it.
func (n planNode) sortOverSeqScan() bool {
	if n.NodeType == "Sort" && n.has("Seq Scan") {
		return true
	}
	for _, c := range n.Plans {
		if c.sortOverSeqScan() {
			return true
		}
	}
	return false
}

// indexName is the first index the plan scans, quoted, or "(unnamed)".
func (n planNode) indexName() string {
	if n.IndexName != "" {
		return quote(n.IndexName)
	}
	for _, c := range n.Plans {
		if s := c.indexName(); s != "(unnamed)" {
			return s
		}
	}
	return "(unnamed)"
}
