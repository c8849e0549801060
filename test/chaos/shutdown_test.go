package chaos

import (
	"math/rand/v2"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

// TestGracefulShutdownMidTransaction sends SIGTERM while a long
// transaction is open in the middle of the initial pass: the process
// commits what it has published and exits 0; the next run says it resumed
// at exactly that cursor and finishes without a gap or a duplicate.
func TestGracefulShutdownMidTransaction(t *testing.T) {
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x7465726d))
	w := newWorld(t, nil)
	// Enough pages that the pass outlasts the wait before SIGTERM: 12,000
	// pages of 5 take 2 s and more here (4,000 took under 0.6 s).
	rows, rounds := 60000, 1
	if soak() {
		rows, rounds = 100000, 8
	}
	// Ties of 5 rows, 500µs apart: about 2000 rows within the 1s margin,
	// well inside the dedupe bound.
	w.db.Exec(t, `INSERT INTO items (id, updated_at, v)
		SELECT g, $1::timestamptz + (g / 5) * interval '500 microseconds', 'bulk-' || g FROM generate_series(1, $2::int) AS g`,
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rows)
	// Small pages, one long transaction: SIGTERM lands with many pages
	// published and not yet committed.
	w.sync["page_size"] = "5"
	w.sync["txn_max_records"] = "1000000"
	w.sync["txn_max_duration"] = "20s"
	cfg := w.config()
	lastOf := func(kind string) *schemas.LedgerEntry {
		var last *schemas.LedgerEntry
		for _, e := range w.ledgerEntries() {
			if e.Kind == kind {
				last = e
			}
		}
		return last
	}

	var prev *schemas.LedgerEntry // the transaction the previous SIGTERM committed
	for round := 1; round <= rounds; round++ {
		p := w.start(nil, "run", "--config", cfg)
		waitFor(t, 30*time.Second, "the run to start", func() bool {
			return strings.Contains(p.stderr.String(), `"msg":"run started"`) || !p.running()
		})
		if prev != nil {
			assertResumedAt(t, lastOf(schemas.LedgerRun), prev)
		}
		time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
		p.signal(syscall.SIGTERM)
		if code := p.wait(t, 60*time.Second); code != 0 {
			t.Fatalf("round %d: SIGTERM: exit %d, want 0; stderr tail:\n%s", round, code, tail(p.stderr.String(), 3000))
		}
		last := lastOf(schemas.LedgerTxn)
		if last == nil || last.Phase != schemas.PhasePass || last.NextCursor == "" || last.Pages < 2 || prev != nil && last.Seq != prev.Seq+1 {
			t.Fatalf("round %d: want the shutdown to commit the open transaction in the middle of the pass, ledger says %+v", round, last)
		}
		t.Logf("round %d: SIGTERM committed seq %d: %d pages, %d records, in phase %s at cursor %s", round, last.Seq, last.Pages, last.Published, last.Phase, last.NextCursor)
		prev = last
	}

	w.once("resumed run")
	assertResumedAt(t, lastOf(schemas.LedgerRun), prev)
	r := w.check("graceful shutdown")
	if r.SourceRows != rows {
		t.Errorf("source rows %d, want %d", r.SourceRows, rows)
	}
}

// assertResumedAt checks that run (a run entry of the ledger) says it
// resumed exactly where txn (the last committed transaction) ended.
func assertResumedAt(t *testing.T, run, txn *schemas.LedgerEntry) {
	t.Helper()
	if run == nil || run.Reason != schemas.ReasonResumed || run.RequestCursor != txn.NextCursor || run.Seq != txn.Seq {
		t.Fatalf("the next run must say it resumed at seq %d cursor %s, ledger says %+v", txn.Seq, txn.NextCursor, run)
	}
	t.Logf("next run: %s (%s)", run.Reason, run.Detail)
}
