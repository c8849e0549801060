package harness

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/network"
	"github.com/testcontainers/testcontainers-go"
	tcexec "github.com/testcontainers/testcontainers-go/exec"
	"github.com/testcontainers/testcontainers-go/wait"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The containers backend (TIDEMARK_TEST_BACKEND=containers, backend.go):
// PostgreSQL and Apache Kafka (KRaft) in containers started through
// testcontainers-go. The images are pinned; TIDEMARK_TEST_POSTGRES_IMAGE and
// TIDEMARK_TEST_KAFKA_IMAGE override them (a mirror, another version).
const (
	PostgresImage = "postgres:15"
	KafkaImage    = "apache/kafka:4.1.0"
)

func imageOf(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// startTimeout bounds one container's start, image pull included.
const startTimeout = 5 * time.Minute

// localEngine reports whether the engine that checkBackend pinned in
// DOCKER_HOST publishes ports on this machine (a unix socket, or tcp to
// loopback). Then ports are published on 127.0.0.1 only and reached there.
func localEngine() bool {
	u, err := url.Parse(os.Getenv("DOCKER_HOST"))
	if err != nil {
		return false
	}
	if u.Scheme == "unix" {
		return true
	}
	if u.Hostname() == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(u.Hostname())
	return err == nil && ip.IsLoopback()
}

// publish publishes the container's port, on 127.0.0.1 only with a local
// engine, on a port the engine picks.
func publish(port string) testcontainers.CustomizeRequestOption {
	return func(req *testcontainers.GenericContainerRequest) error {
		if err := testcontainers.WithExposedPorts(port)(req); err != nil {
			return err
		}
		if !localEngine() {
			return nil
		}
		p, err := network.ParsePort(port)
		if err != nil {
			return err
		}
		return testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) {
			if hc.PortBindings == nil {
				hc.PortBindings = network.PortMap{}
			}
			hc.PortBindings[p] = []network.PortBinding{{HostIP: netip.MustParseAddr("127.0.0.1"), HostPort: "0"}}
		})(req)
	}
}

// endpoint is host:port where the container's port is published.
func endpoint(ctx context.Context, c testcontainers.Container, port string) (string, error) {
	host := "127.0.0.1"
	if !localEngine() {
		h, err := c.Host(ctx)
		if err != nil {
			return "", err
		}
		host = h
	}
	if err := wait.ForMappedPort(port).WaitUntilReady(ctx, c); err != nil {
		return "", err
	}
	p, err := c.MappedPort(ctx, port)
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(host, p.Port()), nil
}

func terminate(c testcontainers.Container) {
	if c != nil {
		_ = testcontainers.TerminateContainer(c, testcontainers.StopTimeout(0))
	}
}

// startPostgresContainer starts a postgres container with the settings of
// a throwaway local cluster (postgres.go): trust authentication as the
// postgres user, UTF8 and the C.UTF-8 locale, no fsync. Its entry point
// restarts the server whenever it stops, so that Restart can stop it
// inside the container while the container, and its published port, stay.
func startPostgresContainer() (*Postgres, error) {
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	img := imageOf("TIDEMARK_TEST_POSTGRES_IMAGE", PostgresImage)
	c, err := testcontainers.Run(ctx, img,
		testcontainers.WithEnv(map[string]string{
			"POSTGRES_HOST_AUTH_METHOD": "trust",
			"POSTGRES_INITDB_ARGS":      "--encoding=UTF8 --locale=C.UTF-8 --no-sync",
		}),
		testcontainers.WithEntrypoint("sh", "-c", "while :; do docker-entrypoint.sh postgres "+serverSettings+"; sleep 0.2; done"),
		publish("5432/tcp"),
		testcontainers.WithHostConfigModifier(func(hc *container.HostConfig) { hc.ShmSize = 512 << 20 }),
		// The first start logs readiness twice: initdb's temporary
		// server, then the real one.
		testcontainers.WithWaitStrategy(wait.ForLog("database system is ready to accept connections").WithOccurrence(2).WithStartupTimeout(startTimeout)),
	)
	if err != nil {
		terminate(c)
		return nil, fmt.Errorf("%s container: %w", img, err)
	}
	addr, err := endpoint(ctx, c, "5432/tcp")
	if err != nil {
		terminate(c)
		return nil, fmt.Errorf("%s container: %w", img, err)
	}
	p := &Postgres{URL: "postgres://postgres@" + addr + "/postgres?sslmode=disable", ctr: c}
	if err := waitPostgres(ctx, p.URL); err != nil {
		terminate(c)
		return nil, fmt.Errorf("%s container: %w", img, err)
	}
	return p, nil
}

