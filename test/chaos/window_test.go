package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"
)

// killAfterCommits starts `tidemark run` and kills it with SIGKILL once it
// has logged n commits (a random n in [1, max]), or once it has committed
// the end of a pass (phase idle), or when it has been running for two
// seconds without a commit (the work was done by an earlier run; every
// pass since skips what it re-reads): the kill then lands between passes.
func (w *world) killAfterCommits(t *testing.T, rng *rand.Rand, max int, args ...string) {
	t.Helper()
	p := w.start(nil, append([]string{"run", "--config", w.config()}, args...)...)
	want := 1 + rng.IntN(max)
	deadline := time.Now().Add(60 * time.Second)
	commits, since := 0, time.Now()
	for {
		out := p.stderr.String()
		if n := strings.Count(out, `"msg":"committed"`); n != commits {
			commits, since = n, time.Now()
		}
		if commits >= want || strings.Contains(out, `"phase":"idle"`) {
			break
		}
		if strings.Contains(out, `"msg":"run started"`) && time.Since(since) > 2*time.Second {
			break
		}
		if !p.running() {
			t.Fatalf("tidemark exited %d before the kill; stderr tail:\n%s", p.code, tail(p.stderr.String(), 4000))
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %d commits within 60s; stderr tail:\n%s", want, tail(p.stderr.String(), 4000))
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
	p.signal(syscall.SIGKILL)
	if code := p.wait(t, 10*time.Second); code != -1 {
		t.Fatalf("want death by SIGKILL, got exit code %d; stderr tail:\n%s", code, tail(p.stderr.String(), 4000))
	}
}

// holdWriter keeps a transaction with a transaction id open on another
// connection until the returned func is called: no pass can then prove any
// later write settled, so the dedupe set alone must carry every re-read.
func holdWriter(t *testing.T, w *world) func() {
	t.Helper()
	ctx := context.Background()
	conn, err := w.db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT txid_current()`); err != nil {
		t.Fatal(err)
	}
	return func() { _ = tx.Rollback(ctx); conn.Release() }
}

// TestTieGroupAcrossKills: a one-statement bulk update gives 3,000 rows one
// updated_at (30 pages, 12 transactions) while a writer is held open, so
// every re-read must be skipped by the dedupe set, which lives in segments
// of the offsets topic. The run is killed with SIGKILL three times mid-way
// through the group and restarted; then two clean runs. All six counts are
// 0: no row version was published twice.
func TestTieGroupAcrossKills(t *testing.T) {
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x74696573))
	w := newWorld(t, nil)
	w.sync["page_size"] = "100"
	w.sync["txn_max_records"] = "250"
	w.sync["margin"] = "10s"
	w.db.Exec(t, `INSERT INTO items (id, updated_at, v) SELECT g, now() - interval '1 hour' + g * interval '1 ms', 'v' || g FROM generate_series(1, 3000) g`)
	w.once("initial load")
	release := holdWriter(t, w)
	defer release()
	w.db.Exec(t, `UPDATE items SET v = v || '-bulk', n = n + 1, updated_at = now()`)
	for range 3 {
		w.killAfterCommits(t, rng, 4)
	}
	w.once("clean run 1")
	w.once("clean run 2")
	r := w.check("tie group across kills")
	if r.Records != 6000 {
		t.Errorf("%d records in the topic, want 6000 (3,000 loaded, 3,000 bulk-updated, none twice)", r.Records)
	}
}

// TestConsistentLoadKilledAtRandomPoints: a consistent initial load of
// 3,000 rows under a mutating workload is killed with SIGKILL at three
// random points and finished by a clean run. Each restart resumes at the
// committed cursor under a new snapshot (never from scratch), and all six
// counts are 0.
func TestConsistentLoadKilledAtRandomPoints(t *testing.T) {
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x636f6e73))
	w := newWorld(t, nil)
	w.source = map[string]string{"initial_load": "consistent"}
	// 60 transactions of 50 rows: the kills come after at most 6 commits
	// each as seen by this test, and a test starved of CPU (the race
	// detector, the other packages) sees them late; a load of 30
	// transactions once finished before the second kill (CI, 2026-12-01).
	w.sync["page_size"] = "25"
	w.sync["txn_max_records"] = "50"
	m := newMutator(w, seed)
	seedRows(t, w, m, 3000)
	stop := m.run(20 * time.Millisecond)
	for i := range 3 {
		w.killAfterCommits(t, rng, 6)
		if i > 0 && !strings.Contains(w.lastLedgerRunDetail(t), "phase snapshot") {
			t.Errorf("restart %d did not resume an open consistent load: %s", i, w.lastLedgerRunDetail(t))
		}
	}
	stats := stop()
	w.once("finish the load")
	r := w.check(fmt.Sprintf("consistent load killed 3 times (%s)", stats))
	if r.Records > 3000+stats.Inserts+stats.Updates+stats.TieRows+stats.SoftDeletes+stats.Undeletes {
		t.Errorf("%d records for 3,000 rows and %s: the load started over", r.Records, stats)
	}
}

// lastLedgerRunDetail is where the latest run said it resumed from.
func (w *world) lastLedgerRunDetail(t *testing.T) string {
	t.Helper()
	detail := ""
	for _, e := range w.ledgerEntries() {
		if e.Kind == "run" {
			detail = e.Detail
		}
	}
	return detail
}
