package harness

import (
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/internal/kfakebroker"
)

// Kafka is a broker for one test.
type Kafka struct {
	// Brokers are seed addresses.
	Brokers []string
	// Cluster is the in-process kfake cluster: nil with KAFKA_BROKERS and
	// with the containers backend, where kfake-only features (fault
	// injection, control hooks, restarts) do not exist. See RequireKfake.
	Cluster *kfake.Cluster
}

// NewKafka returns KAFKA_BROKERS when set, else a fresh in-process kfake
// cluster closed at cleanup. Options apply to kfake only. With the
// containers backend it is a fresh Apache Kafka container instead
// (containers.go), removed at cleanup, and the options are ignored.
func NewKafka(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	if containers() {
		return kafkaContainer(t)
	}
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		return &Kafka{Brokers: strings.Split(b, ",")}
	}
	return newKfake(t, opts...)
}

// NewOwnKafka is a broker that the test owns alone: a fresh in-process
// kfake cluster (KAFKA_BROKERS is never used), or with the containers
// backend a fresh Apache Kafka container, where the options are ignored.
// For tests that must not share a broker, such as test/chaos.
func NewOwnKafka(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	if containers() {
		return kafkaContainer(t)
	}
	return newKfake(t, opts...)
}

func newKfake(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	opts = append([]kfake.Opt{kfake.NumBrokers(1)}, opts...) // kfake listens on 127.0.0.1
	c, err := kfakebroker.New(nil, opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Kafka{Brokers: c.ListenAddrs(), Cluster: c}
}

// RequireKfake skips t unless k is an in-process kfake cluster, naming the
// kfake-only feature that the test needs (fault injection, a control hook,
// a broker restart, a listener wrapper, an option such as
// kfake.AllowAutoTopicCreation).
func (k *Kafka) RequireKfake(t testing.TB, feature string) {
	t.Helper()
	if k.Cluster != nil {
		return
	}
	SkipUnlessKfake(t, feature)
	t.Skipf("needs in-process kfake for %s; KAFKA_BROKERS points at an external cluster", feature)
}
