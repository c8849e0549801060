package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Column describes one column of the source table, for creating or
// checking the target table.
type Column struct {
	// Name is the column name (the member name in the record value).
	Name string
	// Type is the SQL type as PostgreSQL's format_type prints it:
	// "bigint", "numeric(12,2)", "timestamp with time zone", "text[]". It
	// must name a type on the target server (checked with to_regtype
	// before it is used).
	Type string
	// NotNull copies a NOT NULL constraint to a created table.
	NotNull bool
}

// ErrSchema marks a target table that does not fit the records or the
// source: a missing column, an incompatible type, no unique index on the
// id column. An operator must change the table (or the configuration).
var ErrSchema = errors.New("target table does not fit")

// ErrConstraint marks a batch that violates a constraint of the target
// table (a CHECK, a foreign key, a unique index other than the id's): the
// same batch fails the same way on every run until the constraint or the
// table is changed. Nothing of it was applied.
var ErrConstraint = errors.New("the batch violates a constraint of the target table")

// querier is what catalog reads need from a pool, a connection or a
// transaction.
type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// targetColumn is one column of the target table.
type targetColumn struct {
	name    string
	typ     string // format_type, spliced into casts (catalog output, not configuration)
	notNull bool
	kind    kind
	elem    kind
}

// columnsQuery lists a table's live columns, domains resolved one level,
// with what the value conversion needs. $1 schema, $2 table.
const columnsQuery = `
WITH c AS (
	SELECT a.attnum, a.attname::text AS name, a.attnotnull,
	       CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE a.atttypid END AS base,
	       CASE WHEN t.typtype = 'd' THEN t.typtypmod ELSE a.atttypmod END AS mod
	FROM pg_catalog.pg_attribute a
	JOIN pg_catalog.pg_class r ON r.oid = a.attrelid
	JOIN pg_catalog.pg_namespace n ON n.oid = r.relnamespace
	JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
	WHERE n.nspname = $1 AND r.relname = $2 AND a.attnum > 0 AND NOT a.attisdropped
)
SELECT c.name, c.attnotnull, format_type(c.base, c.mod), c.base::int8,
       bt.typcategory = 'A' AND bt.typelem <> 0, coalesce(et.oid, 0)::int8,
       c.base < 16384 AND coalesce(et.oid, 0) < 16384
FROM c
JOIN pg_catalog.pg_type bt ON bt.oid = c.base
LEFT JOIN pg_catalog.pg_type et ON et.oid = bt.typelem AND bt.typcategory = 'A'
ORDER BY c.attnum`

type catalogColumn struct {
	name    string
	notNull bool
	typ     string
	base    int64
	isArray bool
	elem    int64
	builtin bool
}

func readColumns(ctx context.Context, q querier, schema, table string) ([]catalogColumn, error) {
	rows, err := q.Query(ctx, columnsQuery, schema, table)
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", quote(schema, table), err)
	}
	cols, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (catalogColumn, error) {
		var c catalogColumn
		err := r.Scan(&c.name, &c.notNull, &c.typ, &c.base, &c.isArray, &c.elem, &c.builtin)
		return c, err
	})
	if err != nil {
		return nil, fmt.Errorf("read columns of %s: %w", quote(schema, table), err)
	}
	return cols, nil
}

func kindOfOID(oid int64) kind {
	switch oid {
	case 17:
		return kindBytea
	case 114, 3802:
		return kindJSON
	case 1082, 1114, 1184: // date, timestamp, timestamptz
		return kindTime
	}
	return kindScalar
}

func toTarget(c catalogColumn) targetColumn {
	t := targetColumn{name: c.name, typ: c.typ, notNull: c.notNull, kind: kindOfOID(c.base)}
	if c.isArray {
		t.kind, t.elem = kindArray, kindOfOID(c.elem)
	}
	return t
}

// DescribeSource reads the columns of a source table (all of them, or
// those named in columns, in that order) for creating or checking the
// target. Domains become their base type; types the target server may lack
// (enums, composites, ranges and other user-defined types) become text
// (text[] for their arrays): their values are PostgreSQL's text output.
func DescribeSource(ctx context.Context, q querier, schema, table string, columns []string) ([]Column, error) {
	if schema == "" {
		schema = "public"
	}
	cols, err := readColumns(ctx, q, schema, table)
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("source table %s not found (or it has no columns)", quote(schema, table))
	}
	byName := map[string]catalogColumn{}
	for _, c := range cols {
		byName[c.name] = c
	}
	if len(columns) > 0 {
		cols = cols[:0]
		for _, n := range columns {
			c, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("source table %s has no column %q", quote(schema, table), n)
			}
			cols = append(cols, c)
		}
	}
	out := make([]Column, len(cols))
	for i, c := range cols {
		typ := c.typ
		if !c.builtin {
			typ = "text"
			if c.isArray {
				typ = "text[]"
			}
		}
		out[i] = Column{Name: c.name, Type: typ, NotNull: c.notNull}
	}
	return out, nil
}

