package harness

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"

	"github.com/tidemark/tidemark/test/harness/dockerengine"
)

// BackendEnv names the environment variable that selects the backend of
// the harness: unset (or "local") for the default, "containers" for Apache
// Kafka and PostgreSQL in containers (containers.go; `make test-containers`).
const BackendEnv = "TIDEMARK_TEST_BACKEND"

// The backends.
const (
	// BackendLocal is the default: PostgreSQL from DATABASE_URL or a
	// throwaway local cluster, Kafka from KAFKA_BROKERS or in-process kfake.
	BackendLocal = "local"
	// BackendContainers runs apache/kafka (KRaft) and postgres containers
	// through testcontainers-go; DATABASE_URL and KAFKA_BROKERS are not read.
	BackendContainers = "containers"
)

var backendOnce sync.Once

// Backend returns the selected backend. An unknown TIDEMARK_TEST_BACKEND,
// or the containers backend with no Docker engine reachable, ends the
// process with exit code 2 and one line saying why: the harness never skips
// or falls back when it was asked for containers.
func Backend() string {
	backendOnce.Do(checkBackend)
	if os.Getenv(BackendEnv) == BackendContainers {
		return BackendContainers
	}
	return BackendLocal
}

func containers() bool { return Backend() == BackendContainers }

func checkBackend() {
	switch v := os.Getenv(BackendEnv); v {
	case "", BackendLocal:
	case BackendContainers:
		host, err := dockerengine.Check(context.Background(), dockerengine.FromEnviron())
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		// testcontainers-go looks for an engine in more places than the
		// check does; pin it to the one that answered.
		if os.Getenv("DOCKER_HOST") == "" {
			os.Setenv("DOCKER_HOST", host)
		}
	default:
		fmt.Fprintf(os.Stderr, "%s=%q: want %q (or unset) or %q\n", BackendEnv, v, BackendLocal, BackendContainers)
		os.Exit(2)
	}
}

// SkipUnlessKfake skips t when the suites do not run on in-process kfake
// brokers (the containers backend), naming the kfake-only feature the test
// needs. For tests that start kfake clusters of their own; a test holding a
// *Kafka uses Kafka.RequireKfake, which also covers KAFKA_BROKERS.
func SkipUnlessKfake(t testing.TB, feature string) {
	t.Helper()
	if containers() {
		t.Skipf("needs in-process kfake for %s; %s=%s runs Apache Kafka in a container", feature, BackendEnv, BackendContainers)
	}
}
