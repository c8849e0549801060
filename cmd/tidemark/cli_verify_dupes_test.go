package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// TestCLIVerifyDuplicateExit5: a row version published twice breaks the
// exactly-once promise even though the folded state still equals the
// table: verify says so and exits 5.
func TestCLIVerifyDuplicateExit5(t *testing.T) {
	w := newVFWorld(t, "")
	w.mustCLI("run", "--once")
	last := w.lastRecord("3")
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

// TestCLIVerifyRepeatOfAnEarlierVersionExit5: a row version published
// again after a newer one (A, B, A: what a writer that read A late would
// leave) is a duplicate publication even though the state matches and the
// repeat is not next to its first publication; verify finds it in memory
// and by buckets. A row whose updated_at really went back, repaired by a
// sweep, is reported as back in time but is not a failure.
func TestCLIVerifyRepeatOfAnEarlierVersionExit5(t *testing.T) {
	w := newVFWorld(t, "")
	w.mustCLI("run", "--once")

	// Row 4's updated_at goes back (an older transaction wrote it last);
	// the walk is past it, the sweep repairs it.
	w.db.Exec(t, `UPDATE items SET v = 'back', updated_at = updated_at - interval '1 hour' WHERE id = 4`)
	if code, out, errOut := w.cli("sweep"); code != 0 {
		t.Fatalf("sweep: exit %d\n%s%s", code, out, errOut)
	}
	for _, args := range [][]string{{"verify"}, {"verify", "--sweep.max_keys_in_memory", "0"}} {
		code, out, errOut := w.cli(args...)
		if code != 0 {
			t.Fatalf("%v after a row went back in time: exit %d, want 0\n%s%s", args, code, out, errOut)
		}
		for _, s := range []string{"duplicate publications: 0", "records back in time: 1 e.g. 4", "MATCH"} {
			if !strings.Contains(out, s) {
				t.Errorf("%v: the report lacks %q:\n%s", args, s, out)
			}
		}
	}

	a := w.lastRecord("3")
	at, err := schemas.ParseTime(a.Headers[schemas.HeaderUpdatedAt])
	if err != nil {
		t.Fatalf("key 3's updated_at header: %v", err)
	}
	cl, err := kgo.NewClient(append(w.opts(), kgo.DefaultProduceTopic(vfTopic), kgo.DisableIdempotentWrite(),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	headers := func(at string) []kgo.RecordHeader {
		var hs []kgo.RecordHeader
		for k, v := range a.Headers {
			if k == schemas.HeaderUpdatedAt {
				v = at
			}
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		return hs
	}
	newer := schemas.FormatTime(at.Add(time.Minute))
	b := &kgo.Record{Key: []byte("3"), Value: []byte(`{"id":3,"v":"newer"}`), Headers: headers(newer)}
	again := &kgo.Record{Key: []byte("3"), Value: a.Value, Headers: headers(a.Headers[schemas.HeaderUpdatedAt])}
	if err := cl.ProduceSync(context.Background(), b, again).FirstErr(); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"verify"}, {"verify", "--sweep.max_keys_in_memory", "0"}} {
		code, out, errOut := w.cli(args...)
		if code != exitMismatch {
			t.Fatalf("%v with an earlier version published again: exit %d, want %d\n%s%s", args, code, exitMismatch, out, errOut)
		}
		for _, s := range []string{"missing:       0", "mismatched:    0", "duplicate publications: 1", "records back in time: 2 e.g. 3, 4", "EXACTLY-ONCE VIOLATED"} {
			if !strings.Contains(out, s) {
				t.Errorf("%v: the report lacks %q:\n%s", args, s, out)
			}
		}
	}
}

// lastRecord is the last record of key in the topic (folded
// read_committed).
func (w *vfWorld) lastRecord(key string) fold.Entry {
	w.t.Helper()
	st, err := fold.Map(context.Background(), w.opts(), vfTopic)
	if err != nil {
		w.t.Fatal(err)
	}
	e, ok := st.Live[key]
	if !ok {
		w.t.Fatalf("key %s not in the topic", key)
	}
	return e
}
