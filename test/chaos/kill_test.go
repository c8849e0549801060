package chaos

import (
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestKill9AtRandomPoints runs `tidemark run` (continuous) as a subprocess
// under a mutating workload and kills it with SIGKILL at random moments
// (seeded), restarting it each time; a final clean `run --once` must leave
// all six counts at 0.
func TestKill9AtRandomPoints(t *testing.T) {
	kills := 30
	if soak() {
		kills = 300
	}
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x6b696c6c))
	w := newWorld(t, nil)
	m := newMutator(w, seed)
	seedRows(t, w, m, 150)
	stop := m.run(15 * time.Millisecond)
	cfg := w.config()

	began := time.Now()
	midStream := 0
	var sumDelay time.Duration
	for i := range kills {
		// A fifth of the kills land early (start-up: preflight, fencing,
		// the checkpoint read, the run-start ledger entry), the rest while
		// pages and transactions flow.
		delay := time.Duration(rng.IntN(150)) * time.Millisecond
		if rng.IntN(5) != 0 {
			delay = 150*time.Millisecond + time.Duration(rng.IntN(850))*time.Millisecond
		}
		sumDelay += delay
		p := w.start(nil, "run", "--config", cfg)
		select {
		case <-p.done:
			stop()
			t.Fatalf("kill %d: tidemark exited on its own with code %d before the kill; stderr tail:\n%s", i+1, p.code, tail(p.stderr.String(), 4000))
		case <-time.After(delay):
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
	t.Logf("kill -9: %d kills survived (%d of them after the process had committed at least one transaction; mean delay %s) in %s; workload %s",
		kills, midStream, (sumDelay / time.Duration(kills)).Round(time.Millisecond), time.Since(began).Round(time.Millisecond), stats)
	if midStream < kills/3 {
		t.Errorf("only %d of %d kills hit a process that was committing; the kills must land mid-stream", midStream, kills)
	}
	_ = r
}
