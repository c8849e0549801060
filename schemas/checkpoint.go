package schemas

import (
	"encoding/json"
	"fmt"
)

// CheckpointVersion is the checkpoint format this build writes. It also
// reads version 1, whose dedupe set was a list inside the record.
const CheckpointVersion = 2

// CheckpointVersionLoad is the version of a checkpoint holding an open
// initial load in key order (Load): the same format with one more field,
// versioned apart so that a build that does not know a load refuses the
// checkpoint instead of starting a new pass from scratch. EncodeCheckpoint
// picks it; this build reads it.
const CheckpointVersionLoad = 3

// Phases of a checkpoint.
const (
	// PhaseIdle: no pass is open; the next pass starts at Watermark - margin.
	PhaseIdle = "idle"
	// PhasePass: a pass is open; resume it at Cursor with the same PassLow.
	PhasePass = "pass"
	// PhaseSnapshot: a consistent initial load is open. It resumes at
	// Cursor under a new snapshot; PassHorizon keeps the first snapshot's
	// start, the watermark the load hands to the incremental passes.
	PhaseSnapshot = "snapshot"
	// PhaseLoad: an initial load in key order is open, split into key
	// ranges walked side by side (Load). Each range resumes at its own
	// cursor; PassHorizon is the watermark the load hands over.
	PhaseLoad = "load"
)

// Load is the progress of an initial load in key order (phase load).
type Load struct {
	// Consistent: the ranges are read under one snapshot (a new one on
	// resume), as for source.initial_load: consistent.
	Consistent bool `json:"consistent"`
	// Ranges partition the key space; each is walked in key order.
	Ranges []LoadRange `json:"ranges"`
}

// LoadRange is one key range of a load: ids above Lo (exclusive; "" = from
// the first) up to Hi (inclusive; "" = to the last), in the source's key
// order.
type LoadRange struct {
	Lo string `json:"lo"`
	Hi string `json:"hi"`
	// Cursor is the source's opaque cursor of the range's first page not
	// yet committed ("" = the range's first page).
	Cursor string `json:"cursor"`
	// Done is set once the range's end is committed.
	Done bool `json:"done"`
}

