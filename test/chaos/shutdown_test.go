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
	const rows = 20000
	w.db.Exec(t, `INSERT INTO items (id, updated_at, v)
		SELECT g, $1::timestamptz + (g / 5) * interval '1 microsecond', 'bulk-' || g FROM generate_series(1, $2::int) AS g`,
		time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rows)
	// Small pages, one long transaction: SIGTERM lands with many pages
	// published and not yet committed.
	w.sync["page_size"] = "5"
	w.sync["txn_max_records"] = "1000000"
	w.sync["txn_max_duration"] = "20s"
	cfg := w.config()

	p := w.start(nil, "run", "--config", cfg)
	waitFor(t, 30*time.Second, "the run to start", func() bool {
		return strings.Contains(p.stderr.String(), `"msg":"run started"`) || !p.running()
	})
	time.Sleep(time.Duration(200+rng.IntN(400)) * time.Millisecond)
	p.signal(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("SIGTERM: exit %d, want 0; stderr tail:\n%s", code, tail(p.stderr.String(), 3000))
	}

	var last *schemas.LedgerEntry
	for _, e := range w.ledgerEntries() {
		if e.Kind == schemas.LedgerTxn {
			last = e
		}
	}
	if last == nil || last.Phase != schemas.PhasePass || last.NextCursor == "" || last.Pages < 2 {
		t.Fatalf("want the shutdown to commit the open transaction in the middle of the pass, ledger says %+v", last)
	}
	t.Logf("SIGTERM committed seq %d: %d pages, %d records, in phase %s at cursor %s", last.Seq, last.Pages, last.Published, last.Phase, last.NextCursor)

	w.once("resumed run")
	var resumed *schemas.LedgerEntry
	for _, e := range w.ledgerEntries() {
		if e.Kind == schemas.LedgerRun {
			resumed = e
		}
	}
	if resumed == nil || resumed.Reason != schemas.ReasonResumed || resumed.RequestCursor != last.NextCursor || resumed.Seq != last.Seq {
		t.Fatalf("the next run must say it resumed at seq %d cursor %s, ledger says %+v", last.Seq, last.NextCursor, resumed)
	}
	t.Logf("next run: %s (%s)", resumed.Reason, resumed.Detail)
	r := w.check("graceful shutdown")
	if r.SourceRows != rows {
		t.Errorf("source rows %d, want %d", r.SourceRows, rows)
	}
}
