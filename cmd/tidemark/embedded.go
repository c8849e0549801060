package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/tidemark/tidemark/internal/kfakebroker"
)

// EmbeddedConfig configures the embedded broker (embedded.*), which runs
// when kafka.brokers is empty.
type EmbeddedConfig struct {
	// Listen is the loopback host:port the embedded broker listens on, so
	// that kcat and other clients can attach at a known address while a
	// tidemark process (or `tidemark broker`) runs. Default "": a free port
	// on 127.0.0.1, written to <data_dir>/kafka/broker.addr. The broker has
	// no authentication, so only loopback addresses are accepted.
	Listen string `yaml:"listen"`
}

func (c *Config) validateEmbedded(p *problems) {
	l := c.Embedded.Listen
	if l == "" {
		return
	}
	host, port, err := net.SplitHostPort(l)
	n, perr := strconv.Atoi(port)
	if err != nil || perr != nil || n < 0 || n > 65535 {
		p.add("embedded.listen", "%q is not host:port; write e.g. 127.0.0.1:9092", l)
		return
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		p.add("embedded.listen", "%q is not a loopback address: the embedded broker has no authentication; use 127.0.0.1 or [::1], or a real Kafka cluster (kafka.brokers) to share the data", l)
	}
}

// embedded is the in-process Kafka broker used when no brokers are
// configured: kfake, persisted under <data_dir>/kafka, which only tidemark's
// user may read (directories 0700, files 0600). One process owns it (an
// flock on the directory); other tidemark commands find its address in
// <data_dir>/kafka/broker.addr while it runs, or open the data themselves
// when it does not (docs/operating.md, The embedded broker).
type embedded struct {
	cluster *kfake.Cluster
	lock    *os.File
	addr    string
	umask   int
}

func brokerAddrFile(dataDir string) string { return filepath.Join(dataDir, "kafka", "broker.addr") }

// privateFiles makes what is already under dir private to its owner:
// directories 0700, files 0600 (data dirs made by earlier versions were
// 0755 and 0644).
func privateFiles(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o600)
		if d.IsDir() {
			mode = 0o700
		}
		return os.Chmod(p, mode)
	})
}

// startEmbedded starts the broker on listen ("" any free loopback port), or
// returns the address of the one another tidemark process runs on the same
// data directory.
func startEmbedded(dataDir, listen string, log *slog.Logger) (*embedded, []string, error) {
	dir := filepath.Join(dataDir, "kafka")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, nil, &ConfigError{Key: "data_dir", Msg: fmt.Sprintf("create %s: %v; choose a writable data_dir", dir, err)}
	}
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
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
	if err := privateFiles(dir); err != nil {
		lock.Close()
		return nil, nil, fmt.Errorf("make %s private: %w", dir, err)
	}
	// kfake creates its files 0644 and directories 0755 as it goes; the
	// umask keeps them 0600 and 0700 while this process runs the broker.
	umask := syscall.Umask(0o077)
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.DataDir(filepath.Join(dir, "data")),
		kfake.ClusterID("tidemark-embedded"),
	}
	var listenFn func(network, address string) (net.Listener, error)
	if listen != "" {
		host, port, _ := net.SplitHostPort(listen) // checked by validateEmbedded
		n, _ := strconv.Atoi(port)
		opts = append(opts, kfake.Ports(n))
		listenFn = func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, port))
		}
	}
	c, err := kfakebroker.New(listenFn, opts...)
	if err != nil {
		syscall.Umask(umask)
		lock.Close()
		if listen != "" {
			return nil, nil, &ConfigError{Key: "embedded.listen", Msg: fmt.Sprintf("the embedded broker cannot listen on %s: %v; choose a free port", listen, err)}
		}
		return nil, nil, fmt.Errorf("start embedded broker in %s: %w", dir, err)
	}
	addrs := c.ListenAddrs()
	if err := os.WriteFile(brokerAddrFile(dataDir), []byte(addrs[0]+"\n"), 0o600); err != nil {
		c.Close()
		syscall.Umask(umask)
		lock.Close()
		return nil, nil, fmt.Errorf("write %s: %w", brokerAddrFile(dataDir), err)
	}
	log.Warn("EMBEDDED KAFKA: no kafka.brokers configured, so tidemark runs an in-process Kafka-protocol broker (kfake) "+
		"persisted under data_dir. Fine for a demo or a test; for production set kafka.brokers or KAFKA_BROKERS.",
		"addr", addrs[0], "data_dir", dir)
	return &embedded{cluster: c, lock: lock, addr: addrs[0], umask: umask}, addrs, nil
}

func (e *embedded) Close() {
	if e == nil {
		return
	}
	_ = os.Remove(filepath.Join(filepath.Dir(e.lock.Name()), "broker.addr"))
	e.cluster.Close()
	syscall.Umask(e.umask)
	e.lock.Close()
}

// cmdBroker serves the embedded broker's data on its own, for inspection
// with kcat or any Kafka client, until interrupted.
func cmdBroker(ctx context.Context, a *cli) error {
	defer a.closeAll()
	if len(a.cfg.Kafka.Brokers) > 0 {
		return &ConfigError{Key: "kafka.brokers", Msg: "is set, so there is no embedded broker to serve; inspect that cluster directly"}
	}
	emb, addrs, err := startEmbedded(a.cfg.DataDir, a.cfg.Embedded.Listen, a.log)
	if err != nil {
		return err
	}
	if emb == nil {
		fmt.Fprintf(a.stdout, "the tidemark process running on %s already serves its embedded broker at %s\nattach with: kcat -b %s -L\n", a.cfg.DataDir, addrs[0], addrs[0])
		return nil
	}
	a.closers = append(a.closers, emb.Close)
	fmt.Fprintf(a.stdout, "embedded broker of data_dir %s listening on %s (no authentication, loopback only); Ctrl-C stops it\n", a.cfg.DataDir, addrs[0])
	topic := a.cfg.Kafka.Topic
	if topic == "" { // a configuration with only data_dir, or with tables
		topic = "TOPIC"
	}
	fmt.Fprintf(a.stdout, "attach with: kcat -b %s -L   (topics)\n             kcat -b %s -C -t %s -e -f '%%k %%s\\n'   (records; add -X isolation.level=read_committed)\n", addrs[0], addrs[0], topic)
	<-ctx.Done()
	return nil
}
