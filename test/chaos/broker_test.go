package chaos

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kbin"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/kversion"

	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/test/harness"
)

// brokerScenario runs the in-process engine continuously under the
// mutating workload while inject injects faults; inject returns the number
// of faults that hit, and calls settle between faults so that they spread
// over the run (settle waits for two more commits, at most 5s). Then the workload stops, the engine is stopped (it
// must not have given up), a fresh engine runs once, and the six counts
// must be 0.
func brokerScenario(t *testing.T, w *world, opts []kgo.Opt, inject func(ctx context.Context, settle func()) int) {
	t.Helper()
	seed := seedFor(t)
	w.ensureTopics(w.opts)
	m := newMutator(w, seed)
	seedRows(t, w, m, 120)
	stopMut := m.run(10 * time.Millisecond)
	var obs counter
	stopEngine, engineDone := runEngine(w.engine(opts, &obs))

	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-engineDone; cancel() }() // stop injecting if the engine gives up
	settle := func() {
		from := obs.commits.Load()
		waitUntil(ctx, 5*time.Second, func() bool { return obs.commits.Load() >= from+2 })
	}
	settle()
	faults := inject(ctx, settle)
	cancel()
	time.Sleep(300 * time.Millisecond) // a few clean transactions after the last fault
	stats := stopMut()
	if err := stopEngine(); err != nil {
		t.Fatalf("the engine stopped with an error instead of retrying: %v (%s)", err, &obs)
	}
	w.finalOnce()
	w.check(t.Name())
	t.Logf("%s: %d faults injected and survived; engine: %s; workload %s", t.Name(), faults, &obs, stats)
	if faults == 0 {
		t.Errorf("no fault hit: the scenario proves nothing")
	}
}

// every installs one fault with fn, waits for it to hit, and settles, until
// n faults hit, the context ends, or the time budget runs out.
func every(ctx context.Context, settle func(), n int, budget time.Duration, fn func(i int) *kfake.FaultHandle) int {
	deadline := time.Now().Add(budget)
	hits := 0
	for i := 0; hits < n && time.Now().Before(deadline) && ctx.Err() == nil; i++ {
		h := fn(i)
		wctx, cancel := context.WithTimeout(ctx, max(time.Until(deadline), time.Millisecond))
		_ = h.Wait(wctx, 1)
		cancel()
		h.Remove()
		hits += h.Hits()
		settle()
	}
	return hits
}

func faultCount() int {
	if soak() {
		return 40
	}
	return 6
}

func TestBrokerFaults(t *testing.T) {
	needPG(t)
	harness.SkipUnlessKfake(t, "broker fault injection (kfake Fault, ControlKey/SleepControl, ListenFn, DataDir+Ports restarts)")
	txnID := producer.TransactionalID("chaos")

	t.Run("produce errors", func(t *testing.T) {
		w := newWorld(t, nil)
		brokerScenario(t, w, nil, func(ctx context.Context, settle func()) int {
			// A non-retriable code fails the record, so the engine aborts
			// and resumes; a retriable one is retried inside the client;
			// REQUEST_TIMED_OUT and NOT_ENOUGH_REPLICAS_AFTER_APPEND are
			// answered after the broker appended the batch, so the client's
			// retry must be deduplicated by its sequence number.
			// (NOT_LEADER_FOR_PARTITION and NOT_ENOUGH_REPLICAS are left out: the
			// client retries them after a metadata refresh, 5s by default.)
			codes := []*kerr.Error{kerr.UnknownServerError, kerr.RequestTimedOut, kerr.CorruptMessage, kerr.NotEnoughReplicasAfterAppend}
			return every(ctx, settle, faultCount(), 20*time.Second, func(i int) *kfake.FaultHandle {
				return w.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: codes[i%len(codes)]})
			})
		})
	})

	t.Run("AddPartitionsToTxn errors", func(t *testing.T) {
		w := newWorld(t, nil)
		// Below Produce v12 / EndTxn v5 (KIP-890 part 2) the client adds
		// partitions to the transaction with AddPartitionsToTxn.
		vs := kversion.Stable()
		vs.SetMaxKeyVersion(int16(kmsg.Produce), 11)
		vs.SetMaxKeyVersion(int16(kmsg.EndTxn), 4)
		opts := append(append([]kgo.Opt{}, w.opts...), kgo.MaxVersions(vs))
		var seen atomic.Int64
		w.kafka.ControlKey(int16(kmsg.AddPartitionsToTxn), func(kmsg.Request) (kmsg.Response, error, bool) {
			w.kafka.KeepControl()
			seen.Add(1)
			return nil, nil, false
		})
		brokerScenario(t, w, opts, func(ctx context.Context, settle func()) int {
			codes := []*kerr.Error{kerr.NotCoordinator, kerr.CoordinatorNotAvailable, kerr.ConcurrentTransactions, kerr.UnknownServerError}
			return every(ctx, settle, faultCount(), 20*time.Second, func(i int) *kfake.FaultHandle {
				return w.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.AddPartitionsToTxn}, TxnID: txnID, Err: codes[i%len(codes)]})
			})
		})
		t.Logf("AddPartitionsToTxn requests seen: %d", seen.Load())
	})

	t.Run("EndTxn errors", func(t *testing.T) {
		w := newWorld(t, nil)
		brokerScenario(t, w, nil, func(ctx context.Context, settle func()) int {
			codes := []*kerr.Error{kerr.NotCoordinator, kerr.CoordinatorNotAvailable, kerr.ConcurrentTransactions, kerr.UnknownServerError, kerr.RequestTimedOut}
			return every(ctx, settle, faultCount(), 20*time.Second, func(i int) *kfake.FaultHandle {
				return w.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, TxnID: txnID, Err: codes[i%len(codes)]})
			})
		})
	})

	// The client retries a lost EndTxn response on a new connection (the
	// broker answers the retry from its state); with request retries off,
	// the error reaches the engine, whose commit is then uncertain: it must
	// reset the session and resume from the checkpoint the broker did commit.
	for _, variant := range []struct {
		name    string
		retries bool
	}{{"commit applied, response lost", true}, {"commit applied, response lost, client does not retry", false}} {
		t.Run(variant.name, func(t *testing.T) {
			var lossy lossyListener
			w := newWorld(t, nil, kfake.ListenFn(lossy.listen))
			var opts []kgo.Opt
			if !variant.retries {
				opts = append(append(opts, w.opts...), kgo.RequestRetries(0))
			}
			brokerScenario(t, w, opts, func(ctx context.Context, settle func()) int {
				n := faultCount()
				for i := 0; int(lossy.dropped.Load()) < n && ctx.Err() == nil && i < 200; i++ {
					lossy.armed.Store(1)
					waitUntil(ctx, 10*time.Second, func() bool { return lossy.armed.Load() == 0 })
					settle()
				}
				lossy.armed.Store(0)
				return int(lossy.dropped.Load())
			})
		})
	}

	t.Run("EndTxn delayed", func(t *testing.T) {
		w := newWorld(t, nil)
		var delayed atomic.Int64
		var want atomic.Int64
		w.kafka.ControlKey(int16(kmsg.EndTxn), func(req kmsg.Request) (kmsg.Response, error, bool) {
			w.kafka.KeepControl()
			if r := req.(*kmsg.EndTxnRequest); r.Commit && want.Load() > 0 {
				want.Add(-1)
				w.kafka.SleepControl(func() { time.Sleep(time.Second) })
				delayed.Add(1)
			}
			return nil, nil, false // then the broker answers normally
		})
		brokerScenario(t, w, nil, func(ctx context.Context, settle func()) int {
			n := int64(slowFaults())
			want.Store(n)
			waitUntil(ctx, 30*time.Second, func() bool { return delayed.Load() >= n })
			return int(delayed.Load())
		})
	})

	t.Run("broker restart with persistence", func(t *testing.T) {
		dir := t.TempDir()
		port := freePort(t)
		w := newWorld(t, nil, kfake.DataDir(dir), kfake.Ports(port))
		brokerScenario(t, w, nil, func(ctx context.Context, settle func()) int {
			restarts := 0
			for range slowFaults() {
				settle()
				if ctx.Err() != nil {
					return restarts
				}
				w.kafka.Close()
				time.Sleep(200 * time.Millisecond) // the broker is down
				w.startKafka(kfake.DataDir(dir), kfake.Ports(port))
				restarts++
			}
			settle()
			return restarts
		})
	})
}

