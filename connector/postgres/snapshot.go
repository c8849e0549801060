package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
)

// Snapshot is the source bound to one consistent view of the table: a
// REPEATABLE READ READ ONLY transaction on a dedicated connection, or on
// several sessions that share one exported snapshot (SnapshotSessions).
// Every page sees the table as it was when the view was taken. Calls may
// run concurrently, up to one per session; each takes a free session.
type Snapshot struct {
	src      *Source
	sessions []*session
	free     chan *session
	start    time.Time
	mark     string
}

// session is one connection in the view's transaction.
type session struct {
	conn *pgxpool.Conn
	tx   pgx.Tx
}

var _ connector.SnapshotSource = (*Snapshot)(nil)

// sessionWait is how long SnapshotSessions waits for each session after
// its first.
var sessionWait = 10 * time.Second

// Snapshot starts a consistent view for an initial load on one session
// (docs/design.md, "The walk" and "Watermark", consistent mode); see
// SnapshotSessions.
func (s *Source) Snapshot(ctx context.Context) (connector.SnapshotSource, error) {
	return s.SnapshotSessions(ctx, 1)
}

// SnapshotSessions starts a consistent view for an initial load on n
// sessions (docs/design.md, "The initial load in key order"): the first
// exports its snapshot (pg_export_snapshot) and the others import it (SET
// TRANSACTION SNAPSHOT), so all of them see the same rows. Start is the
// first transaction's start time (now()), which is no later than the
// moment the snapshot was taken. Close it when done; it holds n
// connections and, while open, holds back vacuum.
func (s *Source) SnapshotSessions(ctx context.Context, n int) (connector.SnapshotSource, error) {
	n = max(n, 1)
	// A view of the table as it is: with its current columns
	// (docs/schema-changes.md). The next pass still reports the change.
	ch, err := s.reshape(ctx)
	if err != nil {
		return nil, err
	}
	s.keepChange(ch)
	sn := &Snapshot{src: s, free: make(chan *session, n)}
	fail := func(err error) (connector.SnapshotSource, error) {
		_ = sn.Close(context.WithoutCancel(ctx))
		return nil, err
	}
	begin := func() (*session, error) {
		// The first session holds nothing yet. Each later one waits at
		// most sessionWait while the sessions already taken are held:
		// sources that share a pool (tables of one DSN with
		// pool_max_conns) would otherwise each hold some and wait for
		// the others' for ever. Giving them back (fail) and retrying
		// the pass breaks the wait.
		actx, cancel := ctx, context.CancelFunc(func() {})
		if len(sn.sessions) > 0 {
			actx, cancel = context.WithTimeout(ctx, sessionWait)
		}
		conn, err := s.pool.Acquire(actx)
		waited := errors.Is(actx.Err(), context.DeadlineExceeded) // before cancel, which sets Err too
		cancel()
		if err != nil && ctx.Err() == nil && waited {
			st := s.pool.Stat()
			return nil, fmt.Errorf("snapshot: session %d of %d: no connection free in the pool within %s (%d of %d in use, by this load and the other tables sharing the pool): gave back the %d taken and will try again; raise pool_max_conns to at least the sum of the tables' sync.load_workers + 2, or lower sync.load_workers",
				len(sn.sessions)+1, n, sessionWait, st.AcquiredConns(), st.MaxConns(), len(sn.sessions))
		}
		if err != nil {
			return nil, fmt.Errorf("snapshot: connect: %w", err)
		}
		tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
		if err != nil {
			conn.Release()
			return nil, fmt.Errorf("snapshot: begin: %w", err)
		}
		ss := &session{conn: conn, tx: tx}
		sn.sessions = append(sn.sessions, ss)
		return ss, nil
	}
	first, err := begin()
	if err != nil {
		return fail(err)
	}
	var start time.Time
	var xmin int64
	var exported string
	// The first statement takes the snapshot; now() is the transaction
	// start, slightly before it, which errs on the safe side for W. The
	// snapshot's oldest running transaction is the view's mark: every
	// version it shows that was written below it is settled.
	mark := s.shape().q.mark[len("SELECT "):]
	q := "SELECT now(), " + mark + ", ''"
	if n > 1 {
		q = "SELECT now(), " + mark + ", pg_catalog.pg_export_snapshot()"
	}
	var rel string
	// A view waits idle in its transaction while the topic is read (a
	// sweep's, verify's), and the sessions taken wait so while the next
	// one waits for a connection; a server's or role's
	// idle_in_transaction_session_timeout must end none of them, or every
	// retry fails the same way. Set in each session as soon as it holds
	// the snapshot: after the statement that takes or imports it, which
	// must come first.
	keep := func(i int, ss *session) error {
		if _, err := ss.tx.Exec(ctx, noIdleTimeout); err != nil {
			return fmt.Errorf("snapshot: session %d of %d: %w", i, n, err)
		}
		return nil
	}
	if err := first.tx.QueryRow(ctx, q).Scan(&start, &xmin, &rel, &exported); err != nil {
		return fail(fmt.Errorf("snapshot: read start time: %w", err))
	}
	if err := keep(1, first); err != nil {
		return fail(err)
	}
	for range n - 1 {
		ss, err := begin()
		if err != nil {
			return fail(err)
		}
		// The snapshot id is the server's own text (like 00000003-0000001B-1);
		// SET TRANSACTION SNAPSHOT takes only a literal.
		if _, err := ss.tx.Exec(ctx, "SET TRANSACTION SNAPSHOT "+quoteLiteral(exported)); err != nil {
			return fail(fmt.Errorf("snapshot: import the snapshot %s into session %d of %d: %w", exported, len(sn.sessions), n, err))
		}
		if err := keep(len(sn.sessions), ss); err != nil {
			return fail(err)
		}
	}
	for _, ss := range sn.sessions {
		sn.free <- ss
	}
	sn.start = start.UTC()
	if s.shape().q.marks {
		sn.mark = formatMark(xmin, rel)
	}
	return sn, nil
}

// Start is the server's transaction start time of the view.
func (sn *Snapshot) Start() time.Time { return sn.start }

// Mark is the view's mark (see Source.Mark); "" for a view or foreign table.
func (sn *Snapshot) Mark() string { return sn.mark }

// with runs fn on a free session of the view.
func (sn *Snapshot) with(ctx context.Context, fn func(pgx.Tx) error) error {
	if sn.free == nil {
		return fmt.Errorf("snapshot of %s is closed", sn.src.shape().tbl.ident)
	}
	var ss *session
	select {
	case ss = <-sn.free:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { sn.free <- ss }()
	return fn(ss.tx)
}

// Page reads a page inside the view; see Source.Page.
func (sn *Snapshot) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	var p connector.Page
	err := sn.with(ctx, func(tx pgx.Tx) (err error) {
		p, err = sn.src.page(ctx, tx, req)
		return err
	})
	return p, err
}

// Close ends the read-only transactions and returns their connections to
// the pool (or drops them, if a transaction could not be ended cleanly).
// Call it once no call is running.
func (sn *Snapshot) Close(ctx context.Context) error {
	var first error
	for _, ss := range sn.sessions {
		if err := ss.tx.Rollback(ctx); err != nil && first == nil {
			first = fmt.Errorf("close snapshot: %w", err)
		}
		ss.conn.Release()
	}
	sn.sessions, sn.free = nil, nil
	return first
}
