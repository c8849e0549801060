package connector_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"

	"github.com/tidemark/tidemark/connector"
)

// BenchmarkKeySet1M measures the memory of a sweep's key set with one
// million live keys (docs/design.md, "Deletes and the sweep"; the target is "comfortably within 100
// MiB"): the topic's keys are put with their digests, the source marks all
// but 1,000 of them, and the unmarked ones are listed (the tombstones).
//
// Reported per key set: heap-MiB, the live heap it retains after a GC;
// peak-heap-MiB, the highest heap in use sampled while it grew (garbage of
// the map's growth included); alloc-MiB, every byte allocated on the way.
// Run: go test -run '^$' -bench KeySet1M -benchtime 3x ./connector
func BenchmarkKeySet1M(b *testing.B) {
	const n = 1_000_000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = strconv.Itoa(1_000_000 + i*7) // 7-digit ids, like a bigint key
	}
	var retained, peak, alloc float64
	for b.Loop() {
		var before, ms runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		maxInuse := before.HeapInuse
		ks := connector.NewKeySet(1 << 16) // as fold.Topic.Live sizes it
		for i, k := range keys {
			if _, err := ks.Put(k, uint64(i)*0x9e3779b97f4a7c15); err != nil {
				b.Fatal(err)
			}
			if i%(1<<16) == 0 {
				runtime.ReadMemStats(&ms)
				maxInuse = max(maxInuse, ms.HeapInuse)
			}
		}
		for _, k := range keys[1000:] {
			ks.Mark(k)
		}
		gone := 0
		_ = ks.Unmarked(func(string, uint64) error { gone++; return nil })
		if gone != 1000 || ks.Len() != n {
			b.Fatalf("%d unmarked of %d keys", gone, ks.Len())
		}
		runtime.ReadMemStats(&ms)
		maxInuse = max(maxInuse, ms.HeapInuse)
		alloc = float64(ms.TotalAlloc-before.TotalAlloc) / (1 << 20)
		runtime.GC()
		runtime.ReadMemStats(&ms)
		retained = (float64(ms.HeapInuse) - float64(before.HeapInuse)) / (1 << 20)
		peak = float64(maxInuse-before.HeapInuse) / (1 << 20)
		runtime.KeepAlive(ks)
	}
	b.ReportMetric(retained, "heap-MiB")
	b.ReportMetric(peak, "peak-heap-MiB")
	b.ReportMetric(alloc, "alloc-MiB")
	b.ReportMetric(retained*(1<<20)/n, "B/key")
}

// TestKeySetMatchesMap drives a KeySet and a Go map with the same random
// puts, deletes (tombstones), re-puts and marks, and compares them after
// every step that can break open addressing (deletes inside probe runs,
// index growth, reuse of freed entries), with full key hashes and with
// hashes cut to 3 bits, where most keys share a hash with others.
func TestKeySetMatchesMap(t *testing.T) {
	for _, mask := range []uint32{^uint32(0), 0x7} {
		t.Run(fmt.Sprintf("hash mask %#x", mask), func(t *testing.T) { testKeySetMatchesMap(t, connector.NewWeakKeySet(0, mask)) })
	}
}

func testKeySetMatchesMap(t *testing.T, ks *connector.KeySet) {
	rng := rand.New(rand.NewPCG(1, 2))
	type version struct {
		digest uint64
		ver    uint32
	}
	model := map[string]uint64{}
	vers := map[string]version{}
	marked := map[string]bool{}
	check := func(step int) {
		t.Helper()
		if ks.Len() != len(model) {
			t.Fatalf("step %d: Len %d, want %d", step, ks.Len(), len(model))
		}
		for k, d := range model {
			if got, ok := ks.Lookup(k); !ok || got != d {
				t.Fatalf("step %d: Lookup(%s) = %d %v, want %d", step, k, got, ok, d)
			}
		}
	}
	for step := range 20000 {
		k := strconv.Itoa(rng.IntN(3000))
		switch op := rng.IntN(10); {
		case op < 6:
			d, v := rng.Uint64()%4, rng.Uint32()%3 // version 0: not known, matches any
			same, err := ks.PutVersion(k, d, v)
			old, had := vers[k]
			if err != nil || same != (had && old.digest == d && (old.ver == v || old.ver == 0 || v == 0)) {
				t.Fatalf("step %d: PutVersion(%s, %d, %d) = %v %v; model had %v %v", step, k, d, v, same, err, had, old)
			}
			model[k], vers[k] = d, version{d, v}
		case op < 9:
			ks.Delete(k)
			delete(model, k)
			delete(vers, k)
			delete(marked, k)
		default:
			if ks.Mark(k) != hasKey(model, k) {
				t.Fatalf("step %d: Mark(%s) disagrees with the model", step, k)
			}
			if hasKey(model, k) {
				marked[k] = true
			}
		}
		if _, ok := ks.Lookup("absent-" + k); ok {
			t.Fatalf("step %d: an absent key was found", step)
		}
		if step%997 == 0 {
			check(step)
		}
	}
	check(-1)
	var unmarked []string
	_ = ks.Unmarked(func(k string, d uint64) error {
		if model[k] != d || marked[k] {
			t.Errorf("Unmarked gave %s=%d; model %d marked %v", k, d, model[k], marked[k])
		}
		unmarked = append(unmarked, k)
		return nil
	})
	if want := len(model) - len(marked); len(unmarked) != want {
		t.Errorf("Unmarked listed %d keys, want %d", len(unmarked), want)
	}
}

func hasKey(m map[string]uint64, k string) bool { _, ok := m[k]; return ok }
