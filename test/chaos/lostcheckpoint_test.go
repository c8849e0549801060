package chaos

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/schemas"
)

// TestLostCheckpointRefusesEveryTime deletes the offsets topic after a
// sync: every later start refuses with exit 3 and says what to do; an
// explicit `tidemark reset --yes` is recorded in the ledger, and the run
// after it leaves the six counts at 0 (the reset's re-publication of every
// row is the documented exception to "no duplicates").
func TestLostCheckpointRefusesEveryTime(t *testing.T) {
	seed := seedFor(t)
	w := newWorld(t, nil)
	m := newMutator(w, seed)
	seedRows(t, w, m, 60)
	cfg := w.config()
	w.once("first sync")

	cl, err := kgo.NewClient(w.opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := adm.DeleteTopics(ctx, w.offsets)
	if err == nil {
		err = resp.Error()
	}
	if err != nil {
		t.Fatalf("delete %s: %v", w.offsets, err)
	}
	for range 10 {
		if err := m.step(ctx); err != nil {
			t.Fatal(err)
		}
	}

	for attempt := 1; attempt <= 3; attempt++ {
		code, p := w.run(60*time.Second, nil, "run", "--config", cfg, "--once")
		errOut := p.stderr.String()
		if code != 3 {
			t.Fatalf("attempt %d: exit %d, want 3 (safety stop); stderr tail:\n%s", attempt, code, tail(errOut, 3000))
		}
		for _, want := range []string{"checkpoint was lost", "what to do", "tidemark reset"} {
			if !strings.Contains(errOut, want) {
				t.Errorf("attempt %d: the message does not say %q; stderr tail:\n%s", attempt, want, tail(errOut, 2000))
			}
		}
	}

	mark, err := adm.ListEndOffsets(ctx, w.topic)
	if err != nil {
		t.Fatal(err)
	}
	marks := map[int32]int64{}
	mark.Each(func(o kadm.ListedOffset) { marks[o.Partition] = o.Offset })
	if code, p := w.run(60*time.Second, nil, "reset", "--config", cfg, "--yes", "--reason", "offsets topic deleted by the chaos test", "--by", "chaos-test"); code != 0 {
		t.Fatalf("reset: exit %d; stderr tail:\n%s", code, tail(p.stderr.String(), 3000))
	}
	w.once("run after the reset")
	var reset *schemas.LedgerEntry
	for _, e := range w.ledgerEntries() {
		if e.Kind == schemas.LedgerReset {
			reset = e
		}
	}
	if reset == nil || reset.By != "chaos-test" || reset.Why != "offsets topic deleted by the chaos test" {
		t.Fatalf("the reset is not recorded in the ledger with who and why: %+v", reset)
	}
	r := w.check("lost checkpoint", marks)
	t.Logf("lost checkpoint: 3 of 3 starts refused with exit 3; reset recorded by %q; %d rows re-published by the reset (documented)", reset.By, r.Republished)
}
