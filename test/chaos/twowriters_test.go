package chaos

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// TestTwoWritersStorm: two processes with the same connector name run at
// once, each killed with SIGKILL and restarted at random, while the table
// changes and transient faults hit both the database (backends terminated)
// and the broker (Produce and EndTxn errors). Whoever starts later fences
// the other; a fenced process exits 4 and is restarted. Afterwards:
//   - the ledger is one chain: every transaction continues the one before
//     it (sequence + 1, and its request cursor is the previous next
//     cursor), so at no moment did two sessions commit on the same state,
//     and no sequence number has two entries;
//   - no process ever stopped for a decision or a bad configuration;
//   - one clean `run --once` succeeds, and the six counts are 0.
func TestTwoWritersStorm(t *testing.T) {
	harness.SkipUnlessKfake(t, "broker fault injection during the storm")
	storm := 30 * time.Second
	if soak() {
		storm = 5 * time.Minute
	}
	seed := seedFor(t)
	rng := rand.New(rand.NewPCG(seed, 0x73746f72))
	var rngMu sync.Mutex
	intn := func(n int) int { rngMu.Lock(); defer rngMu.Unlock(); return rng.IntN(n) }
	w := newWorld(t, nil)
	m := newMutator(w, seed)
	seedRows(t, w, m, 200)
	stopMut := m.run(15 * time.Millisecond)
	cfg := w.config()

	ctx, cancel := context.WithTimeout(context.Background(), storm)
	defer cancel()
	var (
		mu      sync.Mutex
		exits   = map[int]int{}
		bad     []string
		starts  int
		commits int
	)
	var wg sync.WaitGroup
	for slot := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				p := w.start(nil, "run", "--config", cfg)
				mu.Lock()
				starts++
				mu.Unlock()
				life := time.Duration(300+intn(2500)) * time.Millisecond
				select {
				case <-p.done:
				case <-time.After(life):
					p.signal(syscall.SIGKILL)
					<-p.done
				case <-ctx.Done():
					p.signal(syscall.SIGKILL)
					<-p.done
				}
				errOut := p.stderr.String()
				mu.Lock()
				exits[p.code]++
				commits += strings.Count(errOut, `"msg":"committed"`)
				if p.code == 2 || p.code == 3 {
					bad = append(bad, tail(errOut, 2000))
				}
				mu.Unlock()
				time.Sleep(time.Duration(intn(200)) * time.Millisecond)
			}
			_ = slot
		}()
	}
	// Transient faults while the storm runs.
	faults := 0
	txnID := producer.TransactionalID(w.name)
	for ctx.Err() == nil {
		time.Sleep(time.Duration(500+intn(1500)) * time.Millisecond)
		switch intn(3) {
		case 0:
			faults += terminate(context.Background(), t, w, true)
		case 1:
			h := w.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.UnknownServerError})
			time.Sleep(300 * time.Millisecond)
			faults += h.Hits()
			h.Remove()
		case 2:
			h := w.kafka.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.EndTxn}, TxnID: txnID, Err: kerr.CoordinatorNotAvailable})
			time.Sleep(300 * time.Millisecond)
			faults += h.Hits()
			h.Remove()
		}
	}
	wg.Wait()
	stats := stopMut()
	t.Logf("storm %s: %d processes started, exits %v, %d commits logged, %d transient faults hit; workload %s", storm, starts, exits, commits, faults, stats)
	for _, b := range bad {
		t.Errorf("a process stopped for a decision or a bad configuration:\n%s", b)
	}
	if exits[4] == 0 {
		t.Errorf("no process was ever fenced: the two writers never overlapped")
	}
	if commits < 20 {
		t.Errorf("only %d commits during the storm", commits)
	}

	// One chain in the ledger.
	var prev *schemas.LedgerEntry
	seqs := map[int64]string{}
	for _, e := range w.ledgerEntries() {
		if e.Kind != schemas.LedgerTxn {
			continue
		}
		if run, ok := seqs[e.Seq]; ok {
			t.Errorf("two ledger entries for seq %d (runs %s and %s)", e.Seq, run, e.RunID)
		}
		seqs[e.Seq] = e.RunID
		if prev != nil && (e.Seq != prev.Seq+1 || e.RequestCursor != prev.NextCursor) {
			t.Errorf("seq %d by run %s (request cursor %q) does not continue seq %d by run %s (next cursor %q): two writers",
				e.Seq, e.RunID, e.RequestCursor, prev.Seq, prev.RunID, prev.NextCursor)
		}
		prev = e
	}
	w.once("clean run after the storm")
	w.check("two writers storm")
}
