// Package integration is the PostgreSQL integration suite of tidemark: the
// engine, the PostgreSQL source, the transactional producer and the
// checkpoint store together, against a real PostgreSQL (harness.NewDB) and
// a Kafka-protocol broker (harness.NewKafka).
//
// Every scenario asserts final state, never counts alone: the data topic is
// folded read_committed (fold.Map) and its live keys and values are compared
// with the table as the PostgreSQL source itself encodes it, walked from
// scratch. Where a scenario promises it, no (id, value) may have been
// published twice.
//
// The package holds tests only; it has no exported API.
package integration