// Checkpoint is the position tidemark has committed, written to the offsets
// topic (key = connector name) in the same Kafka transaction as the records it
// covers. See checkpoint.schema.json.
type Checkpoint struct {
	Version   int    `json:"version"`
	Connector string `json:"connector"`
	// Fingerprint is a digest of the configuration that defines the data set
	// and the record format; Fields lists its inputs so a mismatch can name
	// what changed. No secret is ever part of either.
	Fingerprint       string            `json:"fingerprint"`
	FingerprintFields map[string]string `json:"fingerprint_fields"`

	Phase string `json:"phase"`
	// Watermark (W) is the highest updated_at fully covered by a finished
	// pass, "" meaning minus infinity (nothing read yet).
	Watermark string `json:"watermark"`
	// PassLow is the inclusive lower bound of the open pass ("" = none).
	PassLow string `json:"pass_low"`
	// PassMax is the largest updated_at committed so far in the open pass.
	PassMax string `json:"pass_max"`
	// PassHorizon caps the watermark this pass may reach ("" = no cap): the
	// upstream's clock when the pass began, and in horizon mode the start of
	// the oldest open writer if earlier. For a consistent load it is the
	// first snapshot's start, which becomes the watermark.
	PassHorizon string `json:"pass_horizon"`
	// Cursor is the source's opaque cursor of the first page not yet
	// committed ("" = the first page of the pass).
	Cursor string `json:"cursor"`
	// Boundary locates the dedupe set B: its floor and the segments of the
	// offsets topic that hold it (see BoundaryState).
	Boundary BoundaryState `json:"boundary"`
	// SeenMark is the source's token of the last finished pass ("" = none):
	// row versions it proves that pass saw are not returned again.
	SeenMark string `json:"seen_mark"`
	// PassMark is the open pass's own token, which becomes SeenMark when the
	// pass ends ("" = the source gives none).
	PassMark string `json:"pass_mark"`
	// PassHead is set while the open pass is a head pass: started by a
	// change notification (or a follow-up of one), it reads from W less
	// the lookback, not W - margin, and skips by
	// SeenMark (docs/design.md, "Head passes").
	PassHead bool `json:"pass_head,omitempty"`
	// HeadsSinceFull is set once a head pass has finished since the last
	// full pass; FullMark and FullWatermark then hold that full pass's
	// mark and the watermark it left, from which the next full pass reads
	// (FullWatermark - margin, skipping by FullMark). Unset, they are
	// SeenMark and Watermark.
	HeadsSinceFull bool   `json:"heads_since_full,omitempty"`
	FullMark       string `json:"full_mark,omitempty"`
	FullWatermark  string `json:"full_watermark,omitempty"`
	// Legacy is the dedupe set of a version 1 checkpoint, which held it
	// inline; DecodeCheckpoint fills it and it is never written.
	Legacy []BoundaryEntry `json:"-"`

	RunID    string   `json:"run_id"`
	Seq      int64    `json:"seq"`
	Counters Counters `json:"counters"`
	// CommittedAt is the wall-clock time the transaction was committed.
	CommittedAt string `json:"committed_at"`
	// NeedsDecision, when set, says why the connector stopped for an operator
	// decision; the connector refuses to run until a reset clears it.
	NeedsDecision string `json:"needs_decision,omitempty"`
	// LastReset records the latest operator reset, if any.
	LastReset *Reset `json:"last_reset,omitempty"`
	// Load is the open initial load in key order (phase load), nil
	// otherwise.
	Load *Load `json:"load,omitempty"`
	// Sweep is the progress of a reconciliation sweep that has committed
	// part of its work; the next start finishes it.
	Sweep *SweepProgress `json:"sweep,omitempty"`
	// LastSweep summarises the latest finished sweep.
	LastSweep *SweepSummary `json:"last_sweep,omitempty"`
}

// SweepProgress is an unfinished sweep.
type SweepProgress struct {
	StartedAt  string `json:"started_at"`
	Tombstoned int64  `json:"tombstoned"`
	Repaired   int64  `json:"repaired"`
}

// SweepSummary is a finished sweep.
type SweepSummary struct {
	At         string `json:"at"`
	View       string `json:"view"`
	SourceRows int64  `json:"source_rows"`
	TopicKeys  int64  `json:"topic_keys"`
	Tombstoned int64  `json:"tombstoned"`
	Repaired   int64  `json:"repaired"`
}

// ResetRunID is the run id of a checkpoint written by `tidemark reset`.
const ResetRunID = "reset"

// Reset records an operator decision to start over.
type Reset struct {
	// At is when the reset was committed.
	At string `json:"at"`
	// By is who ran it (OS user@host, or --by).
	By string `json:"by"`
	// Reason is the operator's text.
	Reason string `json:"reason"`
	// Watermark is the stated watermark ("" = from scratch).
	Watermark string `json:"watermark"`
}

// BoundaryEntry is one member of a version 1 checkpoint's inline dedupe
// set: id, updated_at in microseconds since the Unix epoch, and the
// 16-hex-digit digest of the value alone, as a three-element JSON array.
type BoundaryEntry struct {
	ID        string
	UpdatedAt int64
	Digest    uint64
}

// MarshalJSON encodes the entry as [id, micros, "digest"].
func (e BoundaryEntry) MarshalJSON() ([]byte, error) {
	return json.Marshal([]any{e.ID, e.UpdatedAt, fmt.Sprintf("%016x", e.Digest)})
}

