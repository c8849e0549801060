package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
)

var _ connector.ClockedReshaper = (*Source)(nil)

// shape is the table as the page queries were built for it.
type shape struct {
	tbl *table
	q   queries
	// sig summarises the catalog's description of the table (its oid;
	// every live column's number, name, type, modifier and NOT NULL; its
	// unique indexes), compared at the start of every pass.
	sig string
}

func (s *Source) shape() *shape { return s.sh.Load() }

// signatureSQL is the cheap check made at the start of every pass: one
// catalog row for the table, named by the two literals signatureSQLFor
// puts in place of %s (no parameters, so that each session plans it once:
// its plan costs several times its run, and the sessions' plan_cache_mode
// plans every call of a statement with parameters). NOT NULL and the
// unique indexes are in it because the requirements depend on them: an
// updated_at made nullable (incremental pages never return a NULL one) or
// an id no longer unique (ties would no longer be ordered totally) must be
// seen, not just a renamed or retyped column.
const signatureSQL = `SELECT c.oid::text || '|' || coalesce(string_agg(a.attnum || ':' || a.attname || ':' || a.atttypid || ':' || a.atttypmod || ':' || a.attnotnull, ',' ORDER BY a.attnum), '')
		|| '|' || coalesce((SELECT string_agg(i.indexrelid::text || ':' || i.indkey::text || ':' || i.indisvalid || ':' || (i.indpred IS NULL), ',' ORDER BY i.indexrelid)
			FROM pg_catalog.pg_index i WHERE i.indrelid = c.oid AND i.indisunique), '')
	FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
	LEFT JOIN pg_catalog.pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
	WHERE n.nspname = %s AND c.relname = %s
	GROUP BY c.oid`

// signatureSQLFor is signatureSQL for the configured table.
func signatureSQLFor(cfg Config) string {
	return fmt.Sprintf(signatureSQL, quoteLiteral(cfg.Schema), quoteLiteral(cfg.Table))
}

// signature runs sql, signatureSQLFor(cfg).
func signature(ctx context.Context, q querier, cfg Config, sql string) (string, error) {
	var sig string
	err := q.QueryRow(ctx, sql).Scan(&sig)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil // gone: inspect says so
	}
	if err != nil {
		return "", fmt.Errorf("read the shape of %s: %w", quote(cfg.Schema, cfg.Table), err)
	}
	return sig, nil
}

// Reshape re-reads the table's shape at the start of a pass and, when it
// changed, switches the page queries to it (docs/schema-changes.md):
//   - with every column selected (no source.columns), an added column is
//     in the records from now on, a dropped one is gone, and a changed type
//     is encoded by its new type;
//   - with listed columns, a listed column that is gone, or whose encoding
//     changed (a number became text, say), is a safety stop naming it;
//   - the id, updated_at or deleted_at column gone (renamed?) or no longer
//     fit for its role is a safety stop, and so is the table gone.
//
// It returns nil when the shape is unchanged. A change a view took on
// first (see SnapshotSessions) is returned by the next call.
func (s *Source) Reshape(ctx context.Context) (*connector.ShapeChange, error) {
	ch, err := s.reshape(ctx)
	if err != nil {
		return nil, err
	}
	return mergeChanges(s.pending.Swap(nil), ch), nil
}

// keepChange holds a change that a view took on, for the next Reshape.
func (s *Source) keepChange(ch *connector.ShapeChange) {
	if ch != nil {
		s.pending.Store(mergeChanges(s.pending.Load(), ch))
	}
}

// mergeChanges is a then b as one change (either may be nil).
func mergeChanges(a, b *connector.ShapeChange) *connector.ShapeChange {
	if a == nil || b == nil {
		if a == nil {
			return b
		}
		return a
	}
	return &connector.ShapeChange{
		Old:      a.Old,
		New:      b.New,
		Added:    append(slices.Clone(a.Added), b.Added...),
		Dropped:  append(slices.Clone(a.Dropped), b.Dropped...),
		Retyped:  append(slices.Clone(a.Retyped), b.Retyped...),
		Replaced: a.Replaced || b.Replaced,
	}
}

// reshapeNowSQLFor is the statement of ReshapeNow: the signature ("" for
// no table) and the clock.
func reshapeNowSQLFor(cfg Config) string {
	return "SELECT coalesce((" + signatureSQLFor(cfg) + "), ''), clock_timestamp()"
}