// baseName strips a type modifier: "numeric(12,2)" -> "numeric",
// "timestamp(3) with time zone" -> "timestamp with time zone".
func baseName(t string) string {
	for {
		i := strings.IndexByte(t, '(')
		if i < 0 {
			return t
		}
		j := strings.IndexByte(t[i:], ')')
		if j < 0 {
			return t
		}
		t = t[:i] + t[i+j+1:]
	}
}

// widenings are the source -> target type pairs that hold every value.
var widenings = map[[2]string]bool{
	{"smallint", "integer"}: true, {"smallint", "bigint"}: true, {"smallint", "numeric"}: true,
	{"integer", "bigint"}: true, {"integer", "numeric"}: true, {"bigint", "numeric"}: true,
	{"real", "double precision"}: true,
	{"json", "jsonb"}:            true, {"jsonb", "json"}: true,
	{"character varying", "text"}: true, {"text", "character varying"}: true, {"character", "text"}: true,
	{"timestamp without time zone", "timestamp with time zone"}: true,
	{"timestamp with time zone", "timestamp without time zone"}: true,
}

// compatible reports whether a source column of type src can be stored in a
// target column of type dst. text (and text[]) takes anything, since every
// value is text input; otherwise the base types must match or widen.
func compatible(src, dst string) bool {
	s, d := baseName(src), baseName(dst)
	sa, da := strings.HasSuffix(s, "[]"), strings.HasSuffix(d, "[]")
	if sa != da {
		return d == "text" || d == "jsonb" || d == "json"
	}
	s, d = strings.TrimSuffix(s, "[]"), strings.TrimSuffix(d, "[]")
	if d == "text" {
		return true
	}
	return (s == d || widenings[[2]string{s, d}]) && holds(s, modifier(src), d, modifier(dst))
}

// castType is the type a staged text value is cast to for a column of
// type typ: typ without its modifier, so that storing it in the column
// applies the modifier as an assignment, which refuses a string or bit
// string too long (SQLSTATE 22001, 22026) where an explicit cast to
// varchar(n), char(n) or bit(n) cuts it. character and bit without a length
// mean length 1, so they are cast to bpchar (of any length, and compared
// as character, so that an index on a char(n) id still serves the DELETE
// of tombstoned ids) and bit varying. Numbers and times are rounded to the
// column's scale or precision either way.
func castType(typ string) string {
	b := baseName(typ)
	arr := ""
	for strings.HasSuffix(b, "[]") {
		arr += "[]"
		b = strings.TrimSuffix(b, "[]")
	}
	switch b {
	case "character":
		b = "bpchar"
	case "bit":
		b = "bit varying"
	}
	return b + arr
}

// modifier returns the numbers of a type's first modifier:
// "numeric(12,2)" -> [12 2], "character varying(10)[]" -> [10]; nil for
// none.
func modifier(t string) []int {
	i := strings.IndexByte(t, '(')
	if i < 0 {
		return nil
	}
	j := strings.IndexByte(t[i:], ')')
	if j < 0 {
		return nil
	}
	var out []int
	for f := range strings.SplitSeq(t[i+1:i+j], ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil {
			return nil
		}
		out = append(out, n)
	}
	return out
}

// holds reports whether a target modifier dm of base type d takes every
// value of a source of base type s with modifier sm. PostgreSQL's casts to
// a narrower modifier do not fail: they cut strings and bit strings and
// round numbers and times, so a narrower target would change values
// silently.
func holds(s string, sm []int, d string, dm []int) bool {
	if dm == nil {
		return true
	}
	switch d {
	case "character varying", "character", "bit varying":
		// Only a source of bounded length fits a bounded target.
		return sm != nil && sm[0] <= dm[0]
	case "bit":
		return s == "bit" && sm != nil && sm[0] == dm[0]
	case "numeric":
		p, sc := dm[0], 0
		if len(dm) > 1 {
			sc = dm[1]
		}
		switch s {
		case "smallint":
			return p-sc >= 5
		case "integer":
			return p-sc >= 10
		case "bigint":
			return p-sc >= 19
		case "numeric":
			if sm == nil {
				return false
			}
			sp, ss := sm[0], 0
			if len(sm) > 1 {
				ss = sm[1]
			}
			return ss <= sc && sp-ss <= p-sc
		}
		return false
	case "timestamp without time zone", "timestamp with time zone", "time without time zone", "time with time zone", "interval":
		sp := 6 // microseconds, the default and the most
		if sm != nil {
			sp = sm[0]
		}
		return sp <= dm[0]
	}
	return true
}

func quote(parts ...string) string { return pgx.Identifier(parts).Sanitize() }
