package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector/postgres"
)

// TestKeyLoadKilledAtRandomPoints: an initial load in id order read by
// three sessions side by side (sync.load_workers: 3), moving and
// consistent (one exported snapshot shared by the sessions), of 4,000 rows
// under a mutating workload, with change notifications on
// (source.notify), is killed with SIGKILL at four random points and
// finished by a clean run. A restart resumes the open load with every id
// range at its committed cursor (never from scratch), and all six counts
// are 0.
func TestKeyLoadKilledAtRandomPoints(t *testing.T) {
	for _, mode := range []string{"moving", "consistent"} {
		t.Run(mode, func(t *testing.T) {
			seed := seedFor(t)
			rng := rand.New(rand.NewPCG(seed, 0x6b657973))
			w := newWorld(t, nil)
			sql, err := postgres.NotifySQL(w.db.Schema, "items", "chaos_items", postgres.NotifyStatement)
			if err != nil {
				t.Fatal(err)
			}
			w.db.Exec(t, sql.Install)
			w.source = map[string]string{"initial_load": mode, "notify": "chaos_items"}
			w.sync["load_workers"] = "3"
			w.sync["page_size"] = "50"
			w.sync["txn_max_records"] = "200"
			m := newMutator(w, seed)
			seedRows(t, w, m, 4000)
			stop := m.run(20 * time.Millisecond)
			resumed := 0
			for range 4 {
				w.killAfterCommits(t, rng, 6)
				if strings.Contains(w.lastLedgerRunDetail(t), "phase load") {
					resumed++
				}
			}
			stats := stop()
			if strings.Contains(w.lastLedgerRunDetail(t), "phase load") {
				resumed++
			}
			w.once("finish the load")
			if mode == "consistent" {
				w.once("catch up after the consistent load") // its --once stops at the snapshot
			}
			r := w.check(fmt.Sprintf("%s load in id order with 3 workers killed 4 times (%s)", mode, stats))
			if resumed == 0 {
				t.Errorf("no restart resumed an open load (the runs said: %s)", w.lastLedgerRunDetail(t))
			}
			if r.Records > 4000+stats.Inserts+stats.Updates+stats.TieRows+stats.SoftDeletes+stats.Undeletes {
				t.Errorf("%d records for 4,000 rows and %s: the load started over", r.Records, stats)
			}
			t.Logf("%d of 5 starts resumed an open load", resumed)
		})
	}
}
