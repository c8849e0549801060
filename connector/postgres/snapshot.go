package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
)

// Snapshot is the source bound to one REPEATABLE READ READ ONLY
// transaction on a dedicated connection: every page sees the table as it
// was when the view was taken. It is not safe for concurrent use.
type Snapshot struct {
	src   *Source
	conn  *pgxpool.Conn
	tx    pgx.Tx
	start time.Time
}

var _ connector.SnapshotSource = (*Snapshot)(nil)

// Snapshot starts a consistent view for an initial load (CONTRACT §3,
// consistent mode). Start is the transaction's start time (now()), which
// is no later than the moment the snapshot was taken. Close it when done;
// it holds a connection and, while open, holds back vacuum.
func (s *Source) Snapshot(ctx context.Context) (connector.SnapshotSource, error) {
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("snapshot: connect: %w", err)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		conn.Release()
		return nil, fmt.Errorf("snapshot: begin: %w", err)
	}
	var start time.Time
	// The first statement takes the snapshot; now() is the transaction
	// start, slightly before it, which errs on the safe side for W.
	if err := tx.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		conn.Release()
		return nil, fmt.Errorf("snapshot: read start time: %w", err)
	}
	return &Snapshot{src: s, conn: conn, tx: tx, start: start.UTC()}, nil
}

// Start is the server's transaction start time of the view.
func (sn *Snapshot) Start() time.Time { return sn.start }

// Page reads a page inside the view; see Source.Page.
func (sn *Snapshot) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	if sn.tx == nil {
		return connector.Page{}, fmt.Errorf("snapshot of %s is closed", sn.src.tbl.ident)
	}
	return sn.src.page(ctx, sn.tx, req)
}

// Close ends the read-only transaction and returns the connection to the
// pool (or drops it, if the transaction could not be ended cleanly).
func (sn *Snapshot) Close(ctx context.Context) error {
	if sn.tx == nil {
		return nil
	}
	err := sn.tx.Rollback(ctx)
	sn.tx = nil
	sn.conn.Release()
	if err != nil {
		return fmt.Errorf("close snapshot: %w", err)
	}
	return nil
}
