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
	mark  string
}

var _ connector.SnapshotSource = (*Snapshot)(nil)

// Snapshot starts a consistent view for an initial load (docs/design.md, "The walk" and "Watermark",
// consistent mode). Start is the transaction's start time (now()), which
// is no later than the moment the snapshot was taken. Close it when done;
// it holds a connection and, while open, holds back vacuum.
func (s *Source) Snapshot(ctx context.Context) (connector.SnapshotSource, error) {
	// A view of the table as it is: with its current columns
	// (docs/schema-changes.md).
	if _, err := s.Reshape(ctx); err != nil {
		return nil, err
	}
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
	var xmin int64
	// The first statement takes the snapshot; now() is the transaction
	// start, slightly before it, which errs on the safe side for W. The
	// snapshot's oldest running transaction is the view's mark: every
	// version it shows that was written below it is settled.
	if err := tx.QueryRow(ctx, "SELECT now(), "+markSQL[len("SELECT "):]).Scan(&start, &xmin); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		conn.Release()
		return nil, fmt.Errorf("snapshot: read start time: %w", err)
	}
	sn := &Snapshot{src: s, conn: conn, tx: tx, start: start.UTC()}
	if s.shape().q.marks {
		sn.mark = formatMark(xmin)
	}
	return sn, nil
}

// Start is the server's transaction start time of the view.
func (sn *Snapshot) Start() time.Time { return sn.start }

// Mark is the view's mark (see Source.Mark); "" for a view or foreign table.
func (sn *Snapshot) Mark() string { return sn.mark }

// Page reads a page inside the view; see Source.Page.
func (sn *Snapshot) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	if sn.tx == nil {
		return connector.Page{}, fmt.Errorf("snapshot of %s is closed", sn.src.shape().tbl.ident)
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
