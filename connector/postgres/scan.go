package postgres

import (
	"context"
	"fmt"
	"time"

	"github.com/tidemark/tidemark/connector"
)

var (
	_ connector.LiveScanner = (*Source)(nil)
	_ connector.LiveViewer  = (*Source)(nil)
	_ connector.LiveView    = (*Snapshot)(nil)
)

// scanPage is the page size of a live scan.
const scanPage = 5000

// ScanLive calls fn for every live row (not soft-deleted, inside the filter)
// of one REPEATABLE READ snapshot, in (updated_at, id) order, with the same
// encoding as Page. It returns the snapshot's start time: the view boundary
// of a sweep or a verify.
func (s *Source) ScanLive(ctx context.Context, fn func(*connector.Row) error) (time.Time, error) {
	snap, err := s.snapshot(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer snap.Close(context.WithoutCancel(ctx))
	return snap.Start(), snap.ScanLive(ctx, fn)
}

// LiveView opens one REPEATABLE READ READ ONLY snapshot that can be scanned
// several times (a bucketed sweep or verify): every ScanLive of the view
// sees the same rows. Close it when done; while open it holds a connection
// and holds back vacuum.
func (s *Source) LiveView(ctx context.Context) (connector.LiveView, error) {
	return s.snapshot(ctx)
}

func (s *Source) snapshot(ctx context.Context) (*Snapshot, error) {
	snap, err := s.Snapshot(ctx)
	if err != nil {
		return nil, err
	}
	sn, ok := snap.(*Snapshot)
	if !ok {
		return nil, fmt.Errorf("snapshot of %s: unexpected type %T", s.shape().tbl.ident, snap)
	}
	return sn, nil
}

// ScanLive calls fn for every live row of the view, in (updated_at, id)
// order, paging by the view's own seek.
func (sn *Snapshot) ScanLive(ctx context.Context, fn func(*connector.Row) error) error {
	req := connector.PageRequest{Limit: scanPage}
	for {
		p, err := sn.Page(ctx, req)
		if err != nil {
			return err
		}
		for i := range p.Rows {
			if p.Rows[i].Deleted {
				continue
			}
			if err := fn(&p.Rows[i]); err != nil {
				return err
			}
		}
		if p.End {
			return nil
		}
		req.Cursor = p.Next
	}
}
