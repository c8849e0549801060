package postgres

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
)

var _ connector.Viewer = (*Source)(nil)

// maxViewAge is how long a pass reads in one snapshot before its next page
// takes a newer one (docs/design.md, "A pass reads one snapshot"). A view
// holds its locks (ACCESS SHARE on the table: DDL on it waits) and its
// snapshot (vacuum waits) until then.
var maxViewAge = time.Second

// noIdleTimeout keeps a server's or role's
// idle_in_transaction_session_timeout from ending a transaction that waits
// idle between two reads by design: a pass's view, a load's snapshot.
const noIdleTimeout = "SET LOCAL idle_in_transaction_session_timeout = 0"

// beginView are the statements that begin a view's transaction.
var beginView = []string{"BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", noIdleTimeout}

// passView is the consistent view a pass reads its pages in: a REPEATABLE
// READ READ ONLY transaction on one connection of the pool, whose snapshot
// is the one the pass's mark is read from. Its pages are read one at a
// time. It is a querier: its queries run in the transaction.
type passView struct {
	src   *Source
	conn  *pgxpool.Conn
	began time.Time
	mark  string
}

// OpenView opens a pass's view: in one round trip once its statements are
// prepared on the connection, it begins the transaction and takes the
// snapshot with the mark (see Mark). The view holds a connection until
// Close.
func (s *Source) OpenView(ctx context.Context) (connector.PassView, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("open the pass's view: connect: %w", err)
	}
	v := &passView{src: s, conn: conn, began: time.Now()}
	sh := s.shape()
	var xmin int64
	var rel string
	b := &pgx.Batch{}
	for _, q := range beginView {
		b.Queue(q)
	}
	// The first statement that reads takes the transaction's snapshot, so
	// the mark read with it is the view's: every version written below it
	// is visible in the view.
	b.Queue(sh.q.mark).QueryRow(func(row pgx.Row) error {
		return row.Scan(&xmin, &rel)
	})
	if err := conn.SendBatch(ctx, b).Close(); err != nil {
		_ = v.Close(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("open the pass's view: %w", err)
	}
	if sh.q.marks {
		v.mark = formatMark(xmin, rel)
	}
	return v, nil
}

// Mark is the view's mark (see Source.Mark); "" for a view or foreign
// table.
func (v *passView) Mark() string { return v.mark }

// Query and QueryRow run in the view's transaction.
func (v *passView) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return v.conn.Query(ctx, sql, args...)
}

func (v *passView) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return v.conn.QueryRow(ctx, sql, args...)
}

// renew ends the view's transaction and begins another: its pages read a
// newer snapshot from then on, which a pass may always do (pages read
// before it came from older ones). It also ends a transaction an error
// has aborted. The pass's mark stays what it was.
func (v *passView) renew(ctx context.Context) error {
	// One simple query: in an aborted transaction the server parses
	// nothing but its end, so no statement may be prepared first.
	sql := "ROLLBACK; " + strings.Join(beginView, "; ")
	if _, err := v.conn.Conn().PgConn().Exec(ctx, sql).ReadAll(); err != nil {
		return fmt.Errorf("renew the pass's view: %w", err)
	}
	v.began = time.Now()
	return nil
}

// Close ends the view's transaction and gives its connection back to the
// pool, which drops it if the transaction could not be ended.
func (v *passView) Close(ctx context.Context) error {
	if v.conn == nil {
		return nil
	}
	_, err := v.conn.Exec(ctx, "ROLLBACK")
	v.conn.Release()
	v.conn = nil
	if err != nil {
		return fmt.Errorf("close the pass's view: %w", err)
	}
	return nil
}

// querierFor returns what req's page is read on: its view, renewed when
// older than maxViewAge, or the pool.
func (s *Source) querierFor(ctx context.Context, req connector.PageRequest) (querier, error) {
	if req.View == nil {
		return s.pool, nil
	}
	v, ok := req.View.(*passView)
	if !ok || v.src != s {
		return nil, fmt.Errorf("a page request's view (%T) is not one this source opened: %w", req.View, connector.ErrPermanent)
	}
	if v.conn == nil {
		return nil, fmt.Errorf("the pass's view of %s is closed", s.shape().tbl.ident)
	}
	if time.Since(v.began) > maxViewAge {
		if err := v.renew(ctx); err != nil {
			return nil, err
		}
	}
	return v, nil
}