// waitPostgres polls until url accepts a connection.
func waitPostgres(ctx context.Context, url string) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		conn, err := pgx.Connect(cctx, url)
		if err == nil {
			err = conn.Ping(cctx)
			conn.Close(cctx)
		}
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("PostgreSQL at %s did not accept connections: %w", redact(url), err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// restartContainer stops the server in its container (fast shutdown: open
// connections are dropped); the entry point starts it again on the same
// data and port. It returns when the server accepts connections again.
func (p *Postgres) restartContainer(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, out, err := p.ctr.Exec(ctx, []string{"sh", "-c", `pg_ctl -D "$PGDATA" -m fast -w -t 60 stop`}, tcexec.WithUser("postgres"), tcexec.Multiplexed())
	if err != nil || code != 0 {
		var msg []byte
		if out != nil {
			msg, _ = io.ReadAll(out)
		}
		t.Fatalf("pg_ctl stop in the container: exit %d, %v: %s", code, err, msg)
	}
	if err := waitPostgres(ctx, p.URL); err != nil {
		t.Fatalf("restart: %v", err)
	}
}

// kafkaStartScript is where the entry point waits for its start script,
// which only exists once the published port, and so the advertised
// listener, is known.
const kafkaStartScript = "/tmp/tidemark-kafka-start.sh"

// kafkaContainer starts a single-node Apache Kafka in KRaft mode (broker and
// controller in one process) for one test, removed at cleanup. Clients
// reach it on the PLAINTEXT listener, published on the host.
func kafkaContainer(t testing.TB) *Kafka {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	img := imageOf("TIDEMARK_TEST_KAFKA_IMAGE", KafkaImage)
	var advertised string
	c, err := testcontainers.Run(ctx, img,
		testcontainers.WithEnv(map[string]string{
			"CLUSTER_ID":                                     "dGlkZW1hcmstdGVzdHMtMQ",
			"KAFKA_NODE_ID":                                  "1",
			"KAFKA_PROCESS_ROLES":                            "broker,controller",
			"KAFKA_LISTENERS":                                "PLAINTEXT://0.0.0.0:9092,BROKER://0.0.0.0:9093,CONTROLLER://0.0.0.0:9094",
			"KAFKA_LISTENER_SECURITY_PROTOCOL_MAP":           "PLAINTEXT:PLAINTEXT,BROKER:PLAINTEXT,CONTROLLER:PLAINTEXT",
			"KAFKA_INTER_BROKER_LISTENER_NAME":               "BROKER",
			"KAFKA_CONTROLLER_LISTENER_NAMES":                "CONTROLLER",
			"KAFKA_CONTROLLER_QUORUM_VOTERS":                 "1@localhost:9094",
			"KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR":         "1",
			"KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
			"KAFKA_TRANSACTION_STATE_LOG_MIN_ISR":            "1",
			"KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS":         "0",
		}),
		testcontainers.WithEntrypoint("sh", "-c", "while [ ! -f "+kafkaStartScript+" ]; do sleep 0.1; done; exec sh "+kafkaStartScript),
		publish("9092/tcp"),
		testcontainers.WithLifecycleHooks(testcontainers.ContainerLifecycleHooks{
			PostStarts: []testcontainers.ContainerHook{func(ctx context.Context, c testcontainers.Container) error {
				addr, err := endpoint(ctx, c, "9092/tcp")
				if err != nil {
					return err
				}
				advertised = addr
				script := fmt.Sprintf("export KAFKA_ADVERTISED_LISTENERS=PLAINTEXT://%s,BROKER://localhost:9093\nexec /etc/kafka/docker/run\n", addr)
				if err := c.CopyToContainer(ctx, []byte(script), kafkaStartScript, 0o755); err != nil {
					return err
				}
				// The line Kafka's own system tests wait for.
				return wait.ForLog(`Kafka\s*Server.*started`).AsRegexp().WithStartupTimeout(startTimeout).WaitUntilReady(ctx, c)
			}},
		}),
	)
	if c != nil {
		t.Cleanup(func() { terminate(c) })
	}
	if err != nil {
		t.Fatalf("%s container: %v", img, err)
	}
	if err := waitKafka(ctx, advertised); err != nil {
		t.Fatalf("%s container: %v", img, err)
	}
	return &Kafka{Brokers: []string{advertised}}
}

// waitKafka polls until the broker at addr answers a metadata request.
func waitKafka(ctx context.Context, addr string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr))
	if err != nil {
		return err
	}
	defer cl.Close()
	for {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := cl.Ping(pctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("Kafka at %s did not answer: %w", addr, err)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// containerError is a PostgreSQL container that did not start where no
// test is there to fail: the process ends, since the containers backend
// never skips.
func containerError(err error) {
	fmt.Fprintf(os.Stderr, "%s=%s: %v\n", BackendEnv, BackendContainers, strings.TrimSpace(err.Error()))
	os.Exit(2)
}
