package main

import (
	"strings"
	"testing"

	"github.com/tidemark/tidemark/failpoint"
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
