package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
)

// embedded is the in-process Kafka broker used when no brokers are
// configured: kfake, persisted under <data_dir>/kafka. One process owns it
// (an flock on the directory); other tidemark commands find its address in
// <data_dir>/kafka/broker.addr while it runs, or open the data themselves
// when it does not.
type embedded struct {
	cluster *kfake.Cluster
	lock    *os.File
	addr    string
}

func brokerAddrFile(dataDir string) string { return filepath.Join(dataDir, "kafka", "broker.addr") }

// startEmbedded starts the broker, or returns the address of the one another
// tidemark process runs on the same data directory.
func startEmbedded(dataDir string, log *slog.Logger) (*embedded, []string, error) {
	dir := filepath.Join(dataDir, "kafka")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, &ConfigError{Key: "data_dir", Msg: fmt.Sprintf("create %s: %v; choose a writable data_dir", dir, err)}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("embedded broker lock: %w", err)
	}
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		lock.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			b, rerr := os.ReadFile(brokerAddrFile(dataDir))
			addr := strings.TrimSpace(string(b))
			if rerr == nil && addr != "" {
				if c, derr := net.DialTimeout("tcp", addr, 2*time.Second); derr == nil {
					c.Close()
					log.Info("using the embedded broker of the tidemark process running on this data_dir", "addr", addr, "data_dir", dataDir)
					return nil, []string{addr}, nil
				}
			}
			return nil, nil, fmt.Errorf("another tidemark process holds the embedded broker in %s but does not answer; wait for it or stop it", dir)
		}
		return nil, nil, fmt.Errorf("embedded broker lock: %w", err)
	}
	c, err := kfake.NewCluster(
		kfake.NumBrokers(1),
		kfake.DataDir(filepath.Join(dir, "data")),
		kfake.ClusterID("tidemark-embedded"),
	)
	if err != nil {
		lock.Close()
		return nil, nil, fmt.Errorf("start embedded broker in %s: %w", dir, err)
	}
	addrs := c.ListenAddrs()
	if err := os.WriteFile(brokerAddrFile(dataDir), []byte(addrs[0]+"\n"), 0o644); err != nil {
		c.Close()
		lock.Close()
		return nil, nil, fmt.Errorf("write %s: %w", brokerAddrFile(dataDir), err)
	}
	log.Warn("EMBEDDED KAFKA: no kafka.brokers configured, so tidemark runs an in-process Kafka-protocol broker (kfake) "+
		"persisted under data_dir. Fine for a demo or a test; for production set kafka.brokers or KAFKA_BROKERS.",
		"addr", addrs[0], "data_dir", dir)
	return &embedded{cluster: c, lock: lock, addr: addrs[0]}, addrs, nil
}

func (e *embedded) Close() {
	if e == nil {
		return
	}
	_ = os.Remove(filepath.Join(filepath.Dir(e.lock.Name()), "broker.addr"))
	e.cluster.Close()
	e.lock.Close()
}
