package schemas

import (
	"encoding/json"
	"fmt"
)

// LedgerVersion is the ledger entry format this build writes. Version 1
// (whose counters had dedupe_overflow instead of reread) is read too.
const LedgerVersion = 2

// Ledger entry kinds.
const (
	// LedgerRun opens a run: where it resumed from and why.
	LedgerRun = "run"
	// LedgerTxn records one committed transaction.
	LedgerTxn = "txn"
	// LedgerReset records an operator reset (who, why, to where).
	LedgerReset = "reset"
)

// Run start reasons.
const (
	ReasonFresh   = "fresh"
	ReasonResumed = "resumed"
	ReasonReset   = "reset"
)

// LedgerEntry is one record of the ledger topic (key = connector name),
// written in the same Kafka transaction as the data and checkpoint it
// describes. See ledger.schema.json.
type LedgerEntry struct {
	Version   int    `json:"version"`
	Connector string `json:"connector"`
	Kind      string `json:"kind"`
	RunID     string `json:"run_id"`
	// Seq is the checkpoint sequence this entry commits (txn, reset), or the
	// sequence the run resumed from (run).
	Seq int64  `json:"seq"`
	At  string `json:"at"`

	// Reason (run): fresh, resumed or reset; Detail says from where.
	Reason string `json:"reason,omitempty"`
	Detail string `json:"detail,omitempty"`

	// Txn fields.
	Phase         string `json:"phase,omitempty"`
	RequestCursor string `json:"request_cursor"`
	NextCursor    string `json:"next_cursor"`
	Watermark     string `json:"watermark"`
	Pages         int64  `json:"pages"`
	Raw           int64  `json:"raw"`
	Published     int64  `json:"published"`
	Deduped       int64  `json:"deduped"`
	Tombstones    int64  `json:"tombstones"`
	// Keys is the number of records published; KeysDigest is an
	// order-independent digest of their keys (sum of FNV-1a 64 per key).
	Keys       int64  `json:"keys"`
	KeysDigest string `json:"keys_digest"`
	// Counters are the checkpoint's cumulative counters after this entry.
	Counters Counters `json:"counters"`

	// Reset fields.
	By  string `json:"by,omitempty"`
	Why string `json:"why,omitempty"`
}

// EncodeLedgerEntry encodes e as JSON.
func EncodeLedgerEntry(e *LedgerEntry) ([]byte, error) { return json.Marshal(e) }

// DecodeLedgerEntry decodes and checks the version.
func DecodeLedgerEntry(b []byte) (*LedgerEntry, error) {
	var e LedgerEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("decode ledger entry: %w", err)
	}
	if e.Version != LedgerVersion && e.Version != 1 {
		return nil, fmt.Errorf("ledger entry format version %d is not supported by this build (it reads versions 1 and %d)", e.Version, LedgerVersion)
	}
	return &e, nil
}
