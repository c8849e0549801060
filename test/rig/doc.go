// Package rig is the shared world of tidemark's PostgreSQL test suites
// (test/integration, test/sweep): for tests only, it is imported by
// _test.go files and by nothing that ships.
//
// A Rig owns one test's PostgreSQL schema with its table (harness.NewDB),
// a Kafka-protocol broker (harness.NewKafka) with the data, offsets and
// optional ledger topics created, and the PostgreSQL source on the table.
// It builds what runs against them as the binary wires it: the engine over
// a fresh producer.Writer session and the checkpoint store (fail-closed on
// the ledger when the rig has one), `run --once`, `sweep` and `verify`.
//
// It also owns what every scenario asserts: the expected state (the live
// rows of the table as the source itself encodes them), the data topic
// folded read_committed (fold.Map), and the comparisons of the two, keys
// and values, tombstones and duplicate publications. Helpers take
// testing.TB, call t.Helper() and register their cleanups with t.Cleanup.
//
// Scenario-specific helpers (a source wrapper that acts between pages,
// records produced behind tidemark's back, a racing writer) stay with the
// suites that use them.
package rig
