package schemas

import (
	"encoding/json"
	"fmt"
	"strconv"
)

// CheckpointVersion is the checkpoint format this build writes and the only
// one it reads.
const CheckpointVersion = 1

// Phases of a checkpoint.
const (
	// PhaseIdle: no pass is open; the next pass starts at Watermark - margin.
	PhaseIdle = "idle"
	// PhasePass: a pass is open; resume it at Cursor with the same PassLow.
	PhasePass = "pass"
	// PhaseSnapshot: a consistent initial load was interrupted. A snapshot
	// cannot outlive its process, so the load restarts from scratch.
	PhaseSnapshot = "snapshot"
)

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
	// PassHorizon (horizon mode only) caps the watermark this pass may reach:
	// the earlier of the upstream clock and the start of the oldest open
	// writer, sampled when the pass began ("" = no cap).
	PassHorizon string `json:"pass_horizon"`
	// Cursor is the source's opaque cursor of the first page not yet
	// committed ("" = the first page of the pass).
	Cursor string `json:"cursor"`
	// Boundary is the dedupe set B: rows near the watermark and the digest of
	// the value last published for them.
	Boundary []BoundaryEntry `json:"boundary"`

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

// BoundaryEntry is one member of the dedupe set: id, updated_at in
// microseconds since the Unix epoch, and the 16-hex-digit value digest. It is
// encoded as a three-element JSON array to keep checkpoints small.
type BoundaryEntry struct {
	ID        string
	UpdatedAt int64
	Digest    uint64
}

// MarshalJSON encodes the entry as [id, micros, "digest"].
func (e BoundaryEntry) MarshalJSON() ([]byte, error) { return e.appendJSON(nil), nil }

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
	// DedupeOverflow counts rows that could not enter B because it was full;
	// a re-read of such a row is published again (never lost).
	DedupeOverflow int64 `json:"dedupe_overflow"`
	// Transactions and Pages committed; Passes finished.
	Transactions int64 `json:"transactions"`
	Pages        int64 `json:"pages"`
	Passes       int64 `json:"passes"`
}

// EncodeCheckpoint encodes c as JSON. Empty collections are written as []
// and {} rather than null. The boundary set, up to tens of thousands of
// entries, is encoded by hand: encoding/json would call MarshalJSON per entry
// and then re-scan its output.
func EncodeCheckpoint(c *Checkpoint) ([]byte, error) {
	d := *c
	d.Boundary = nil
	if d.FingerprintFields == nil {
		d.FingerprintFields = map[string]string{}
	}
	head, err := json.Marshal(checkpointNoBoundary(d))
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(head)+32+len(c.Boundary)*48)
	b = append(b, head[:len(head)-1]...) // drop the closing brace
	b = append(b, `,"boundary":[`...)
	for i, e := range c.Boundary {
		if i > 0 {
			b = append(b, ',')
		}
		b = e.appendJSON(b)
	}
	return append(b, "]}"...), nil
}

// checkpointNoBoundary is Checkpoint without its boundary field, which
// EncodeCheckpoint appends itself.
type checkpointNoBoundary Checkpoint

func (c checkpointNoBoundary) MarshalJSON() ([]byte, error) {
	type plain Checkpoint // no methods: no recursion
	return json.Marshal(struct {
		plain
		Boundary *struct{} `json:"boundary,omitempty"` // shadows plain.Boundary; nil = omitted
	}{plain: plain(c)})
}

func (e BoundaryEntry) appendJSON(b []byte) []byte {
	b = append(b, '[')
	b = appendJSONString(b, e.ID)
	b = append(b, ',')
	b = strconv.AppendInt(b, e.UpdatedAt, 10)
	b = append(b, ',', '"')
	const hexd = "0123456789abcdef"
	for shift := 60; shift >= 0; shift -= 4 {
		b = append(b, hexd[(e.Digest>>uint(shift))&0xf])
	}
	return append(b, '"', ']')
}

// appendJSONString appends s as a JSON string; plain ASCII is copied,
// anything else goes through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// DecodeCheckpoint decodes and checks the version.
func DecodeCheckpoint(b []byte) (*Checkpoint, error) {
	var c Checkpoint
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, fmt.Errorf("decode checkpoint: %w", err)
	}
	if c.Version != CheckpointVersion {
		return nil, fmt.Errorf("checkpoint format version %d is not supported by this build (it reads version %d); run the tidemark release that wrote it, or reset", c.Version, CheckpointVersion)
	}
	return &c, nil
}
