// Package sweep is the test suite of hard deletes and proof of completeness
// (docs/design.md, "Deletes and the sweep", "Proof"): the reconciliation sweep and verify, against a real
// PostgreSQL (harness.NewDB) and a Kafka-protocol broker (harness.NewKafka).
//
// Every scenario asserts final state: the data topic folded read_committed
// equals the table's live rows (keys and values), tombstones exist exactly
// for the ids that were deleted, and verify agrees.
//
// The package holds tests only; it has no exported API.
package sweep
