package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
)

// The in-process rig: the engine, the PostgreSQL source, the transactional
// producer and the fail-closed checkpoint store wired as cmd/tidemark wires
// them, so that a test can reach into kfake while the engine runs.

// ensureTopics creates the three topics as the binary would.
func (w *world) ensureTopics(opts []kgo.Opt) {
	w.t.Helper()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := producer.EnsureTopics(ctx, cl, producer.Topics{Data: w.topic, Partitions: 3, ReplicationFactor: -1, Offsets: w.offsets, Ledger: w.ledger}); err != nil {
		w.t.Fatalf("ensure topics: %v", err)
	}
}

// counter is an Observer that counts what the engine reports.
type counter struct {
	commits, aborts, stops atomic.Int64
	retries                [4]atomic.Int64 // source, kafka, checkpoint, other
}

var retryReasons = [4]string{"source", "kafka", "checkpoint", "other"}

func (c *counter) ObservePage(time.Duration, int)     {}
func (c *counter) ObserveCommit(connector.CommitInfo) { c.commits.Add(1) }
func (c *counter) ObserveAbort()                      { c.aborts.Add(1) }
func (c *counter) ObserveStop(string)                 { c.stops.Add(1) }
func (c *counter) ObserveSweep(connector.SweepResult) {}
func (c *counter) ObserveRetry(reason string) {
	for i, r := range retryReasons {
		if r == reason || i == len(retryReasons)-1 {
			c.retries[i].Add(1)
			return
		}
	}
}

func (c *counter) String() string {
	var parts []string
	for i, r := range retryReasons {
		if n := c.retries[i].Load(); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", r, n))
		}
	}
	return fmt.Sprintf("%d commits, %d aborts, retries by stage: [%s]", c.commits.Load(), c.aborts.Load(), strings.Join(parts, ", "))
}

// engine builds an engine over a fresh PostgreSQL source and producer
// session (which fences any earlier session of the connector). opts are the
// producer's Kafka options (nil = w.opts).
func (w *world) engine(opts []kgo.Opt, obs connector.Observer) *connector.Engine {
	w.t.Helper()
	if opts == nil {
		opts = w.opts
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	src, err := postgres.New(ctx, w.src)
	if err != nil {
		w.t.Fatalf("postgres.New: %v", err)
	}
	w.t.Cleanup(src.Close)
	pw, err := producer.New(ctx, producer.Config{Name: w.name, Topic: w.topic, OffsetsTopic: w.offsets, LedgerTopic: w.ledger,
		TransactionTimeout: 30 * time.Second, Opts: opts, Logger: quietLogger(w.t)})
	if err != nil {
		w.t.Fatalf("producer.New: %v", err)
	}
	w.t.Cleanup(pw.Close)
	store := offsets.NewStore(w.opts, w.offsets, w.name).FailClosed(offsets.NewLedger(w.opts, w.ledger, w.name), w.topic)
	cfg := connector.Config{
		Name: w.name, PageSize: 10, Margin: time.Second, PollInterval: 50 * time.Millisecond,
		TxnMaxRecords: 30, TxnMaxDuration: time.Second,
		Fingerprint: "chaos-rig", FingerprintFields: map[string]string{"source.table": "items"},
		Logger: quietLogger(w.t), Observer: obs,
	}
	if w.tune != nil {
		w.tune(&cfg)
	}
	e, err := connector.New(cfg, src, pw, store)
	if err != nil {
		w.t.Fatalf("connector.New: %v", err)
	}
	return e
}

// runEngine runs e continuously until stop is called; stop returns Run's
// error.
func runEngine(e *connector.Engine) (stop func() error, done <-chan struct{}) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var err error
	go func() {
		defer close(ch)
		_, err = e.Run(ctx, connector.Continuous)
	}()
	return func() error {
		cancel()
		select {
		case <-ch:
		case <-time.After(3 * time.Minute):
			return errors.New("the engine did not stop within 3 minutes of cancellation")
		}
		return err
	}, ch
}

// finalOnce runs a fresh engine once to the end of the table.
func (w *world) finalOnce() {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := w.engine(nil, nil).Run(ctx, connector.Once); err != nil {
		w.t.Fatalf("final run --once: %v", err)
	}
}

// quietLogger logs warnings and errors of the engine into the test log,
// which `go test` prints only for failing tests or with -v.
func quietLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
