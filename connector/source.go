package connector

import (
	"context"
	"time"
)

// Row is one row's current state as read from a source.
type Row struct {
	// ID is the row's id as UTF-8 text; it becomes the record key.
	ID string
	// UpdatedAt is the row's updated_at, microsecond precision, UTC.
	UpdatedAt time.Time
	// Deleted marks a soft-deleted row: it is published as a tombstone.
	Deleted bool
	// Value is the row encoded as a JSON object (nil when Deleted). The
	// source owns the encoding (docs/design.md, "Records"); the engine only
	// digests it.
	// Ownership passes to the caller: the engine hands Value to the producer,
	// which holds it until the transaction commits, so a source must never
	// reuse that memory for a later page.
	Value []byte
	// Settled is set when no later pass will return this version of the
	// row again (see PageRequest.Mark), so the dedupe set need not
	// remember it.
	Settled bool
}

// PageRequest asks a source for the next page of a pass.
type PageRequest struct {
	// Since is the pass's inclusive lower bound on updated_at (W - margin).
	// The zero time means no lower bound (minus infinity).
	Since time.Time
	// Cursor is the opaque cursor returned as Page.Next by the previous page
	// of this pass, or "" for the first page. The engine never parses,
	// builds or compares it.
	Cursor string
	// Limit is the maximum number of rows to return.
	Limit int
	// Skip is a token from Marker.Mark of an earlier pass ("" = none): the
	// source may leave out row versions it can prove that pass returned
	// (or would have, had it reached them), because they are unchanged.
	Skip string
	// Mark is the token of the current pass ("" = none): a row version that
	// a later pass with Skip = Mark is sure to leave out is flagged
	// Row.Settled.
	Mark string
	// Settle, when set, is the token of an earlier pass (at or below Mark)
	// to flag Row.Settled by instead of Mark: a head pass's rows are
	// settled only for what the next full pass, which skips by the last
	// full pass's mark, is sure to leave out (docs/design.md, "Head
	// passes").
	Settle string
	// From and Before, when set, bound a page to one window of updated_at,
	// [From, Before), for sources that implement Windower; the engine sets
	// them only for those. From applies to a window's first page (Cursor
	// ""), in place of Since when later than it; Before (exclusive) to
	// every page of the window. With Before set, End and Last speak of
	// the window: nothing in it follows. Windows cut a full pass into
	// short pages, between which head passes run (docs/design.md, "Head
	// passes during a full pass").
	From, Before time.Time
	// View, when set, is a view from the source's Viewer.OpenView: the
	// page is read inside it, seeing the upstream as it was when the view
	// was opened (docs/design.md, "A pass reads one snapshot").
	View PassView
	// Steps are the head passes since the last full pass, for a full pass
	// (docs/design.md, "Head passes"), in the order they ran: the source
	// may also leave out a row version dated at or after a step's Since
	// that it can prove the step's pass returned (or would have).
	Steps []Step
}

// Step is a finished head pass: its token (see Marker) and the lower bound
// it read from.
type Step struct {
	Mark  string
	Since time.Time
}

// Page is one page of a pass.
type Page struct {
	// Rows in the source's total order (updated_at, id).
	Rows []Row
	// Next is the cursor of the page after this one. It is only meaningful
	// when End is false.
	Next string
	// End is true when the source says this pass is complete: for a table,
	// a page that returned no rows after the cursor; for an API, an
	// explicit end-of-list signal. An End page has no rows.
	End bool
	// Last is true when the source is sure that nothing followed the
	// page's last row when the page was read: a table's page with fewer
	// rows than the limit. It proves what an empty page after Next read at
	// the same moment would, so the pass ends after these rows
	// (docs/design.md, "The walk"). Sources that cannot be sure (an API may
	// return short pages mid-list) leave it false.
	Last bool
}

// Source is an upstream delta feed. Implementations live in sub-packages.
type Source interface {
	// Page returns the next page of a pass. Rows must be strictly after the
	// request's cursor in the source's total order, and not before Since.
	Page(ctx context.Context, req PageRequest) (Page, error)
}

// Windower is implemented by sources whose Page honours
// PageRequest.From and Before. Discovered by type assertion.
type Windower interface {
	// Windows reports whether pages may be bounded to windows now.
	Windows() bool
}

// Horizon is a sample of the upstream's clock and its oldest open writer.
type Horizon struct {
	// Now is the upstream's clock when the sample was taken.
	Now time.Time
	// OldestWriter is the start time of the oldest client transaction that
	// is still open (whether or not it has written yet); zero when there is
	// none.
	OldestWriter time.Time
}

// Horizoner is implemented by sources that can report their oldest open
// writer, for horizon mode (docs/design.md, "Horizon mode"). Discovered by
// type assertion.
type Horizoner interface {
	Horizon(ctx context.Context) (Horizon, error)
}

