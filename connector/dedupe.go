package connector

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/tidemark/tidemark/schemas"
)

// loadBoundary rebuilds B from the units the checkpoint names (or converts
// a version 1 checkpoint's inline set). A unit that cannot be read back is
// a safety stop: without it, rows it covers would be published again.
func (e *Engine) loadBoundary(ctx context.Context, cp *schemas.Checkpoint) error {
	e.b = newBoundary()
	if len(cp.Legacy) > 0 {
		e.b.legacy(cp.Legacy)
		cp.Legacy = nil
		return nil
	}
	st := cp.Boundary
	if len(st.Units) == 0 {
		if st.Entries != 0 {
			return e.boundaryStop(fmt.Errorf("the checkpoint counts %d entries in the dedupe set but names no segment", st.Entries), nil)
		}
		return nil
	}
	var refs []StateRef
	for _, u := range st.Units {
		for i, off := range u.Offsets {
			refs = append(refs, StateRef{Key: schemas.BoundaryKey(e.cfg.Name, u.Seq, i), Offset: off})
		}
	}
	vals, err := e.store.State(ctx, refs)
	if err != nil {
		return e.boundaryStop(err, refs)
	}
	for _, u := range st.Units {
		// What was read does not change on a second read: a segment that
		// does not decode, or does not hold what the checkpoint counts, is
		// damage, not a transient failure.
		n, err := e.b.replay(u.Seq, u.Offsets, vals[:len(u.Offsets)])
		if err != nil {
			return e.boundaryStop(fmt.Errorf("%w: %w", ErrStateDamaged, err), refs)
		}
		if n != u.Entries {
			return e.boundaryStop(fmt.Errorf("%w: unit %d holds %d entries, the checkpoint says %d", ErrStateDamaged, u.Seq, n, u.Entries), refs)
		}
		vals = vals[len(u.Offsets):]
	}
	floor, err := parseFloor(st.Floor)
	if err != nil {
		return e.corrupt("boundary floor", err)
	}
	before := int64(e.b.Len())
	e.b.prune(floor)
	// Checkpoints written before the count left out the entries the
	// replay prunes (see boundary.state) counted some of them: a count
	// between the replay's before and after the prune is such a checkpoint
	// (every unit's own count matched above); anything else is not.
	if n := int64(e.b.Len()); !countMatches(st.Entries, before, n) {
		return e.boundaryStop(fmt.Errorf("%w: the segments give %d entries, the checkpoint says %d", ErrStateDamaged, n, st.Entries), refs)
	}
	return nil
}

// countMatches reports whether a checkpoint's count of B's entries agrees
// with a replay that held before entries before the floor's prune and after
// entries after it: it is after (what the checkpoint counts now), or, for a
// checkpoint written before that, between the two.
func countMatches(claimed, before, after int64) bool { return after <= claimed && claimed <= before }

// boundaryStop is the safety stop for a dedupe set that cannot be read
// back. A transient read failure (the broker) is retried instead.
func (e *Engine) boundaryStop(err error, refs []StateRef) error {
	if !Fatal(err) && refs != nil && !errors.Is(err, ErrStateDamaged) {
		return staged("checkpoint", fmt.Errorf("read the dedupe set (%d segments): %w", len(refs), err))
	}
	return &StopError{
		Reason: "the dedupe set named by the checkpoint cannot be read back from the offsets topic",
		Hint: fmt.Sprintf("were segments of the offsets topic deleted (retention instead of compaction?) or written by another tool? "+
			"`tidemark reset --to-watermark` for connector %q starts over from a stated point; rows at or after it are published again", e.cfg.Name),
		Err: err,
	}
}

// ErrStateDamaged marks a state record that is missing, foreign or damaged
// (as opposed to one that could not be read right now).
var ErrStateDamaged = errors.New("state record missing or damaged")

func parseFloor(s string) (int64, error) {
	if s == "" {
		return math.MinInt64, nil
	}
	t, err := schemas.ParseTime(s)
	if err != nil {
		return 0, err
	}
	return t.UnixMicro(), nil
}

// floor is the lowest updated_at any later read can meet again, given the
// working checkpoint: a later full pass starts at its watermark minus the
// margin, and the open pass (or load) only reads forward from its cursor.
// math.MinInt64 means minus infinity.
func (e *Engine) floor() (int64, error) {
	w, err := parseFloor(e.cp.Watermark)
	if err != nil {
		return 0, e.corrupt("watermark", err)
	}
	switch e.cp.Phase {
	case schemas.PhaseSnapshot, schemas.PhaseLoad:
		// The load hands PassHorizon to the incremental passes.
		if h, err := parseFloor(e.cp.PassHorizon); err != nil {
			return 0, e.corrupt("pass_horizon", err)
		} else if h != math.MinInt64 {
			w = max(w, h)
		}
	case schemas.PhasePass:
		// The pass will end with W' >= min(its largest updated_at so far,
		// its cap): the end-of-pass samples can only be later than the
		// start's (docs/design.md, "Watermark").
		if e.cp.PassMax != "" {
			cand, err := parseFloor(e.cp.PassMax)
			if err != nil {
				return 0, e.corrupt("pass_max", err)
			}
			if e.cp.PassHorizon != "" {
				h, err := parseFloor(e.cp.PassHorizon)
				if err != nil {
					return 0, e.corrupt("pass_horizon", err)
				}
				cand = min(cand, h)
			}
			w = max(w, cand)
		}
	}
	if w == math.MinInt64 {
		return w, nil
	}
	// The next full pass reads from the last full pass's W - margin, below
	// which head passes may have moved W (docs/design.md, "Head passes").
	// (Without head passes that W is the watermark, already below w.) An
	// open head pass that is the first since a full pass keeps, at its
	// end, the W it started from. So does an open full pass that head
	// passes may interrupt: they read from W - lookback, below what it has
	// read (docs/design.md, "Head passes during a full pass").
	if e.cp.HeadsSinceFull || e.cp.Phase == schemas.PhasePass && (e.cp.PassHead || e.nestOpen) {
		f, err := parseFloor(e.fullWatermark())
		if err != nil {
			return 0, e.corrupt("full_watermark", err)
		}
		if w = min(w, f); w == math.MinInt64 {
			return w, nil
		}
	}
	// Never below the committed floor: B has nothing under it (a raised
	// margin starts passes there too; see pass).
	f, err := parseFloor(e.cp.Boundary.Floor)
	if err != nil {
		return 0, e.corrupt("boundary floor", err)
	}
	return max(w-e.cfg.Margin.Microseconds(), f), nil
}

// sealBoundary prunes B to the floor and turns the transaction's changes
// into state records. The checkpoint built by the returned function names
// the units that make up B after the commit.
func (e *Engine) sealBoundary() (sealed, []StateRecord, string, int64, error) {
	floor, err := e.floor()
	if err != nil {
		return sealed{}, nil, "", 0, err
	}
	e.b.prune(floor)
	fl := ""
	if floor != math.MinInt64 {
		fl = schemas.FormatTime(schemas.FromMicros(floor))
	}
	s := e.b.seal()
	var recs []StateRecord
	for i, seg := range s.segments {
		recs = append(recs, StateRecord{Key: schemas.BoundaryKey(e.cfg.Name, e.cp.Seq, i), Value: seg})
	}
	for _, u := range s.drop {
		for i := range u.offsets {
			recs = append(recs, StateRecord{Key: schemas.BoundaryKey(e.cfg.Name, u.seq, i)})
		}
	}
	return s, recs, fl, floor, nil
}
