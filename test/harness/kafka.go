package harness

import (
	"os"
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kfake"
)

// Kafka is a broker for one test.
type Kafka struct {
	// Brokers are seed addresses.
	Brokers []string
	// Cluster is the in-process kfake cluster (nil with KAFKA_BROKERS).
	Cluster *kfake.Cluster
}

// NewKafka returns KAFKA_BROKERS when set, else a fresh in-process kfake
// cluster closed at cleanup. Options apply to kfake only.
func NewKafka(t testing.TB, opts ...kfake.Opt) *Kafka {
	t.Helper()
	if b := os.Getenv("KAFKA_BROKERS"); b != "" {
		return &Kafka{Brokers: strings.Split(b, ",")}
	}
	opts = append([]kfake.Opt{kfake.NumBrokers(1)}, opts...) // kfake listens on 127.0.0.1
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	t.Cleanup(c.Close)
	return &Kafka{Brokers: c.ListenAddrs(), Cluster: c}
}
