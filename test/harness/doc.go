// Package harness gives tests the real things: a PostgreSQL server and a
// Kafka-protocol broker, both on loopback.
//
// PostgreSQL: DATABASE_URL when set; otherwise a throwaway cluster started
// with the server binaries of `pg_config --bindir` (as the postgres OS user
// when running as root) in a temporary directory on a free port, shared by
// the tests of one package and removed when they finish. Each test gets its
// own schema. Under CI=true a missing PostgreSQL fails the test instead of
// skipping it.
//
// Kafka: KAFKA_BROKERS when set; otherwise an in-process kfake cluster per
// test.
package harness
