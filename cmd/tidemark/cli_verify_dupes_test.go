package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/fold"
)

// TestCLIVerifyDuplicateExit5: a row version published twice breaks the
// exactly-once promise even though the folded state still equals the
// table: verify says so and exits 5.
func TestCLIVerifyDuplicateExit5(t *testing.T) {
	w := newVFWorld(t, "")
	w.mustCLI("run", "--once")
	st, err := fold.Map(context.Background(), w.opts(), vfTopic)
	if err != nil {
		t.Fatal(err)
	}
	last, ok := st.Live["3"]
	if !ok {
		t.Fatal("key 3 not in the topic")
	}
	cl, err := kgo.NewClient(append(w.opts(), kgo.DefaultProduceTopic(vfTopic), kgo.DisableIdempotentWrite(),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(context.Background(), &kgo.Record{Key: []byte("3"), Value: last.Value}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := w.cli("verify")
	if code != exitMismatch {
		t.Fatalf("verify with a duplicate publication: exit %d, want %d\n%s%s", code, exitMismatch, out, errOut)
	}
	for _, s := range []string{"missing:       0", "extra:         0", "mismatched:    0", "duplicate publications: 1", "EXACTLY-ONCE VIOLATED"} {
		if !strings.Contains(out, s) {
			t.Errorf("the report lacks %q:\n%s", s, out)
		}
	}
}

// TestDedupeMaxEntriesIgnoredWithWarning: an older file that still bounds
// the dedupe set loads, and the run says the key is ignored.
func TestDedupeMaxEntriesIgnoredWithWarning(t *testing.T) {
	path := writeConfig(t, minimal+"sync:\n  dedupe_max_entries: 20000\n")
	var out, errOut strings.Builder
	// The warning comes when the configuration is read, before status
	// waits for a broker (none answers on the reserved port: it would wait
	// sync.once_retry_timeout, 5m, so the test stops it).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	run(ctx, []string{"status", "--config", path, "--kafka.brokers", "127.0.0.1:1", "--log-format", "text"}, &out, &errOut)
	if !strings.Contains(errOut.String(), "sync.dedupe_max_entries is no longer used") {
		t.Errorf("no warning about sync.dedupe_max_entries:\n%s", errOut.String())
	}
}
