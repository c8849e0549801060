// Package failpoint crashes the process at named points, for the crash
// tests: TIDEMARK_FAILPOINTS="after-fetch=2,during-commit=1" makes the 2nd
// hit of after-fetch (or the 1st of during-commit) exit the process at once
// with code 86, skipping every deferred cleanup, as a kill -9 would.
//
// When the variable is unset, Hit costs one atomic load.
package failpoint

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// ExitCode is the exit code of a crash at a failpoint.
const ExitCode = 86

// Names of the points the engine and producer pass through.
const (
	AfterFetch   = "after-fetch"   // a page was read, nothing of it published
	AfterProduce = "after-produce" // a page's records were handed to the producer, before commit
	DuringCommit = "during-commit" // the checkpoint is flushed, EndTransaction not yet sent
	AfterCommit  = "after-commit"  // EndTransaction returned, the engine has not advanced yet
)

var (
	enabled atomic.Bool
	mu      sync.Mutex
	want    = map[string]int{}
	hits    = map[string]int{}
)

func init() { configure(os.Getenv("TIDEMARK_FAILPOINTS")) }

func configure(spec string) {
	mu.Lock()
	defer mu.Unlock()
	clear(want)
	clear(hits)
	for _, part := range strings.Split(spec, ",") {
		name, n, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok || name == "" {
			continue
		}
		if k, err := strconv.Atoi(n); err == nil && k > 0 {
			want[name] = k
		}
	}
	enabled.Store(len(want) > 0)
}

// Hit counts a pass through point name and crashes the process when the
// configured hit is reached.
func Hit(name string) {
	if !enabled.Load() {
		return
	}
	mu.Lock()
	hits[name]++
	crash := want[name] > 0 && hits[name] == want[name]
	mu.Unlock()
	if crash {
		fmt.Fprintf(os.Stderr, "failpoint %s: crashing on hit %d (TIDEMARK_FAILPOINTS)\n", name, want[name])
		os.Exit(ExitCode)
	}
}
