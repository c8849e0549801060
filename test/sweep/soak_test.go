package sweep

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/test/rig"
)

// TestSoakSweepMemory1M (TIDEMARK_SOAK=1, `make soak`): one million rows are
// synced by `tidemark run --once`, then 1,000 are hard-deleted and 1,000
// changed behind tidemark's back; `tidemark sweep` tombstones and repairs
// them, and `tidemark verify` then matches. Each command is a process of
// its own (the binary is built from ./cmd/tidemark), so its peak RSS
// (getrusage maxrss) is the memory of that command alone: the broker
// (kfake) lives in the test process. The child runs with GODEBUG=gctrace=1
// and the highest Go heap it reports is logged next to the RSS. The figures
// are logged, not asserted: see docs/deletes.md for what they were.
// gcLine is a GODEBUG=gctrace=1 line: heap at GC start -> at GC end -> live.
var gcLine = regexp.MustCompile(`(\d+)->(\d+)->(\d+) MB`)

func TestSoakSweepMemory1M(t *testing.T) {
	if os.Getenv("TIDEMARK_SOAK") == "" {
		t.Skip("set TIDEMARK_SOAK=1 (make soak) to sync and sweep one million rows")
	}
	const rows = 1_000_000
	dir := t.TempDir()
	bin := filepath.Join(dir, "tidemark")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/tidemark/tidemark/cmd/tidemark").CombinedOutput(); err != nil {
		t.Fatalf("build tidemark: %v\n%s", err, out)
	}
	r := newRig(t)
	r.Exec(`INSERT INTO items (id, updated_at, v)
		SELECT g, $1::timestamptz + g * interval '1 millisecond', 'value of row ' || g FROM generate_series(1, $2) g`, rig.T0, rows)
	r.Exec(`ANALYZE items`)
	cfg := filepath.Join(dir, "tidemark.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`name: %s
source:
  dsn: %q
  schema: %s
  table: items
  deleted_at_column: deleted_at
kafka:
  brokers: [%s]
  topic: %s
  offsets_topic: %s
  ledger_topic: %s
sync:
  page_size: 5000
  txn_max_records: 50000
  margin: 1s
log:
  level: warn
  format: text
`, r.Name, r.DB.URL, r.DB.Schema, strings.Join(r.Kafka.Brokers, ", "), r.Topic, r.Offsets, r.Ledger)), 0o600); err != nil {
		t.Fatal(err)
	}
	tidemark := func(want int, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(context.Background(), bin, append(args, "--config", cfg)...)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		cmd.Env = append(os.Environ(), "GODEBUG=gctrace=1")
		start := time.Now()
		err := cmd.Run()
		code := cmd.ProcessState.ExitCode()
		if err != nil && code < 0 {
			t.Fatalf("tidemark %s: %v", args[0], err)
		}
		rss := float64(cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss) / 1024 // KiB on Linux
		t.Logf("tidemark %s: exit %d in %s, peak RSS %.1f MiB", args[0], code, time.Since(start).Round(time.Millisecond), rss)
		if code != want {
			t.Fatalf("tidemark %s: exit %d, want %d\n%s\n%s", args[0], code, want, o.String(), e.String())
		}
		lines := strings.Split(e.String(), "\n")
		peakHeap := 0
		for _, l := range lines {
			if m := gcLine.FindStringSubmatch(l); m != nil {
				a, _ := strconv.Atoi(m[1])
				b, _ := strconv.Atoi(m[2])
				peakHeap = max(peakHeap, a, b)
			}
		}
		t.Logf("peak heap (gctrace) %d MB", peakHeap)
		return o.String()
	}
	tidemark(0, "run", "--once")
	r.Exec(`DELETE FROM items WHERE id % 1000 = 0`)
	r.Exec(`UPDATE items SET v = 'changed' WHERE id % 1000 = 1`)
	out := tidemark(0, "sweep")
	t.Log(strings.TrimSpace(out))
	if !strings.Contains(out, fmt.Sprintf("%d source rows, %d live topic keys, 1000 tombstoned, 1000 repaired", rows-1000, rows)) {
		t.Errorf("sweep: %s", out)
	}
	out = tidemark(0, "verify")
	t.Log(strings.TrimSpace(out))
}
