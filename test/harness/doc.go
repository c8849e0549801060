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
//
// With TIDEMARK_TEST_BACKEND=containers (`make test-containers`, backend.go
// and containers.go) both come from containers started through
// testcontainers-go instead: a postgres server shared by the package (one
// of its own for StartPostgres) and an Apache Kafka broker in KRaft mode per
// test; DATABASE_URL and KAFKA_BROKERS are not read. Nothing is skipped
// then: without a Docker engine the process ends with exit code 2 and one
// line saying so, and a container that does not start fails the test.
// Tests that need kfake-only features call Kafka.RequireKfake or
// SkipUnlessKfake, which skip naming the feature.
package harness
