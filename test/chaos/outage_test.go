package chaos

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/test/harness"
)

// outage is how long the outages of these tests last: short in make test,
// the full times of the issue in make soak.
func outage(short, long time.Duration) time.Duration {
	if soak() {
		return long
	}
	return short
}

// readyz returns the status of the process's /readyz (0 when it does not
// answer).
func readyz(addr string) int {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return 0
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// outageRun starts `tidemark run` (continuous, metrics on addr) under the
// mutating workload, lets it commit and become ready, calls down, checks
// that the process keeps running and /readyz says 503 for the outage's
// length, calls up, and checks that it commits again and /readyz says 200.
// Then the workload stops, SIGTERM ends the process with 0, and a clean run
// --once leaves the six counts at 0.
func outageRun(t *testing.T, w *world, length time.Duration, startDown bool, down, up func()) {
	t.Helper()
	seed := seedFor(t)
	m := newMutator(w, seed)
	seedRows(t, w, m, 100)
	stopMut := m.run(20 * time.Millisecond)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	w.extra = "metrics:\n  listen: " + addr + "\n"
	if startDown {
		down()
	}
	p := w.start(nil, "run", "--config", w.config())
	commits := func() int { return strings.Count(p.stderr.String(), `"msg":"committed"`) }
	if !startDown {
		waitFor(t, 60*time.Second, "the first commits and /readyz 200", func() bool { return commits() >= 3 && readyz(addr) == 200 })
		down()
	}
	began := time.Now()
	saw503 := false
	for time.Since(began) < length {
		if !p.running() {
			stopMut()
			t.Fatalf("tidemark exited %d during the outage; stderr tail:\n%s", p.code, tail(p.stderr.String(), 3000))
		}
		if readyz(addr) == 503 {
			saw503 = true
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !saw503 {
		t.Errorf("/readyz never said 503 during a %s outage", length)
	}
	before := commits()
	up()
	upAt := time.Now()
	deadline := time.Now().Add(3 * time.Minute)
	for !(commits() > before && readyz(addr) == 200) {
		if time.Now().After(deadline) || !p.running() {
			stopMut()
			t.Fatalf("no commit and /readyz 200 within 3 minutes after the outage (%d commits before it, %d now, /readyz %d, running %v); stderr tail:\n%s",
				before, commits(), readyz(addr), p.running(), tail(p.stderr.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("outage of %s survived; ready again %s after it ended; %d commits in all", length, time.Since(upAt).Round(time.Millisecond), commits())
	stats := stopMut()
	p.signal(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("SIGTERM after the outage: exit %d; stderr tail:\n%s", code, tail(p.stderr.String(), 3000))
	}
	w.once("after the outage")
	w.check(fmt.Sprintf("outage of %s (%s)", length, stats))
}

// TestDatabaseOutage: PostgreSQL stops for 40 s (5 min in soak) in the
// middle of a continuous run under mutation, then starts again. (Retries
// bounded by a count gave up after about 25 s.)
func TestDatabaseOutage(t *testing.T) {
	p := harness.StartPostgres(t)
	w := newWorld(t, p)
	outageRun(t, w, outage(40*time.Second, 5*time.Minute), false, func() { p.StopServer(t) }, func() { p.StartServer(t) })
}

// TestStartWhileDatabaseDown: the process starts while PostgreSQL is down
// and waits for it (15 s; 60 s in soak) instead of exiting.
func TestStartWhileDatabaseDown(t *testing.T) {
	p := harness.StartPostgres(t)
	w := newWorld(t, p)
	outageRun(t, w, outage(15*time.Second, time.Minute), true, func() { p.StopServer(t) }, func() { p.StartServer(t) })
}

// TestBrokerOutage: the broker (kfake, persisted) stops for 40 s (2 min in
// soak) in the middle of a continuous run, then starts again on the same
// port with its data.
func TestBrokerOutage(t *testing.T) {
	harness.SkipUnlessKfake(t, "stopping and restarting the broker with its data")
	dir := t.TempDir()
	port := freePort(t)
	w := newWorld(t, nil, kfake.DataDir(dir), kfake.Ports(port))
	outageRun(t, w, outage(40*time.Second, 2*time.Minute), false,
		func() { w.kafka.Close() },
		func() { w.startKafka(kfake.DataDir(dir), kfake.Ports(port)) })
}

// TestBrokerDiesMidTransaction: the broker (kfake, persisted) stops while a
// transaction of the connector has produced records and not ended (a
// transactional produce arrives; the broker closes 30 ms later), and starts
// again on its port with its data 5 s later. The connector must commit
// again within a minute, and lose and duplicate nothing.
func TestBrokerDiesMidTransaction(t *testing.T) {
	harness.SkipUnlessKfake(t, "stopping the broker from inside a request")
	dir := t.TempDir()
	port := freePort(t)
	w := newWorld(t, nil, kfake.DataDir(dir), kfake.Ports(port))
	seed := seedFor(t)
	m := newMutator(w, seed)
	seedRows(t, w, m, 100)
	stopMut := m.run(20 * time.Millisecond)
	p := w.start(nil, "run", "--config", w.config())
	commits := func() int { return strings.Count(p.stderr.String(), `"msg":"committed"`) }
	waitFor(t, 60*time.Second, "the first commits", func() bool { return commits() >= 3 })
	closed := make(chan struct{})
	var once sync.Once
	cluster := w.kafka
	cluster.ControlKey(int16(kmsg.Produce), func(r kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		if r.(*kmsg.ProduceRequest).TransactionID != nil {
			once.Do(func() {
				go func() {
					time.Sleep(30 * time.Millisecond)
					cluster.Close()
					close(closed)
				}()
			})
		}
		return nil, nil, false
	})
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("no transactional produce reached the broker in 30 s")
	}
	before := commits()
	time.Sleep(5 * time.Second)
	w.startKafka(kfake.DataDir(dir), kfake.Ports(port))
	deadline := time.Now().Add(time.Minute)
	for commits() <= before {
		if time.Now().After(deadline) || !p.running() {
			stopMut()
			t.Fatalf("no commit within a minute after the broker came back (%d commits before, running %v); stderr tail:\n%s", before, p.running(), tail(p.stderr.String(), 4000))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stats := stopMut()
	p.signal(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("SIGTERM after the restart: exit %d; stderr tail:\n%s", code, tail(p.stderr.String(), 3000))
	}
	w.once("after the broker died mid-transaction")
	w.check(fmt.Sprintf("broker died mid-transaction (%s)", stats))
}
