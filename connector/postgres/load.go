package postgres

import (
	"context"
	"fmt"
	"math"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
)

var (
	_ connector.RangeLoader        = (*Source)(nil)
	_ connector.SessionSnapshotter = (*Source)(nil)
	_ connector.RangeLoader        = (*Snapshot)(nil)
)

// Variants of the load page statement (queries.load): with a lower bound
// on the id (exclusive), with an upper bound (inclusive), or both.
const (
	loadAfter = 1 << iota
	loadUpTo
)

// LoadPage returns up to req.Limit rows of the key range after the cursor
// in id order, by a keyset seek on the id (its unique index): the initial
// load in key order (docs/design.md, "The initial load in key order"). The
// cursor is the last id returned. End is true only for a page with no
// rows. Each call uses one pooled connection: safe for concurrent use.
func (s *Source) LoadPage(ctx context.Context, req connector.LoadRequest) (connector.Page, error) {
	return s.loadPage(ctx, s.pool, req)
}

func (s *Source) loadPage(ctx context.Context, q querier, req connector.LoadRequest) (connector.Page, error) {
	if req.Limit <= 0 {
		return connector.Page{}, fmt.Errorf("page limit %d: must be positive", req.Limit)
	}
	sh := s.shape()
	_, mark, err := s.marks(ctx, q, sh, connector.PageRequest{Mark: req.Mark})
	if err != nil {
		return connector.Page{}, err
	}
	after := req.Range.Lo
	if req.Cursor != "" {
		var ok bool
		if after, ok = strings.CutPrefix(req.Cursor, loadCursorPrefix); !ok {
			return connector.Page{}, badCheckpoint(fmt.Errorf("load cursor %q from the checkpoint is not a PostgreSQL-source load cursor", req.Cursor))
		}
	}
	v, args := 0, make([]any, 0, 4)
	args = append(args, sh.q.formats)
	for _, b := range []struct {
		id, what string
		bit      int
		set      bool
	}{
		{after, "lower bound", loadAfter, req.Cursor != "" || after != ""}, // a cursor may hold the empty text id
		{req.Range.Hi, "upper bound", loadUpTo, req.Range.Hi != ""},
	} {
		if !b.set {
			continue
		}
		if err := sh.tbl.idKind.validate(b.id); err != nil {
			return connector.Page{}, badCheckpoint(fmt.Errorf("key range %s %q from the checkpoint: %w", b.what, b.id, err))
		}
		v |= b.bit
		args = append(args, b.id)
	}
	args = append(args, req.Limit)
	var out []connector.Row
	for attempt := 0; ; attempt++ {
		var rows pgx.Rows
		rows, err = q.Query(ctx, sh.q.load[v], args...)
		if err == nil {
			out, err = s.readRows(sh, rows, req.Limit, mark)
			rows.Close()
		}
		// A column's type changed under a prepared statement: run it
		// again (see page).
		if err != nil && attempt == 0 && planChanged(err) {
			continue
		}
		break
	}
	if err != nil {
		return connector.Page{}, fmt.Errorf("read %s in id order after %q up to %q: %w", sh.tbl.ident, after, req.Range.Hi, s.rowFailure(err))
	}
	if len(out) == 0 {
		return connector.Page{Next: req.Cursor, End: true}, nil
	}
	// Fewer rows than the LIMIT: the statement saw nothing more in the
	// range, as an empty page after it would have (see page).
	return connector.Page{Rows: out, Next: loadCursorPrefix + out[len(out)-1].ID, Last: len(out) < req.Limit}, nil
}

// loadCursorPrefix starts a load cursor, followed by the last id read
// (which may be the empty string, for a text id).
const loadCursorPrefix = "i:"

// SplitKeys divides the id space into at most n ranges of about as many
// rows each, from a sample of the table's pages (TABLESAMPLE SYSTEM, some
// 64 rows per range), so the split follows how the ids are spread rather
// than assuming them even. A view or foreign table, an empty table, or
// n <= 1 gives one range, the whole space.
func (s *Source) SplitKeys(ctx context.Context, n int) ([]connector.KeyRange, error) {
	return s.splitKeys(ctx, s.pool, n)
}

func (s *Source) splitKeys(ctx context.Context, q querier, n int) ([]connector.KeyRange, error) {
	whole := []connector.KeyRange{{}}
	sh := s.shape()
	if n <= 1 || !sh.q.marks {
		return whole, nil
	}
	// Pages of the table (of every partition of a partitioned one).
	var pages int64
	if err := q.QueryRow(ctx, `SELECT (pg_catalog.pg_relation_size($1::oid::regclass) + coalesce((SELECT sum(pg_catalog.pg_relation_size(relid))
		FROM pg_catalog.pg_partition_tree($1::oid::regclass)), 0))::bigint / pg_catalog.current_setting('block_size')::bigint`, sh.tbl.oid).Scan(&pages); err != nil {
		return nil, fmt.Errorf("size of %s: %w", sh.tbl.ident, err)
	}
	if pages == 0 {
		return whole, nil
	}
	// Enough pages for some 64 rows a range at 20 rows a page, and never
	// fewer than 32 pages (SYSTEM samples whole pages).
	want := max(float64(n)*64/20, 32)
	pct := math.Min(100, 100*want/float64(pages))
	filter := ""
	if s.cfg.Filter != "" {
		filter = " WHERE (" + s.cfg.Filter + "\n)" // see checkFilter
	}
	id := quote(sh.tbl.id.name)
	// ORDER BY a qualified column sorts by the id itself, in its own type
	// and collation: a bare name would resolve to an output column first,
	// the id's text, whatever the id is called. The filter stays in an
	// unaliased FROM, as in every other query.
	rows, err := q.Query(ctx, "SELECT tidemark_sample."+id+"::text FROM (SELECT "+id+" FROM "+sh.tbl.ident+" TABLESAMPLE SYSTEM ($1)"+filter+
		") AS tidemark_sample ORDER BY tidemark_sample."+id, pct)
	if err != nil {
		return nil, fmt.Errorf("sample the ids of %s: %w", sh.tbl.ident, s.rowFailure(err))
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("sample the ids of %s: %w", sh.tbl.ident, s.rowFailure(err))
	}
	var out []connector.KeyRange
	lo := ""
	for i := 1; i < n && len(ids) >= n; i++ {
		hi := ids[i*len(ids)/n]
		if hi == lo || hi == "" {
			// A run of one id in the sample (ORDER BY sorted them), or
			// the empty text id, which cannot bound a range ("" means
			// open).
			continue
		}
		out = append(out, connector.KeyRange{Lo: lo, Hi: hi})
		lo = hi
	}
	return append(out, connector.KeyRange{Lo: lo}), nil
}

// LoadPage reads a page of a key range inside the view, on one of its
// sessions; see Source.LoadPage.
func (sn *Snapshot) LoadPage(ctx context.Context, req connector.LoadRequest) (connector.Page, error) {
	var p connector.Page
	err := sn.with(ctx, func(tx pgx.Tx) (err error) {
		p, err = sn.src.loadPage(ctx, tx, req)
		return err
	})
	return p, err
}

// SplitKeys splits the id space as the view shows it; see Source.SplitKeys.
func (sn *Snapshot) SplitKeys(ctx context.Context, n int) ([]connector.KeyRange, error) {
	var out []connector.KeyRange
	err := sn.with(ctx, func(tx pgx.Tx) (err error) {
		out, err = sn.src.splitKeys(ctx, tx, n)
		return err
	})
	return out, err
}