// SnapshotSource is a Source bound to one consistent view of the upstream.
type SnapshotSource interface {
	Source
	// Start is the upstream's clock when the view was taken.
	Start() time.Time
	// Mark is the view's token (see Marker); "" when the source has none.
	Mark() string
	// Close releases the view.
	Close(ctx context.Context) error
}

// Snapshotter is implemented by sources that can serve a consistent initial
// load from one fixed view (docs/design.md, "Consistent initial load").
type Snapshotter interface {
	Snapshot(ctx context.Context) (SnapshotSource, error)
}

// Marker is implemented by sources that can prove which row versions an
// earlier pass already saw, so that a pass re-reads only what changed
// (docs/design.md, "What a pass re-reads"). Discovered by type assertion.
type Marker interface {
	// Mark returns an opaque token for a pass about to start, before it
	// reads anything.
	Mark(ctx context.Context) (string, error)
}

// PassView is a consistent view of the upstream for the pages of a pass.
type PassView interface {
	// Mark is the view's token (see Marker): every version written below
	// it is visible in the view. "" when the source has none.
	Mark() string
	// Close releases the view. Call it once no page is being read in it.
	Close(ctx context.Context) error
}

// Viewer is implemented by sources that can read a pass inside one
// consistent view, so that the pass reads the upstream as it was when it
// began and does not chase the rows committed while it reads
// (docs/design.md, "A pass reads one snapshot"). Discovered by type
// assertion.
type Viewer interface {
	// OpenView opens a view, with its mark, for PageRequest.View.
	OpenView(ctx context.Context) (PassView, error)
}

// Clock is implemented by sources that can read their own clock. A pass
// never moves the watermark past the source's clock at its start, so a
// row dated in the future is published but cannot drag the watermark
// ahead of real time (docs/design.md, "Watermark"). Sources without one are
// capped by the host's clock. Discovered by type assertion.
type Clock interface {
	Now(ctx context.Context) (time.Time, error)
}

// ShapeChange describes a change of the source's shape (its columns).
type ShapeChange struct {
	// Old and New list the value columns with their types.
	Old, New string
	// Added, Dropped and Retyped name the value columns that changed.
	Added, Dropped, Retyped []string
	// Replaced is set when the table itself was replaced (dropped and
	// created again, or renamed over).
	Replaced bool
}

// Reshaper is implemented by sources whose shape can change while tidemark
// runs (docs/schema-changes.md). Discovered by type assertion.
type Reshaper interface {
	// Reshape is called at the start of every pass. It re-reads the shape
	// and, when it changed, switches to it and describes the change (nil
	// when unchanged). A change the configuration cannot follow is a
	// *StopError.
	Reshape(ctx context.Context) (*ShapeChange, error)
}

// ClockedReshaper is a Reshaper and a Clock that reads its clock in the
// round trip that reads its shape: a pass begins with both, one after the
// other, and each round trip it waits for delays every change it carries
// (the clock is the pass's cap: docs/design.md, "Watermark"). The engine
// then calls ReshapeNow in place of Reshape and Now. Discovered by type
// assertion.
type ClockedReshaper interface {
	Reshaper
	Clock
	// ReshapeNow is Reshape, and Now read in the same round trip.
	ReshapeNow(ctx context.Context) (*ShapeChange, time.Time, error)
}

// KeyRange is a part of a source's key space, in the source's key order:
// ids above Lo (exclusive; "" = from the first) up to Hi (inclusive; "" =
// to the last). Lo and Hi are ids as the source writes them.
type KeyRange struct {
	Lo, Hi string
}

// LoadRequest asks for the next page of one key range of an initial load
// in key order.
type LoadRequest struct {
	Range KeyRange
	// Cursor is Page.Next of the range's previous page, "" for its first.
	Cursor string
	Limit  int
	// Mark is the load's token (see PageRequest.Mark): a row version that
	// the passes after the load are sure to leave out is flagged
	// Row.Settled.
	Mark string
}

// RangeLoader is implemented by sources that can read an initial load in
// key order instead of (updated_at, id) order, split into key ranges read
// side by side (docs/design.md, "The initial load in key order"). Its
// methods are safe for concurrent use. Discovered by type assertion.
type RangeLoader interface {
	// SplitKeys divides the key space into at most n ranges of about as
	// many rows each, in key order. The first range starts at "" and the
	// last ends at "", so the ranges cover every id, present or future.
	SplitKeys(ctx context.Context, n int) ([]KeyRange, error)
	// LoadPage returns up to Limit rows of the range after the cursor, in
	// key order. End is true only for a page with no rows; Last, for a page
	// with fewer rows than Limit (the range held nothing more when it was
	// read). Either ends the range.
	LoadPage(ctx context.Context, req LoadRequest) (Page, error)
}

// SessionSnapshotter is implemented by sources that can open one
// consistent view on several sessions at once, for a consistent load read
// side by side. The view it returns also implements RangeLoader, and is
// safe for concurrent use by up to sessions callers.
type SessionSnapshotter interface {
	SnapshotSessions(ctx context.Context, sessions int) (SnapshotSource, error)
}
