package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// querier is what the catalog and page code need from a pool, a connection
// or a transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// column is one table column as the catalog describes it.
type column struct {
	name     string
	num      int16
	notNull  bool
	typeName string // format_type(atttypid, atttypmod), for messages
	base     uint32 // type OID with domains resolved
	kind     kind
	elem     kind // for kindArray
	delim    byte // for kindArray
}

// table is the introspected source table.
type table struct {
	oid       uint32
	relkind   byte
	reltuples float64
	ident     string // "schema"."table"
	cols      []column
	byName    map[string]int

	id, updatedAt, deletedAt *column // deletedAt nil when not configured
	idKind                   idKind
	value                    []valueColumn
}

func (t *table) col(name string) *column {
	if i, ok := t.byName[name]; ok {
		return &t.cols[i]
	}
	return nil
}

func (t *table) colNames() string {
	names := make([]string, len(t.cols))
	for i, c := range t.cols {
		names[i] = c.name
	}
	return strings.Join(names, ", ")
}

func quote(parts ...string) string { return pgx.Identifier(parts).Sanitize() }

// inspect reads the table's description from the catalog and checks it
// against docs/design.md, "Source table requirements". The error is for I/O failures only; unmet
// requirements are Fail findings. The table is nil when the findings leave
// nothing to build queries from.
func inspect(ctx context.Context, q querier, cfg Config) (*table, Report, error) {
	var rep Report
	t := &table{ident: quote(cfg.Schema, cfg.Table)}
	var found bool
	var canSelect bool
	var relkind string
	err := q.QueryRow(ctx, `
		SELECT c.oid, c.relkind::text, c.reltuples::float8, has_table_privilege(c.oid, 'SELECT')
		FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname = $2`, cfg.Schema, cfg.Table).
		Scan(&t.oid, &relkind, &t.reltuples, &canSelect)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
	case err != nil:
		return nil, rep, fmt.Errorf("look up table %s: %w", t.ident, err)
	default:
		found = true
	}
	if !found {
		rep.fail("table", "table %s does not exist (or the role cannot see its schema): check schema and table in the configuration, and GRANT USAGE ON SCHEMA %s", t.ident, quote(cfg.Schema))
		return nil, rep, nil
	}
	t.relkind = relkind[0]
	switch t.relkind {
	case 'r', 'p', 'm', 'v', 'f':
	default:
		rep.fail("table", "%s is not a table (relkind %q)", t.ident, relkind)
		return nil, rep, nil
	}
	if !canSelect {
		rep.fail("table", "the role may not read %s: GRANT SELECT ON %s TO <role>", t.ident, t.ident)
	} else {
		rep.ok("table", "table %s exists and is readable", t.ident)
	}

	// A SQL_ASCII database stores text bytes unchecked and converts
	// nothing for a UTF8 client, so a value may not be UTF-8; its JSON
	// holds U+FFFD for such bytes (appendString).
	var encoding string
	if err := q.QueryRow(ctx, "SELECT current_setting('server_encoding')").Scan(&encoding); err != nil {
		return nil, rep, fmt.Errorf("read server_encoding: %w", err)
	}
	if encoding == "SQL_ASCII" {
		rep.warn("encoding", "the database's encoding is SQL_ASCII: PostgreSQL stores text bytes without checking them and converts nothing, so a text value of %s may not be UTF-8; records are JSON, where each such byte becomes U+FFFD, so two values that differ only there publish, and verify, as one; move the data to a UTF8 database, or make sure every writer writes UTF-8", t.ident)
	}

	if err := t.loadColumns(ctx, q); err != nil {
		return nil, rep, err
	}

	idOK := t.checkID(ctx, q, cfg.IDColumn, &rep)
	if idOK != nil {
		return nil, rep, idOK
	}
	t.checkUpdatedAt(cfg.UpdatedAtColumn, &rep)
	if cfg.DeletedAtColumn != "" {
		t.checkDeletedAt(cfg.DeletedAtColumn, &rep)
	}

	names := cfg.Columns
	if len(names) == 0 {
		names = make([]string, len(t.cols))
		for i, c := range t.cols {
			names[i] = c.name
		}
	}
	var missing []string
	for _, n := range names {
		c := t.col(n)
		if c == nil {
			missing = append(missing, quote(n))
			continue
		}
		t.value = append(t.value, valueColumn{name: c.name, kind: c.kind, elem: c.elem, delim: c.delim})
	}
	if len(missing) > 0 {
		rep.fail("columns", "configured columns %s do not exist in %s (it has: %s)", strings.Join(missing, ", "), t.ident, t.colNames())
	}
	t.value = newValueColumns(t.value)
	if rep.Err() != nil {
		return nil, rep, nil
	}
	return t, rep, nil
}