// UnmarshalJSON decodes [id, micros, "digest"].
func (e *BoundaryEntry) UnmarshalJSON(b []byte) error {
	var raw [3]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return fmt.Errorf("boundary entry: want [id, micros, digest]: %w", err)
	}
	if err := json.Unmarshal(raw[0], &e.ID); err != nil {
		return fmt.Errorf("boundary entry id: %w", err)
	}
	if err := json.Unmarshal(raw[1], &e.UpdatedAt); err != nil {
		return fmt.Errorf("boundary entry updated_at: %w", err)
	}
	var d string
	if err := json.Unmarshal(raw[2], &d); err != nil {
		return fmt.Errorf("boundary entry digest: %w", err)
	}
	if _, err := fmt.Sscanf(d, "%016x", &e.Digest); err != nil || len(d) != 16 {
		return fmt.Errorf("boundary entry digest %q: want 16 hex digits", d)
	}
	return nil
}

// Counters are cumulative over the connector's life (they survive restarts
// through the checkpoint).
type Counters struct {
	// Raw rows read from the source (including re-reads).
	Raw int64 `json:"raw"`
	// Published records (upserts and tombstones).
	Published int64 `json:"published"`
	// Deduped re-read rows skipped because B held the same digest.
	Deduped int64 `json:"deduped"`
	// Tombstones published (part of Published).
	Tombstones int64 `json:"tombstones"`
	// Reread counts rows read again from the window below the watermark a
	// pass started from: the price of the margin (published when changed,
	// deduplicated otherwise).
	Reread int64 `json:"reread"`
	// Transactions and Pages committed; Passes finished.
	Transactions int64 `json:"transactions"`
	Pages        int64 `json:"pages"`
	Passes       int64 `json:"passes"`
}

// EncodeCheckpoint encodes c as JSON. Empty collections are written as []
// and {} rather than null.
func EncodeCheckpoint(c *Checkpoint) ([]byte, error) {
	d := *c
	if d.Version == CheckpointVersion && d.Load != nil {
		d.Version = CheckpointVersionLoad
	}
	if d.FingerprintFields == nil {
		d.FingerprintFields = map[string]string{}
	}
	if d.Boundary.Units == nil {
		d.Boundary.Units = []BoundaryUnit{}
	}
	return json.Marshal(&d)
}

// checkpointV1 reads a version 1 checkpoint, whose boundary was the list
// of entries itself.
type checkpointV1 struct {
	Checkpoint
	Boundary []BoundaryEntry `json:"boundary"`
	Counters struct {
		Counters
		DedupeOverflow int64 `json:"dedupe_overflow"`
	} `json:"counters"`
}

// DecodeCheckpoint decodes and checks the version. A version 1 checkpoint
// is converted: its inline dedupe set goes to Legacy.
func DecodeCheckpoint(b []byte) (*Checkpoint, error) {
	var probe struct {
		Version int `json:"version"`
	}
	if err := json.Unmarshal(b, &probe); err != nil {
		return nil, fmt.Errorf("decode checkpoint: %w", err)
	}
	switch probe.Version {
	case CheckpointVersion, CheckpointVersionLoad:
		var c Checkpoint
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("decode checkpoint: %w", err)
		}
		if (c.Load != nil) != (c.Phase == PhaseLoad) || (c.Load != nil) != (probe.Version == CheckpointVersionLoad) {
			return nil, fmt.Errorf("decode checkpoint: phase %q with version %d does not go with a load of %d ranges", c.Phase, probe.Version, c.Load.count())
		}
		c.Version = CheckpointVersion
		return &c, nil
	case 1:
		var v1 checkpointV1
		if err := json.Unmarshal(b, &v1); err != nil {
			return nil, fmt.Errorf("decode version 1 checkpoint: %w", err)
		}
		c := v1.Checkpoint
		c.Version = CheckpointVersion
		c.Counters = v1.Counters.Counters
		c.Legacy = v1.Boundary
		return &c, nil
	}
	return nil, fmt.Errorf("checkpoint format version %d is not supported by this build (it reads versions 1 to %d); run the tidemark release that wrote it, or reset", probe.Version, CheckpointVersionLoad)
}

// count is the number of ranges (0 for a nil Load).
func (l *Load) count() int {
	if l == nil {
		return 0
	}
	return len(l.Ranges)
}
