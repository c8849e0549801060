package chaos

import (
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector/postgres"
)

// TestKill9AtRandomPoints runs `tidemark run` (continuous) as a subprocess
// under a mutating workload and kills it with SIGKILL at random moments
// (seeded), restarting it each time; a final clean `run --once` must leave
// all six counts at 0. The notify variant runs with change notifications
// (source.notify): passes that notifications start between full passes
// read from W (docs/design.md, "Head passes"), and one transaction in ten
// commits late, after such passes moved past its rows.
func TestKill9AtRandomPoints(t *testing.T) {
	t.Run("poll", func(t *testing.T) { kill9AtRandomPoints(t, 30, false) })
	t.Run("notify", func(t *testing.T) { kill9AtRandomPoints(t, 20, true) })
}

func kill9AtRandomPoints(t *testing.T, kills int, notify bool) {
	if soak() {
		kills *= 10
	}
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	w := newWorld(t, nil)
	m := newMutator(w, seed)
	if notify {
		// The deferred trigger: its commits that leave the notifying to
		// another are read by follow-up passes (the load test has the
		// statement-level one).
		sql, err := postgres.NotifySQL(w.db.Schema, "items", "chaos_items", postgres.NotifyDeferred)
		if err != nil {
			t.Fatal(err)
		}
		w.db.Exec(t, sql.Install)
		w.source = map[string]string{"notify": "chaos_items"}
		m.late = 10
	}
	seedRows(t, w, m, 150)
	stop := m.run(15 * time.Millisecond)
	cfg := w.config()

	began := time.Now()
	midStream, early := 0, 0
	var startups []time.Duration // spawn to "run started", per process that got there
	for i := range kills {
		p := w.start(nil, "run", "--config", cfg)
		spawned := time.Now()
		// A fifth of the kills land at a random moment from the spawn
		// (start-up: preflight, fencing, the checkpoint read and ledger
		// audit, the run-start entry); the rest at a random moment after
		// the run started, while pages and transactions flow. Timing them
		// from the start-up keeps them mid-stream as the start-up gets
		// slower with the history (see the start-up figures logged below).
		var wait <-chan time.Time
		if rng.IntN(5) == 0 {
			early++
			wait = time.After(time.Duration(rng.IntN(400)) * time.Millisecond)
		} else {
			delay := time.Duration(rng.IntN(700)) * time.Millisecond
			started := make(chan time.Time, 1)
			go func() {
				for p.running() && !strings.Contains(p.stderr.String(), `"msg":"run started"`) {
					time.Sleep(2 * time.Millisecond)
				}
				started <- time.Now()
			}()
			at := <-started
			if p.running() {
				startups = append(startups, at.Sub(spawned))
			}
			wait = time.After(delay)
		}
		select {
		case <-p.done:
			stop()
			t.Fatalf("kill %d: tidemark exited on its own with code %d before the kill; stderr tail:\n%s", i+1, p.code, tail(p.stderr.String(), 4000))
		case <-wait:
		}
		committed := strings.Contains(p.stderr.String(), `"msg":"committed"`)
		p.signal(syscall.SIGKILL)
		if code := p.wait(t, 10*time.Second); code != -1 {
			stop()
			t.Fatalf("kill %d: want death by SIGKILL, got exit code %d; stderr tail:\n%s", i+1, code, tail(p.stderr.String(), 4000))
		}
		if committed {
			midStream++
		}
	}
	stats := stop()
	w.once("final clean run")
	r := w.check("kill -9")
	if notify {
		t.Logf("%d of %d checkpoints were committed between a head pass and the next full pass", r.HeadCheckpoints, r.Checkpoints)
		if r.HeadCheckpoints == 0 {
			t.Error("no checkpoint was committed after a head pass: the notify variant did not exercise head passes")
		}
	}
	t.Logf("kill -9: %d kills survived (%d timed from the spawn, %d after the run started; %d hit a process that had committed at least one transaction) in %s; workload %s",
		kills, early, kills-early, midStream, time.Since(began).Round(time.Millisecond), stats)
	if n := len(startups); n >= 10 {
		t.Logf("start-up (spawn to run started): first 5 processes %s, last 5 %s", meanDur(startups[:5]), meanDur(startups[n-5:]))
	}
	if midStream < kills/3 {
		t.Errorf("only %d of %d kills hit a process that was committing; the kills must land mid-stream", midStream, kills)
	}
}

func meanDur(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return (sum / time.Duration(len(ds))).Round(time.Millisecond)
}