// loadColumns reads the live columns in ordinal order and resolves each
// type (through domains) to its encoding.
func (t *table) loadColumns(ctx context.Context, q querier) error {
	rows, err := q.Query(ctx, `
		SELECT a.attnum, a.attname::text, a.attnotnull, a.atttypid, format_type(a.atttypid, a.atttypmod)
		FROM pg_catalog.pg_attribute a
		WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped
		ORDER BY a.attnum`, t.oid)
	if err != nil {
		return fmt.Errorf("read columns of %s: %w", t.ident, err)
	}
	type raw struct {
		col column
		typ uint32
	}
	var raws []raw
	for rows.Next() {
		var r raw
		if err := rows.Scan(&r.col.num, &r.col.name, &r.col.notNull, &r.typ, &r.col.typeName); err != nil {
			rows.Close()
			return fmt.Errorf("read columns of %s: %w", t.ident, err)
		}
		raws = append(raws, r)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("read columns of %s: %w", t.ident, err)
	}
	types := typeResolver{q: q, cache: map[uint32]typeInfo{}}
	t.byName = make(map[string]int, len(raws))
	for _, r := range raws {
		ti, err := types.resolve(ctx, r.typ)
		if err != nil {
			return fmt.Errorf("column %q of %s: %w", r.col.name, t.ident, err)
		}
		c := r.col
		c.base = ti.base
		if ti.elem != 0 {
			et, err := types.resolve(ctx, ti.elem)
			if err != nil {
				return fmt.Errorf("column %q of %s: %w", r.col.name, t.ident, err)
			}
			c.kind, c.elem, c.delim = kindArray, kindOf(et.base), et.delim
		} else {
			c.kind = kindOf(ti.base)
		}
		t.byName[c.name] = len(t.cols)
		t.cols = append(t.cols, c)
	}
	return nil
}

// typeInfo is a type with domains resolved.
type typeInfo struct {
	base  uint32 // the base type (itself when not a domain)
	elem  uint32 // element type when base is a true array type, else 0
	delim byte   // typdelim of base, used when it is an array element
}

type typeResolver struct {
	q     querier
	cache map[uint32]typeInfo
}

func (r *typeResolver) resolve(ctx context.Context, oid uint32) (typeInfo, error) {
	if ti, ok := r.cache[oid]; ok {
		return ti, nil
	}
	cur := oid
	for range 32 { // domains over domains; PostgreSQL forbids cycles
		var typtype, delim string
		var basetype, elem uint32
		var isArray bool
		// Only types whose input function is array_in use the {...} text
		// format; int2vector and oidvector also have typelem but print
		// space-separated lists, so they stay strings.
		err := r.q.QueryRow(ctx, `
			SELECT typtype::text, typbasetype, typelem, typdelim::text, typinput = 'pg_catalog.array_in'::regproc
			FROM pg_catalog.pg_type WHERE oid = $1`, cur).Scan(&typtype, &basetype, &elem, &delim, &isArray)
		if err != nil {
			return typeInfo{}, fmt.Errorf("look up type %d: %w", cur, err)
		}
		if typtype == "d" {
			cur = basetype
			continue
		}
		ti := typeInfo{base: cur, delim: ','}
		if len(delim) == 1 {
			ti.delim = delim[0]
		}
		if isArray {
			ti.elem = elem
		}
		r.cache[oid] = ti
		return ti, nil
	}
	return typeInfo{}, fmt.Errorf("type %d: domain chain too deep", oid)
}