// ReshapeNow is Reshape and Now in one round trip: the signature and the
// clock are one statement.
func (s *Source) ReshapeNow(ctx context.Context) (*connector.ShapeChange, time.Time, error) {
	var sig string
	var now time.Time
	if err := s.pool.QueryRow(ctx, s.reshapeNowSQL).Scan(&sig, &now); err != nil {
		return nil, time.Time{}, fmt.Errorf("read the shape of %s and the database clock: %w", quote(s.cfg.Schema, s.cfg.Table), err)
	}
	ch, err := s.reshapeTo(ctx, sig)
	if err != nil {
		return nil, time.Time{}, err
	}
	return mergeChanges(s.pending.Swap(nil), ch), now.UTC(), nil
}

func (s *Source) reshape(ctx context.Context) (*connector.ShapeChange, error) {
	sig, err := signature(ctx, s.pool, s.cfg, s.sigSQL)
	if err != nil {
		return nil, err
	}
	return s.reshapeTo(ctx, sig)
}

// reshapeTo switches to the shape whose signature is sig, if it is not
// the one the page queries were built for.
func (s *Source) reshapeTo(ctx context.Context, sig string) (*connector.ShapeChange, error) {
	old := s.shape()
	if sig == old.sig {
		return nil, nil
	}
	tbl, rep, err := inspect(ctx, s.pool, s.cfg)
	if err != nil {
		return nil, err
	}
	if err := rep.Err(); err != nil || tbl == nil {
		return nil, s.shapeStop(old.tbl, fmt.Sprintf("the table %s changed and no longer meets the requirements: %v", old.tbl.ident, err))
	}
	if tbl.idKind != old.tbl.idKind {
		return nil, s.shapeStop(old.tbl, fmt.Sprintf("the id column %s of %s changed type (%s to %s): the keys of the records already published would no longer match",
			quote(tbl.id.name), tbl.ident, old.tbl.id.typeName, tbl.id.typeName))
	}
	change := &connector.ShapeChange{Old: old.tbl.describe(), New: tbl.describe()}
	before := map[string]valueColumn{}
	for _, c := range old.tbl.value {
		before[c.name] = c
	}
	after := map[string]valueColumn{}
	for _, c := range tbl.value {
		after[c.name] = c
		if b, ok := before[c.name]; !ok {
			change.Added = append(change.Added, c.name)
		} else if b.kind != c.kind || b.elem != c.elem || old.tbl.col(c.name).typeName != tbl.col(c.name).typeName {
			change.Retyped = append(change.Retyped, c.name)
			if len(s.cfg.Columns) > 0 && (b.kind != c.kind || b.elem != c.elem) {
				return nil, s.shapeStop(old.tbl, fmt.Sprintf("the listed column %s of %s changed type incompatibly (%s to %s): its values would be encoded differently",
					quote(c.name), tbl.ident, old.tbl.col(c.name).typeName, tbl.col(c.name).typeName))
			}
		}
	}
	for _, c := range old.tbl.value {
		if _, ok := after[c.name]; !ok {
			change.Dropped = append(change.Dropped, c.name)
		}
	}
	if tbl.oid != old.tbl.oid {
		change.Replaced = true
	}
	sh := &shape{tbl: tbl, q: buildQueries(s.cfg, tbl), sig: sig}
	if !change.Replaced && len(change.Added)+len(change.Dropped)+len(change.Retyped) == 0 {
		// Only something the requirements look at changed, and they
		// still hold (a value column's NOT NULL, a unique index):
		// the same queries and records.
		s.sh.Store(sh)
		return nil, nil
	}
	if err := prepare(ctx, s.pool, sh); err != nil {
		if errors.Is(err, ErrBadConfig) {
			return nil, s.shapeStop(old.tbl, err.Error())
		}
		return nil, err
	}
	s.sh.Store(sh)
	// Every pooled connection may hold statements prepared for the old
	// shape; the same SQL text would fail once with "cached plan must not
	// change result type" on each of them. New connections start clean.
	s.pool.Reset()
	return change, nil
}

// shapeStop is the safety stop for a table change the configuration cannot
// follow.
func (s *Source) shapeStop(_ *table, reason string) error {
	return &connector.StopError{
		Reason: reason,
		Hint: "restore the table, or change the configuration to the new shape (source.columns, source.id_column, source.updated_at_column, source.deleted_at_column) " +
			"and decide with `tidemark reset` (see docs/schema-changes.md); nothing was published on the new shape",
	}
}

// describe lists the value columns with their types, for the log.
func (t *table) describe() string {
	parts := make([]string, 0, len(t.value))
	for _, c := range t.value {
		parts = append(parts, c.name+" "+t.col(c.name).typeName)
	}
	return strings.Join(parts, ", ")
}
