package chaos

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

// TestZombieSecondInstance starts a second instance with the same
// connector name while the first one runs under the workload: the first is
// fenced and exits 4, the second keeps writing, and no transaction of the
// first is committed after the second started; the six counts end at 0.
func TestZombieSecondInstance(t *testing.T) {
	rounds := 1
	if soak() {
		rounds = 5
	}
	seed := seedFor(t)
	w := newWorld(t, nil)
	m := newMutator(w, seed)
	seedRows(t, w, m, 100)
	stop := m.run(15 * time.Millisecond)
	defer stop()
	cfg := w.config()
	commits := func(p *proc) int { return strings.Count(p.stderr.String(), `"msg":"committed"`) }

	first := w.start(nil, "run", "--config", cfg)
	waitFor(t, 30*time.Second, "the first instance to commit", func() bool { return commits(first) > 0 || !first.running() })
	for round := 1; round <= rounds; round++ {
		second := w.start(nil, "run", "--config", cfg)
		code := first.wait(t, 30*time.Second)
		if code != 4 {
			t.Fatalf("round %d: the fenced instance exited %d, want 4; stderr tail:\n%s", round, code, tail(first.stderr.String(), 3000))
		}
		if !strings.Contains(first.stderr.String(), "fenced") {
			t.Errorf("round %d: the fenced instance does not say it was fenced; stderr tail:\n%s", round, tail(first.stderr.String(), 2000))
		}
		// The survivor keeps writing.
		from := commits(second)
		waitFor(t, 30*time.Second, "the second instance to keep committing", func() bool { return commits(second) >= from+3 || !second.running() })
		if !second.running() {
			t.Fatalf("round %d: the surviving instance exited %d; stderr tail:\n%s", round, second.code, tail(second.stderr.String(), 3000))
		}
		t.Logf("round %d: first instance fenced (exit 4) after %d commits; second instance committed %d more after it", round, commits(first), commits(second)-from)
		first = second
	}
	stats := stop()
	first.signal(syscall.SIGTERM)
	if code := first.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d, want 0; stderr tail:\n%s", code, tail(first.stderr.String(), 3000))
	}

	// Exactly one writer at a time: once a run has started, no earlier
	// run commits again.
	entries := w.ledgerEntries()
	started := map[string]int{} // run id -> index of its run entry
	latest := ""
	for i, e := range entries {
		switch e.Kind {
		case schemas.LedgerRun:
			started[e.RunID] = i
			latest = e.RunID
		case schemas.LedgerTxn:
			if e.RunID != latest {
				t.Errorf("ledger entry %d: run %s committed seq %d after run %s had started", i, e.RunID, e.Seq, latest)
			}
		}
	}
	if len(started) != rounds+1 {
		t.Errorf("ledger shows %d runs, want %d", len(started), rounds+1)
	}
	w.once("final clean run")
	w.check("zombie")
	t.Logf("zombie: %d instances fenced (exit 4), %d runs in the ledger, every transaction committed by the newest run; workload %s", rounds, len(started), stats)
}
