package postgres

import "time"

// CursorAfter returns a cursor that makes Page seek strictly after the key
// (updatedAt, id) in the (updated_at, id) order, as if it were the Next of a
// page whose last row had that key. updatedAt is truncated to microseconds.
//
// It exists for servers that re-issue the walk under a cursor format of
// their own (package feed): they keep the sort key and hand it back here,
// so the keyset seek and the value encoding stay in this package. The id
// is validated against the id column's type when the cursor is used.
func (s *Source) CursorAfter(updatedAt time.Time, id string) string {
	return key{micros: updatedAt.UnixMicro(), id: id}.cursor()
}