func (t *table) checkID(ctx context.Context, q querier, name string, rep *Report) error {
	c := t.col(name)
	if c == nil {
		rep.fail("id", "id column %s does not exist in %s (it has: %s): set id_column to the table's unique key", quote(name), t.ident, t.colNames())
		return nil
	}
	t.id = c
	problems := 0
	t.idKind = idKindOf(c.base)
	if t.idKind == idInvalid {
		problems++
		rep.fail("id", "id column %s of %s has type %s; it must be bigint, integer, smallint, text, varchar or uuid (its text form is the Kafka key and the cursor)", quote(name), t.ident, c.typeName)
	}
	if !c.notNull && t.relkind != 'v' && t.relkind != 'f' {
		// A view's columns are never NOT NULL; the uniqueness finding
		// below says why it cannot be read.
		problems++
		rep.fail("id", "id column %s of %s is nullable; a NULL id cannot be a key: ALTER TABLE %s ALTER COLUMN %s SET NOT NULL", quote(name), t.ident, t.ident, quote(name))
	}
	// Unique means a valid, non-partial unique index (or primary key) on
	// exactly this one column: only then is (updated_at, id) a total order.
	// With a nondeterministic collation (say case-insensitive), which
	// calls 'a' and 'A' equal, it must also be of the column's collation:
	// ORDER BY and the keyset cursor compare by the column's, and would
	// tie two ids that an index of another collation lets exist side by
	// side, so that a page boundary between them skips one (sameOrder).
	var unique, sameOrder bool
	err := q.QueryRow(ctx, `
		WITH u AS (
			SELECT i.indcollation[0] AS coll FROM pg_catalog.pg_index i
			WHERE i.indrelid = $1 AND i.indisunique AND i.indisvalid AND i.indpred IS NULL
			  AND i.indnkeyatts = 1 AND i.indkey[0] = $2)
		SELECT EXISTS (SELECT 1 FROM u),
		       coalesce((SELECT co.collisdeterministic FROM pg_catalog.pg_collation co WHERE co.oid = a.attcollation), true)
		           OR EXISTS (SELECT 1 FROM u WHERE u.coll = a.attcollation)
		FROM pg_catalog.pg_attribute a WHERE a.attrelid = $1 AND a.attnum = $2`, t.oid, c.num).Scan(&unique, &sameOrder)
	if err != nil {
		return fmt.Errorf("look up unique indexes of %s: %w", t.ident, err)
	}
	if unique && !sameOrder {
		problems++
		rep.fail("id", "id column %s of %s has a nondeterministic collation, and no unique index on it uses that collation: two ids it calls equal (say 'a' and 'A') can both exist, and the walk, which orders by the column's collation, would skip one of them at a page boundary; give the column a deterministic collation (ALTER TABLE %s ALTER COLUMN %s TYPE text COLLATE \"C\"), or make its unique index use the column's collation", quote(name), t.ident, t.ident, quote(name))
	}
	if unique && t.relkind == 'r' {
		// Every query reads the table with its inheritance children (no
		// ONLY), and a unique index of the parent does not cover them:
		// one id can be in two of them, and (updated_at, id) is then no
		// total order. (A partitioned table's index covers its
		// partitions.)
		var children []string
		rows, err := q.Query(ctx, `SELECT i.inhrelid::regclass::text FROM pg_catalog.pg_inherits i WHERE i.inhparent = $1 ORDER BY 1 LIMIT 4`, t.oid)
		if err == nil {
			children, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
		if err != nil {
			return fmt.Errorf("look up inheritance children of %s: %w", t.ident, err)
		}
		if len(children) > 0 {
			problems++
			rep.fail("id", "%s has inheritance children (%s): its unique index on %s does not cover them, so one id can be in two of them and the walk's order is ambiguous; sync each child as a table of its own, or make the parent a partitioned table with a primary key on %s", t.ident, strings.Join(children, ", "), quote(name), quote(name))
		}
	}
	if !unique {
		problems++
		switch t.relkind {
		case 'm':
			// A materialized view takes a unique index, not a key.
			rep.fail("id", "id column %s of %s is not unique (no unique index on exactly that column); ties on updated_at would be ambiguous: CREATE UNIQUE INDEX CONCURRENTLY ON %s (%s)", quote(name), t.ident, t.ident, quote(name))
		case 'v', 'f':
			// A view or a foreign table has no index of its own.
			rep.fail("id", "id column %s of %s is not unique: a view or foreign table has no index that could prove it; sync the table it reads from, which needs a primary key or unique index on the id", quote(name), t.ident)
		case 'p':
			// PostgreSQL wants the partition key in every unique index
			// of a partitioned table.
			rep.fail("id", "id column %s of %s is not unique (no primary key or unique index on exactly that column); ties on updated_at would be ambiguous. On a partitioned table PostgreSQL accepts such an index only when the table is partitioned by %s alone: ALTER TABLE %s ADD PRIMARY KEY (%s) then works; a table partitioned by another column (say by time) cannot have one, so tidemark cannot sync it as a whole", quote(name), t.ident, quote(name), t.ident, quote(name))
		default:
			rep.fail("id", "id column %s of %s is not unique (no primary key or unique index on exactly that column); ties on updated_at would be ambiguous: ALTER TABLE %s ADD PRIMARY KEY (%s), or CREATE UNIQUE INDEX CONCURRENTLY ON %s (%s)", quote(name), t.ident, t.ident, quote(name), t.ident, quote(name))
		}
	}
	if problems == 0 {
		rep.ok("id", "id column %s is %s, NOT NULL, unique", quote(name), c.typeName)
	}
	return nil
}

func (t *table) checkUpdatedAt(name string, rep *Report) {
	c := t.col(name)
	if c == nil {
		rep.fail("updated_at", "updated_at column %s does not exist in %s (it has: %s): set updated_at_column to the timestamptz column changed on every write", quote(name), t.ident, t.colNames())
		return
	}
	t.updatedAt = c
	problems := 0
	switch c.base {
	case oidTimestamptz:
	case oidTimestamp:
		problems++
		rep.fail("updated_at", "updated_at column %s of %s is %s; it must be timestamptz so its order does not depend on session time zones: ALTER TABLE %s ALTER COLUMN %s TYPE timestamptz USING %s AT TIME ZONE 'UTC' (use the zone the values were written in)", quote(name), t.ident, c.typeName, t.ident, quote(name), quote(name))
	default:
		problems++
		rep.fail("updated_at", "updated_at column %s of %s is %s; it must be timestamptz NOT NULL, set on every write", quote(name), t.ident, c.typeName)
	}
	if !c.notNull && t.relkind != 'v' && t.relkind != 'f' { // a view's columns are never NOT NULL
		problems++
		rep.fail("updated_at", "updated_at column %s of %s is nullable; rows with NULL updated_at would be skipped forever: backfill them, then ALTER TABLE %s ALTER COLUMN %s SET NOT NULL", quote(name), t.ident, t.ident, quote(name))
	}
	if problems == 0 {
		rep.ok("updated_at", "updated_at column %s is timestamptz NOT NULL", quote(name))
	}
}

func (t *table) checkDeletedAt(name string, rep *Report) {
	c := t.col(name)
	if c == nil {
		rep.fail("deleted_at", "deleted_at column %s does not exist in %s (it has: %s): fix deleted_at_column or leave it empty", quote(name), t.ident, t.colNames())
		return
	}
	t.deletedAt = c
	switch c.base {
	case oidTimestamptz:
		rep.ok("deleted_at", "deleted_at column %s is timestamptz; non-NULL means soft-deleted", quote(name))
	case oidTimestamp:
		rep.warn("deleted_at", "deleted_at column %s of %s is %s; only NULL versus not NULL is used, but timestamptz is recommended", quote(name), t.ident, c.typeName)
	default:
		rep.fail("deleted_at", "deleted_at column %s of %s is %s; it must be timestamptz (NULL = live, set = soft-deleted)", quote(name), t.ident, c.typeName)
	}
}
