// Package chaos tries hard to break tidemark's promise "kill the process at
// any point, rerun, same final state" (issue 3), and proves it with numbers.
//
// Check is the checker every scenario ends with: it folds the data topic
// read_committed and reports six counts that must all be 0 (lost keys, stale
// values, extra keys, duplicate publications, per-key regressions,
// watermark regressions in the checkpoint history).
//
// The scenarios are tests in this package: kill -9 at random moments of a
// subprocess under a mutating workload, a crash at every step boundary
// (failpoints), broker faults injected with kfake, database faults
// (pg_terminate_backend, a PostgreSQL restart), a zombie second instance,
// SIGTERM mid-transaction and a lost checkpoint. They talk to loopback
// only: a throwaway PostgreSQL cluster and in-process kfake brokers. Longer
// variants run with TIDEMARK_SOAK=1 (make soak).
package chaos