func waitUntil(ctx context.Context, timeout time.Duration, cond func() bool) {
	deadline := time.Now().Add(timeout)
	for !cond() && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(5 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// lossyListener wraps kfake's listener. Each connection reads the request
// stream to learn which correlation ids are EndTxn commits; when armed, the
// connection is closed instead of writing the response to one: the broker
// has applied the commit, the client never hears of it.
type lossyListener struct {
	armed   atomic.Int32
	dropped atomic.Int32
}

func (l *lossyListener) listen(network, address string) (net.Listener, error) {
	ln, err := net.Listen(network, address)
	if err != nil {
		return nil, err
	}
	return &lossyLn{Listener: ln, l: l}, nil
}

type lossyLn struct {
	net.Listener
	l *lossyListener
}

func (ln *lossyLn) Accept() (net.Conn, error) {
	c, err := ln.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &lossyConn{Conn: c, l: ln.l, commits: map[int32]bool{}}, nil
}

type lossyConn struct {
	net.Conn
	l       *lossyListener
	mu      sync.Mutex
	in      []byte         // the request stream not yet framed
	commits map[int32]bool // correlation ids of EndTxn commit requests
}

func (c *lossyConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mu.Lock()
		c.in = append(c.in, p[:n]...)
		c.frames()
		c.mu.Unlock()
	}
	return n, err
}

// frames consumes the complete request frames in c.in.
func (c *lossyConn) frames() {
	for len(c.in) >= 4 {
		size := int(binary.BigEndian.Uint32(c.in))
		if len(c.in) < 4+size {
			return
		}
		frame := c.in[4 : 4+size]
		r := kbin.Reader{Src: frame}
		key, version, corr := r.Int16(), r.Int16(), r.Int32()
		r.NullableString() // client id
		if key == int16(kmsg.EndTxn) {
			req := kmsg.NewPtrEndTxnRequest()
			req.SetVersion(version)
			if req.IsFlexible() {
				kmsg.SkipTags(&r)
			}
			if err := req.ReadFrom(r.Src); err == nil && req.Commit {
				c.commits[corr] = true
			}
		}
		c.in = c.in[4+size:]
	}
}

func (c *lossyConn) Write(p []byte) (int, error) {
	if len(p) >= 8 {
		corr := int32(binary.BigEndian.Uint32(p[4:8]))
		c.mu.Lock()
		commit := c.commits[corr]
		delete(c.commits, corr)
		c.mu.Unlock()
		if commit && c.l.armed.CompareAndSwap(1, 0) {
			c.l.dropped.Add(1)
			c.Conn.Close()
			return 0, fmt.Errorf("response to EndTxn (commit) dropped by the test")
		}
	}
	return c.Conn.Write(p)
}

// slowFaults is the count of faults that take a second or more each
// (delayed EndTxn, broker restarts).
func slowFaults() int {
	if soak() {
		return 10
	}
	return 3
}
