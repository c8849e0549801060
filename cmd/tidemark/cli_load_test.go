package main

import (
	"context"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/failpoint"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// TestCLIKeyLoadCrashStatusResume: an initial load in key order
// (sync.load_workers: 2) crashes at its third commit; status shows the
// open load's progress, range by range, a sweep is refused (exit 2), and
// the next run --once resumes it
// and ends with the topic equal to the table, nothing published twice.
func TestCLIKeyLoadCrashStatusResume(t *testing.T) {
	w := newVFWorld(t, "  page_size: 2\n  txn_max_records: 2\n  load_workers: 2\n")
	code, out, errOut := w.subprocess([]string{"TIDEMARK_FAILPOINTS=" + failpoint.DuringCommit + "=3"}, "run", "--once")
	if code != failpoint.ExitCode {
		t.Fatalf("run with a failpoint: exit %d, want the crash (%d)\n%s\n%s", code, failpoint.ExitCode, out, errOut)
	}
	code, out, errOut = w.cli("status")
	if code != exitOK {
		t.Fatalf("status: exit %d\n%s\n%s", code, out, errOut)
	}
	for _, want := range []string{"phase:        load", "initial load: in key order, moving", "ranges done", "watermark after the load"} {
		if !strings.Contains(out, want) {
			t.Errorf("status after the crash lacks %q:\n%s", want, out)
		}
	}
	t.Logf("status:\n%s", out)
	if strings.Contains(out, "open pass:") {
		t.Errorf("status describes the open load as a pass:\n%s", out)
	}
	// A sweep now would publish the rows the load has not reached, which
	// the load then publishes again: refused, exit 2, naming the fix.
	if code, out, errOut = w.cli("sweep"); code != exitConfig || !strings.Contains(errOut, "run --once") {
		t.Errorf("sweep during the open load: exit %d, want %d naming `run --once`\n%s\n%s", code, exitConfig, out, errOut)
	}
	if code, out, errOut = w.subprocess(nil, "run", "--once"); code != exitOK {
		t.Fatalf("run --once after the crash: exit %d\n%s\n%s", code, out, errOut)
	}
	st := w.assertExact()
	for k, vs := range st.Publications {
		for v, n := range vs {
			if n > 1 {
				t.Errorf("key %s: %q published %d times", k, v, n)
			}
		}
	}
}

// TestCLIConsistentKeyLoadResumeCatchesUp: a consistent load in key order
// that crashed part way resumes under a new snapshot, so the ranges read
// before the crash hold the first snapshot's rows and the rest the new
// one's: the topic matches no single moment. A row read before the crash
// and changed before the resume lies behind its range's cursor, and only
// an incremental pass reads it: `run --once` goes on to that pass, and
// the topic equals the table when it returns.
func TestCLIConsistentKeyLoadResumeCatchesUp(t *testing.T) {
	w := newVFWorld(t, "  page_size: 2\n  txn_max_records: 2\n  load_workers: 2\n")
	consistent := []string{"--source.initial_load", "consistent"}
	code, out, errOut := w.subprocess([]string{"TIDEMARK_FAILPOINTS=" + failpoint.DuringCommit + "=3"}, append([]string{"run", "--once"}, consistent...)...)
	if code != failpoint.ExitCode {
		t.Fatalf("run with a failpoint: exit %d, want the crash (%d)\n%s\n%s", code, failpoint.ExitCode, out, errOut)
	}
	if cp := w.checkpoint(); cp.Phase != schemas.PhaseLoad || cp.Load == nil || !cp.Load.Consistent {
		t.Fatalf("after the crash: phase %q, load %+v; want an open consistent load", cp.Phase, cp.Load)
	}
	st, err := fold.Map(context.Background(), w.opts(), vfTopic)
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Live) == 0 {
		t.Fatal("the load committed nothing before the crash")
	}
	for key := range st.Live {
		w.db.Exec(t, `UPDATE items SET v = 'changed after it was loaded', updated_at = clock_timestamp() WHERE id = $1`, key)
	}
	if code, out, errOut = w.subprocess(nil, append([]string{"run", "--once"}, consistent...)...); code != exitOK {
		t.Fatalf("run --once after the crash: exit %d\n%s\n%s", code, out, errOut)
	}
	w.assertExact()
}
