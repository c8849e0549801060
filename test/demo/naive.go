package main

// THE NAIVE BASELINES. Everything in this file is deliberately WRONG: it is
// the anti-pattern tidemark exists to replace, kept here only so that the
// demo can show what it loses on the same table under the same workload.
// Never copy these loops into real code (tidemark itself never uses OFFSET
// and never seeks on updated_at alone).

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// naiveReader folds what a naive sync loop reads into memory, the way a
// consumer of its output would: last read per id wins, a soft-deleted row
// deletes its id.
type naiveReader struct {
	name   string
	state  map[int64]string    // id -> value (to_jsonb of the row)
	seen   map[string]struct{} // id + value: versions read so far
	reads  atomic.Int64        // read by the progress printer while the loop runs
	dups   int64               // reads of a version already read before
	pages  int64
	passes atomic.Int64
	err    error
}

func newNaive(name string) *naiveReader {
	return &naiveReader{name: name, state: map[int64]string{}, seen: map[string]struct{}{}}
}

// naiveQuery wraps a page query so that each row is read as to_jsonb text
// (the fold is compared byte for byte with the final table read the same
// way), computed for the page's rows only, not for the rows OFFSET skips.
func naiveQuery(where string) string {
	return `SELECT id, updated_at, deleted_at IS NOT NULL, to_jsonb(t)::text FROM (SELECT * FROM ` + qTable + ` ` + where + `) t`
}

// page runs one query and folds its rows; it returns the number of rows and
// the updated_at of the last one.
func (n *naiveReader) page(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (int, time.Time, error) {
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return 0, time.Time{}, err
	}
	defer rows.Close()
	var (
		count int
		last  time.Time
	)
	for rows.Next() {
		var (
			id      int64
			ts      time.Time
			deleted bool
			val     string
		)
		if err := rows.Scan(&id, &ts, &deleted, &val); err != nil {
			return 0, time.Time{}, err
		}
		count++
		last = ts
		n.reads.Add(1)
		vk := strconv.FormatInt(id, 10) + "\x00" + val // val includes updated_at and deleted_at
		if _, ok := n.seen[vk]; ok {
			n.dups++
		} else {
			n.seen[vk] = struct{}{}
		}
		if deleted {
			delete(n.state, id)
		} else {
			n.state[id] = val
		}
	}
	n.pages++
	return count, last, rows.Err()
}

// offsetLoop is NAIVE BASELINE 1 (anti-pattern): each pass pages through
// "WHERE updated_at > W ORDER BY updated_at LIMIT n OFFSET k" until a short
// page, then sets W to the largest updated_at it read. Rows that move while
// it pages (an update sends a row to the end) shift every later row by one
// place, so some are never read; rows that commit late with an updated_at
// below W are never read either.
func offsetLoop(ctx context.Context, url string, pageSize int, poll time.Duration, stop <-chan struct{}, n *naiveReader) {
	n.err = loop(ctx, url, poll, stop, func(conn *pgx.Conn, w *time.Time) error {
		passMax := *w
		for off := 0; ; off += pageSize {
			got, last, err := n.page(ctx, conn, naiveQuery(`WHERE updated_at > $1 ORDER BY updated_at LIMIT $2 OFFSET $3`), *w, pageSize, off)
			if err != nil {
				return err
			}
			if got > 0 && last.After(passMax) {
				passMax = last
			}
			if got < pageSize {
				break // "a short page means the end" - also naive
			}
		}
		*w = passMax
		return nil
	}, n)
}

// timestampLoop is NAIVE BASELINE 2 (anti-pattern): a cursor on updated_at
// alone, "WHERE updated_at > $last ORDER BY updated_at LIMIT n". When a page
// ends inside a group of rows sharing one updated_at, the rest of the group
// is skipped for good; late commits below $last are skipped too.
func timestampLoop(ctx context.Context, url string, pageSize int, poll time.Duration, stop <-chan struct{}, n *naiveReader) {
	n.err = loop(ctx, url, poll, stop, func(conn *pgx.Conn, last *time.Time) error {
		for {
			got, ts, err := n.page(ctx, conn, naiveQuery(`WHERE updated_at > $1 ORDER BY updated_at LIMIT $2`), *last, pageSize)
			if err != nil {
				return err
			}
			if got > 0 {
				*last = ts
			}
			if got < pageSize {
				return nil
			}
		}
	}, n)
}

// loop runs passes every poll until stop is closed, then one final pass.
func loop(ctx context.Context, url string, poll time.Duration, stop <-chan struct{}, pass func(*pgx.Conn, *time.Time) error, n *naiveReader) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	pos := time.Unix(0, 0)
	for {
		final := false
		select {
		case <-stop:
			final = true
		default:
		}
		if err := pass(conn, &pos); err != nil {
			return err
		}
		n.passes.Add(1)
		if final {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-stop:
		case <-time.After(poll):
		}
	}
}
