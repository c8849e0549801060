package postgres

import (
	"context"
	"time"

	"github.com/tidemark/tidemark/connector"
)

var _ connector.LiveScanner = (*Source)(nil)

// scanPage is the page size of a live scan.
const scanPage = 5000

// ScanLive calls fn for every live row (not soft-deleted, inside the filter)
// of one REPEATABLE READ snapshot, in (updated_at, id) order, with the same
// encoding as Page. It returns the snapshot's start time: the view boundary
// of a sweep or a verify.
func (s *Source) ScanLive(ctx context.Context, fn func(*connector.Row) error) (time.Time, error) {
	snap, err := s.Snapshot(ctx)
	if err != nil {
		return time.Time{}, err
	}
	defer snap.Close(context.WithoutCancel(ctx))
	view := snap.Start()
	req := connector.PageRequest{Limit: scanPage}
	for {
		p, err := snap.Page(ctx, req)
		if err != nil {
			return view, err
		}
		for i := range p.Rows {
			if p.Rows[i].Deleted {
				continue
			}
			if err := fn(&p.Rows[i]); err != nil {
				return view, err
			}
		}
		if p.End {
			return view, nil
		}
		req.Cursor = p.Next
	}
}
