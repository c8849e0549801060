package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/replica"
)

// ValueError is a record value the target cannot take: not a JSON object,
// a member the table lacks, or a value its column's type rejects. Nothing
// of the batch holding it was applied.
type ValueError struct {
	// ID is the record key.
	ID string
	// Column is the offending column ("" when the whole value is bad).
	Column string
	// Type is the column's type in the target, when known.
	Type string
	// Partition and Offset locate the record in the topic.
	Partition int32
	Offset    int64
	// Err is the reason (PostgreSQL's message for a rejected value).
	Err error
}

func (e *ValueError) Error() string {
	where := fmt.Sprintf("record id %q (partition %d, offset %d)", e.ID, e.Partition, e.Offset)
	switch {
	case e.Column != "" && e.Type != "":
		return fmt.Sprintf("%s: column %q (%s): %v", where, e.Column, e.Type, e.Err)
	case e.Column != "":
		return fmt.Sprintf("%s: column %q: %v", where, e.Column, e.Err)
	}
	return fmt.Sprintf("%s: %v", where, e.Err)
}

func (e *ValueError) Unwrap() error { return e.Err }

// diagnose finds the record and column behind a data error of the merge
// (the transaction is already rolled back). Casts are retried outside any
// transaction, column by column, then bisected over the rows of the failing
// column; nothing is written. It returns nil when it cannot pin the error
// down.
func (t *Target) diagnose(ctx context.Context, st tableState, rows []stageRow, pgErr *pgconn.PgError) *ValueError {
	ve := func(r stageRow, col, typ string, err error) *ValueError {
		return &ValueError{ID: r.change.Key, Column: col, Type: typ, Partition: r.change.Partition, Offset: r.change.Offset, Err: err}
	}
	if pgErr.Code == "23502" { // not_null_violation: ColumnName says which
		for i, c := range st.cols {
			if c.name != pgErr.ColumnName {
				continue
			}
			for _, r := range rows {
				if !r.change.Delete() && (r.vals == nil || r.vals[i] == nil) {
					return ve(r, c.name, c.typ, errors.New("null in a NOT NULL column"))
				}
			}
		}
		return nil
	}
	// The id column first (keys cast to its type), then every value column.
	type candidate struct {
		name, typ string
		val       func(stageRow) *string
	}
	cands := []candidate{{t.cfg.IDColumn, st.id.typ, func(r stageRow) *string { k := r.change.Key; return &k }}}
	for i, c := range st.cols {
		cands = append(cands, candidate{c.name, c.typ, func(r stageRow) *string {
			if r.vals == nil {
				return nil
			}
			return r.vals[i]
		}})
	}
	for _, c := range cands {
		var idx []int
		var vals []*string
		for i, r := range rows {
			if v := c.val(r); v != nil && (!r.change.Delete() || c.name == t.cfg.IDColumn) {
				idx = append(idx, i)
				vals = append(vals, v)
			}
		}
		// Stored as the merge stores them: cast to the column's base type
		// and assigned to a column of its type (castType), in a
		// transaction that is rolled back.
		check := func(vs []*string) error {
			tx, err := t.pool.Begin(ctx)
			if err != nil {
				return err
			}
			defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
			if _, err := tx.Exec(ctx, "CREATE TEMP TABLE tidemark_check (x "+c.typ+") ON COMMIT DROP"); err != nil {
				return err
			}
			_, err = tx.Exec(ctx, "INSERT INTO tidemark_check SELECT v::"+castType(c.typ)+" FROM unnest($1::text[]) AS u(v)", vs)
			return err
		}
		if err := check(vals); err == nil {
			continue
		} else if ctx.Err() != nil {
			return nil
		}
		// Smallest failing prefix: its last element is the culprit.
		lo, hi := 1, len(vals)
		for lo < hi {
			mid := (lo + hi) / 2
			if check(vals[:mid]) != nil {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		err := check(vals[lo-1 : lo])
		var pe *pgconn.PgError
		if errors.As(err, &pe) {
			err = errors.New(pe.Message)
		} else if err == nil {
			err = errors.New(pgErr.Message)
		}
		return ve(rows[idx[lo-1]], c.name, c.typ, err)
	}
	return nil
}

// infer derives the columns of a missing target table from the values of a
// batch: member order from the first value, types from every value
// (inferType); the id column's type also has to take every key.
func (t *Target) infer(batch []replica.Change) ([]Column, error) {
	var order []string
	seen := map[string]map[jsonClass]bool{}
	for _, c := range batch {
		if c.Delete() {
			continue
		}
		members, err := decodeObject(c.Value)
		if err != nil {
			return nil, &ValueError{ID: c.Key, Partition: c.Partition, Offset: c.Offset, Err: err}
		}
		for _, m := range members {
			if seen[m.name] == nil {
				seen[m.name] = map[jsonClass]bool{}
				order = append(order, m.name)
			}
			seen[m.name][classify(m.raw)] = true
		}
	}
	// The key is the id: its type is the narrowest that takes every key.
	idSeen := map[jsonClass]bool{}
	for _, c := range batch {
		idSeen[keyClass(c.Key)] = true
	}
	cols := make([]Column, 0, len(order)+1)
	idType := inferType(idSeen)
	if idType != "bigint" && idType != "uuid" {
		idType = "text"
	}
	cols = append(cols, Column{Name: t.cfg.IDColumn, Type: idType})
	for _, n := range order {
		if n != t.cfg.IDColumn {
			cols = append(cols, Column{Name: n, Type: inferType(seen[n])})
		}
	}
	return cols, nil
}

func keyClass(k string) jsonClass {
	if n, err := strconv.ParseInt(k, 10, 64); err == nil && strconv.FormatInt(n, 10) == k {
		return classInt
	}
	if isUUID(k) {
		return classUUID
	}
	return classString
}
