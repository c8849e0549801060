package chaos

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/failpoint"
)

// TestCrashAtEveryStepBoundary crashes the binary at each named step
// boundary on its 1st, 2nd and 5th hit, twice per case (once on a fresh
// connector, once resuming from a checkpoint), with mutations in between;
// a clean `run --once` must then leave all six counts at 0.
func TestCrashAtEveryStepBoundary(t *testing.T) {
	needPG(t)
	seed := seedFor(t)
	points := []string{failpoint.AfterFetch, failpoint.AfterProduce, failpoint.DuringCommit, failpoint.AfterCommit}
	hits := []int{1, 2, 5}
	if soak() {
		hits = []int{1, 2, 3, 5, 8, 13}
	}
	// Enough rows (and mutations between rounds) for the last hit: a
	// transaction holds 6 records.
	maxHit := hits[len(hits)-1]
	seedN, steps := max(40, 15*maxHit), max(30, 8*maxHit)
	var crashes atomic.Int64
	for _, point := range points {
		for _, hit := range hits {
			t.Run(fmt.Sprintf("%s=%d", point, hit), func(t *testing.T) {
				t.Parallel()
				w := newWorld(t, nil)
				w.sync["page_size"] = "3"
				w.sync["txn_max_records"] = "6"
				m := newMutator(w, seed+uint64(hit))
				seedRows(t, w, m, seedN)
				cfg := w.config()
				spec := fmt.Sprintf("TIDEMARK_FAILPOINTS=%s=%d", point, hit)
				for round := 1; round <= 2; round++ {
					code, p := w.run(60*time.Second, []string{spec}, "run", "--config", cfg, "--once")
					if code != failpoint.ExitCode {
						t.Fatalf("round %d: want exit %d from the failpoint, got %d; stderr tail:\n%s", round, failpoint.ExitCode, code, tail(p.stderr.String(), 3000))
					}
					if !strings.Contains(p.stderr.String(), "failpoint "+point) {
						t.Fatalf("round %d: exit %d without the failpoint message; stderr tail:\n%s", round, code, tail(p.stderr.String(), 3000))
					}
					crashes.Add(1)
					for range 8 {
						if err := m.step(context.Background()); err != nil {
							t.Fatalf("mutate: %v", err)
						}
					}
					if round == 1 {
						// Move the checkpoint forward so that round 2 crashes
						// a resumed run, not a fresh one.
						w.once("after round 1")
						for range steps {
							if err := m.step(context.Background()); err != nil {
								t.Fatalf("mutate: %v", err)
							}
						}
					}
				}
				w.once("clean rerun")
				w.check(fmt.Sprintf("crash at %s hit %d", point, hit))
			})
		}
	}
	t.Cleanup(func() {
		t.Logf("step boundaries: %d crashes at failpoints (%d points x %d hits x 2 rounds), each followed by a clean run", crashes.Load(), len(points), len(hits))
	})
}
