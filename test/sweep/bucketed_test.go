package sweep

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"regexp"
	"runtime"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/rig"
	"github.com/tidemark/tidemark/verify"
)

// budgets are the memory budgets compared: the in-memory default, always
// by buckets with no limit, and tiny ones (a handful of keys per pass).
var budgets = []struct {
	name string
	keys int
}{{"in-memory", 0}, {"buckets", -1}, {"tiny", 7}, {"small", 40}}

// differences builds the same world in every rig: 120 rows synced, then
// hard deletes of synced rows (extra in the topic), rows never synced and
// keys tombstoned behind tidemark's back (missing), values changed without
// updated_at and stale values produced into the topic (mismatched), and a
// ghost key (extra). It returns the ids of each kind.
func differences(r *rig.Rig) (extra, missing, mismatched []string) {
	r.T.Helper()
	r.Seed(1, 120, time.Hour)
	r.Once(r.Src, connector.Config{Margin: time.Second, PageSize: 25})
	r.Seed(121, 124, time.Hour) // never synced
	r.Exec(`DELETE FROM items WHERE id IN (5, 17, 60, 99)`)
	r.Exec(`UPDATE items SET v = 'changed' WHERE id IN (8, 42)`) // updated_at kept
	produceRaw(r,
		[2]*string{ptr("30"), nil},
		[2]*string{ptr("31"), ptr(`{"id":31,"v":"stale"}`)},
		[2]*string{ptr("ghost"), ptr(`{"v":"ghost"}`)},
	)
	extra = []string{"17", "5", "60", "99", "ghost"}
	missing = []string{"121", "122", "123", "124", "30"}
	mismatched = []string{"31", "42", "8"}
	return extra, missing, mismatched
}

// outcome is what one budget produced on the world of differences.
type outcome struct {
	before     *verify.Report
	sweep      connector.SweepResult
	tombstoned []string
	live       map[string]string
	after      *verify.Report
	again      connector.SweepResult
}

// TestBucketedSameAsInMemory: on the same differences, verify and the
// sweep give exactly the in-memory result under every budget, and the
// bucketed runs drill into exactly the buckets of the differing keys.
func TestBucketedSameAsInMemory(t *testing.T) {
	got := map[string]*outcome{}
	var extra, missing, mismatched []string
	for _, b := range budgets {
		t.Run(b.name, func(t *testing.T) {
			// The bucket statistics below describe one uninterrupted
			// sweep. A sweep that went on from a part committed before
			// a transient failure re-reads only the buckets left (the
			// resumption has its own test in connector), so the world is
			// built again on a fresh rig then.
			var r *rig.Rig
			o := &outcome{}
			for attempt := 1; ; attempt++ {
				r = newRig(t)
				extra, missing, mismatched = differences(r)
				o.before = verifyWith(r, b.keys)
				t.Logf("\n%s", o.before.Text())
				o.sweep = r.Sweep(connector.Config{Margin: time.Second, SweepMaxKeys: b.keys, TxnMaxRecords: 3})
				if !o.sweep.Resumed {
					break
				}
				if attempt == 3 {
					t.Fatalf("the sweep resumed after a transient failure in all %d attempts", attempt)
				}
				t.Logf("attempt %d: the sweep resumed after a transient failure (%s); building the world again", attempt, o.sweep)
			}
			st := r.AssertTable()
			o.tombstoned = rig.Tombstoned(st)
			o.live = map[string]string{}
			for k, e := range st.Live {
				o.live[k] = string(e.Value)
			}
			o.after = verifyWith(r, b.keys)
			o.again = r.Sweep(connector.Config{Margin: time.Second, SweepMaxKeys: b.keys})
			got[b.name] = o

			if o.before.OK() || o.before.Missing != 5 || o.before.Extra != 5 || o.before.Mismatched != 3 ||
				!slices.Equal(o.before.MissingSample, missing) || !slices.Equal(o.before.ExtraSample, extra) ||
				!slices.Equal(o.before.MismatchedSample, mismatched) {
				t.Errorf("verify before the sweep: want missing %v, extra %v, mismatched %v; got\n%s", missing, extra, mismatched, o.before.Text())
			}
			if o.sweep.Tombstoned != 5 || o.sweep.Repaired != 8 {
				t.Errorf("sweep: %s; want 5 tombstoned, 8 repaired", o.sweep)
			}
			if !o.after.OK() {
				t.Errorf("verify after the sweep:\n%s", o.after.Text())
			}
			if o.again.Tombstoned != 0 || o.again.Repaired != 0 {
				t.Errorf("second sweep: %s; want nothing to do", o.again)
			}
			if b.keys == 0 {
				if o.before.Buckets != nil || o.sweep.Buckets != nil {
					t.Error("the default budget compared by buckets")
				}
				return
			}
			// Drill down only where something differs.
			want := map[int]bool{}
			for _, k := range slices.Concat(extra, missing, mismatched) {
				want[connector.Bucket(k)] = true
			}
			for what, bs := range map[string]*connector.BucketStats{"verify": o.before.Buckets, "sweep": o.sweep.Buckets} {
				if bs == nil {
					t.Errorf("%s did not compare by buckets", what)
					continue
				}
				if bs.Differing != len(want) {
					t.Errorf("%s re-read %d buckets; the 13 differing keys are in %d", what, bs.Differing, len(want))
				}
				if b.keys > 0 && bs.MaxKeys > b.keys {
					t.Errorf("%s held %d keys at once, budget %d", what, bs.MaxKeys, b.keys)
				}
			}
			for what, bs := range map[string]*connector.BucketStats{"verify": o.after.Buckets, "sweep": o.again.Buckets} {
				if bs == nil || bs.Differing != 0 || bs.Rounds != 0 || bs.SourceScans != 1 {
					t.Errorf("%s with nothing to do: %+v; want no bucket re-read and one source scan", what, bs)
				}
			}
		})
	}
	base := got["in-memory"]
	if base == nil {
		return
	}
	for _, b := range budgets[1:] {
		o := got[b.name]
		if o == nil {
			continue
		}
		for when, pair := range map[string][2]*verify.Report{"before": {base.before, o.before}, "after": {base.after, o.after}} {
			if d := reportDiff(pair[0], pair[1]); d != "" {
				t.Errorf("%s: verify %s the sweep differs from in-memory: %s", b.name, when, d)
			}
		}
		if o.sweep.Tombstoned != base.sweep.Tombstoned || o.sweep.Repaired != base.sweep.Repaired ||
			o.sweep.SourceRows != base.sweep.SourceRows || o.sweep.TopicKeys != base.sweep.TopicKeys {
			t.Errorf("%s: sweep %s; in memory %s", b.name, o.sweep, base.sweep)
		}
		if !slices.Equal(o.tombstoned, base.tombstoned) {
			t.Errorf("%s: tombstoned keys %v; in memory %v", b.name, o.tombstoned, base.tombstoned)
		}
		if !maps.Equal(o.live, base.live) {
			t.Errorf("%s: the folded topic after the sweep differs from in-memory's", b.name)
		}
	}
}

// reportDiff compares two reports on everything but timings, views and
// bucket statistics.
func reportDiff(a, b *verify.Report) string {
	x, y := *a, *b
	for _, r := range []*verify.Report{&x, &y} {
		r.Seconds, r.SourceView, r.Buckets, r.TargetEnd = 0, "", nil, nil
	}
	if fmt.Sprintf("%+v", x) != fmt.Sprintf("%+v", y) {
		return fmt.Sprintf("\n  in memory %+v\n  buckets   %+v", x, y)
	}
	return ""
}

// verifyWith runs verify with a memory budget.
func verifyWith(r *rig.Rig, keys int) *verify.Report {
	r.T.Helper()
	rep, err := verify.Options{MaxKeysInMemory: keys}.Compare(context.Background(), r.Src, r.TopicView(), "topic "+r.Topic)
	if err != nil {
		r.T.Fatalf("verify: %v", err)
	}
	return rep
}

// TestBucketedReplica: verify against a replica table by buckets names the
// same differences as in memory.
func TestBucketedReplica(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 50, time.Millisecond)
	r.Exec(`CREATE TABLE items_replica (LIKE items INCLUDING ALL); INSERT INTO items_replica SELECT * FROM items`)
	r.Exec(`UPDATE items_replica SET v = 'drift' WHERE id = 6; DELETE FROM items_replica WHERE id = 2; INSERT INTO items_replica (id, v) VALUES (77, 'x')`)
	rcfg := r.PG
	rcfg.Table, rcfg.DeletedAtColumn = "items_replica", ""
	replica := verify.Scanned{LiveScanner: r.Open(rcfg)}
	var reps []*verify.Report
	for _, keys := range []int{0, -1, 3} {
		rep, err := verify.Options{MaxKeysInMemory: keys}.Compare(context.Background(), r.Src, replica, "table items_replica")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("budget %d:\n%s", keys, rep.Text())
		if rep.Missing != 1 || rep.Extra != 1 || rep.Mismatched != 1 || rep.MissingSample[0] != "2" || rep.ExtraSample[0] != "77" || rep.MismatchedSample[0] != "6" {
			t.Errorf("budget %d: want 2 missing, 77 extra, 6 mismatched", keys)
		}
		if (keys == 0) != (rep.Buckets == nil) {
			t.Errorf("budget %d: buckets %+v", keys, rep.Buckets)
		}
		reps = append(reps, rep)
	}
	for _, rep := range reps[1:] {
		if d := reportDiff(reps[0], rep); d != "" {
			t.Errorf("replica by buckets differs from in memory: %s", d)
		}
	}
}

// TestBucketedCrashResumes: a bucketed sweep that fails after committing
// part of its work (its transactions hold 2 records) leaves the sweep
// marked in the checkpoint; the next run finishes it and the topic is exact.
func TestBucketedCrashResumes(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 60, time.Millisecond)
	r.Once(r.Src, connector.Config{})
	r.Exec(`DELETE FROM items WHERE id % 5 = 0`) // 12 hard deletes
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stop := &stopAfter{Source: r.Src, cancel: cancel}
	e := r.Engine(stop, connector.Config{SweepMaxKeys: 4, TxnMaxRecords: 2, RetryTimeout: time.Nanosecond})
	if _, err := e.SweepOnce(ctx, r.TopicView()); err == nil {
		t.Fatal("the sweep survived its crash")
	}
	cp := r.Checkpoint()
	if cp.Sweep == nil || cp.Sweep.Tombstoned == 0 || cp.Sweep.Tombstoned >= 12 {
		t.Fatalf("after the crash: sweep progress %+v; want part of the 12 tombstones committed", cp.Sweep)
	}
	t.Logf("crashed after committing %d tombstones", cp.Sweep.Tombstoned)
	// The next run (a pass, then the unfinished sweep) completes it.
	r.Once(r.Src, connector.Config{SweepMaxKeys: 4})
	cp = r.Checkpoint()
	if cp.Sweep != nil || cp.LastSweep == nil {
		t.Fatalf("after the rerun: sweep %+v, last %+v", cp.Sweep, cp.LastSweep)
	}
	st := r.AssertTable()
	if got := rig.Tombstoned(st); len(got) != 12 {
		t.Errorf("tombstoned keys %v, want the 12 deleted", got)
	}
	if rep := verifyWith(r, -1); !rep.OK() {
		t.Errorf("verify:\n%s", rep.Text())
	}
}

// stopAfter is the PostgreSQL source whose view lets phase 1 and two
// drill-down rounds through, then cancels the sweep (a crash after some
// committed transactions).
type stopAfter struct {
	connector.Source
	cancel context.CancelFunc
}

func (s *stopAfter) ScanLive(ctx context.Context, fn func(*connector.Row) error) (time.Time, error) {
	return s.Source.(connector.LiveScanner).ScanLive(ctx, fn)
}

func (s *stopAfter) LiveView(ctx context.Context) (connector.LiveView, error) {
	v, err := s.Source.(connector.LiveViewer).LiveView(ctx)
	if err != nil {
		return nil, err
	}
	return &stopView{LiveView: v, s: s}, nil
}

type stopView struct {
	connector.LiveView
	s     *stopAfter
	scans int
}

func (v *stopView) ScanLive(ctx context.Context, fn func(*connector.Row) error) error {
	v.scans++
	if v.scans < 4 {
		return v.LiveView.ScanLive(ctx, fn)
	}
	v.s.cancel()
	return context.Canceled
}

// TestBucketedMemory: 200,000 live keys, compared in memory and with a
// budget of 20,000 keys. Each comparison runs in a child process (this test
// binary, TestBucketedMemoryChild), so that the in-process broker's heap is
// not counted; the child samples runtime.ReadMemStats (HeapAlloc) and the
// live heap as of the last GC every 5 ms and reports the peaks. By buckets,
// the heap is the reading's fixed cost plus the budget's KeySet. Logged
// figures, loose bounds: this is not a benchmark.
func TestBucketedMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("200,000 rows")
	}
	const rows, budget = 200_000, 20_000
	r := newRig(t)
	r.Exec(`INSERT INTO items (id, updated_at, v)
		SELECT g, $1::timestamptz + g * interval '1 millisecond', 'value of row ' || g FROM generate_series(1, $2) g`, rig.T0, rows)
	r.Exec(`ANALYZE items`)
	r.Once(r.Src, connector.Config{PageSize: 5000, TxnMaxRecords: 50000, Margin: time.Second})
	r.Exec(`DELETE FROM items WHERE id % 1000 = 0`) // 200 hard deletes

	child := func(what string, keys int) (peakAlloc, peakLive uint64, out string) {
		t.Helper()
		cmd := exec.Command(os.Args[0], "-test.run=^TestBucketedMemoryChild$", "-test.v")
		cmd.Env = append(os.Environ(), "GOGC=25", "TIDEMARK_MEM_CHILD="+what, fmt.Sprint("TIDEMARK_MEM_KEYS=", keys),
			"TIDEMARK_MEM_DSN="+r.DB.URL, "TIDEMARK_MEM_SCHEMA="+r.DB.Schema, "TIDEMARK_MEM_BROKERS="+strings.Join(r.Kafka.Brokers, ","))
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child %s %d: %v\n%s", what, keys, err, b)
		}
		m := regexp.MustCompile(`PEAK alloc=(\d+) live=(\d+) (.*)`).FindStringSubmatch(string(b))
		if m == nil {
			t.Fatalf("child %s %d reported no peak:\n%s", what, keys, b)
		}
		a, _ := strconv.ParseUint(m[1], 10, 64)
		l, _ := strconv.ParseUint(m[2], 10, 64)
		t.Logf("%s, budget %d keys: peak heap %.1f MiB (live after GC %.1f MiB); %s", what, keys, float64(a)/(1<<20), float64(l)/(1<<20), m[3])
		return a, l, m[3]
	}
	memAlloc, memLive, memOut := child("verify", 0)
	bAlloc, bLive, bOut := child("verify", budget)
	sAlloc, sLive, sOut := child("sweep", budget)
	if !strings.Contains(memOut, "extra=200 ") || !strings.Contains(bOut, "extra=200 ") || !strings.Contains(sOut, "tombstoned=200 ") {
		t.Errorf("results: in memory %q, by buckets %q, sweep %q; want 200 extra / tombstoned", memOut, bOut, sOut)
	}
	// The KeySet of 20,000 keys is about 1 MiB (200,000: about 9 MiB). The
	// rest of the heap is the fixed cost of reading, the same in both
	// modes: lz4 block buffers (up to 2 x 4 MiB, pooled, so present at
	// some samples and not others), a 1 MiB fetch response and its
	// records, a page of rows, the clients, and the GC's headroom
	// (GOGC=25 here). At 200,000 keys that noise is as large as the
	// KeySets' difference, so the bound is absolute and loose: the figures
	// are logged, and the KeySet itself never held more than the budget.
	const MiB = 1 << 20
	_, _ = memAlloc, memLive
	for what, v := range map[string][2]uint64{"verify": {bAlloc, bLive}, "sweep": {sAlloc, sLive}} {
		if v[0] > 32*MiB {
			t.Errorf("%s by buckets: peak heap %.1f MiB (live %.1f MiB), want at most 32 MiB", what, float64(v[0])/MiB, float64(v[1])/MiB)
		}
	}
	for what, out := range map[string]string{"verify": bOut, "sweep": sOut} {
		if !strings.Contains(out, fmt.Sprintf("MaxKeys:%d}", budget)) {
			t.Errorf("%s by buckets: %s; want a KeySet of at most %d keys", what, out, budget)
		}
	}
}

// TestBucketedMemoryChild is TestBucketedMemory's child process: it runs
// one verify or sweep against the parent's database and broker and prints
// its peak heap.
func TestBucketedMemoryChild(t *testing.T) {
	what := os.Getenv("TIDEMARK_MEM_CHILD")
	if what == "" {
		t.Skip("run by TestBucketedMemory")
	}
	keys, _ := strconv.Atoi(os.Getenv("TIDEMARK_MEM_KEYS"))
	r := &rig.Rig{T: t, Opts: []kgo.Opt{kgo.SeedBrokers(strings.Split(os.Getenv("TIDEMARK_MEM_BROKERS"), ",")...)},
		Name: "sw", Topic: "data", Offsets: "tidemark-offsets", Ledger: "tidemark-ledger"}
	r.PG = postgres.Config{DSN: os.Getenv("TIDEMARK_MEM_DSN"), Schema: os.Getenv("TIDEMARK_MEM_SCHEMA"), Table: "items", DeletedAtColumn: "deleted_at"}
	r.Src = r.Open(r.PG)
	runtime.GC()
	var topAlloc, topLive atomic.Uint64
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			metrics.Read(s)
			topAlloc.Store(max(topAlloc.Load(), m.HeapAlloc))
			topLive.Store(max(topLive.Load(), s[0].Value.Uint64()))
			select {
			case <-done:
				return
			case <-tick.C:
			}
		}
	}()
	var result string
	switch what {
	case "verify":
		rep := verifyWith(r, keys)
		result = fmt.Sprintf("extra=%d missing=%d mismatched=%d live_keys=%d buckets=%+v", rep.Extra, rep.Missing, rep.Mismatched, rep.LiveKeys, rep.Buckets)
	case "sweep":
		res := r.Sweep(connector.Config{SweepMaxKeys: keys, Margin: time.Second})
		result = fmt.Sprintf("tombstoned=%d repaired=%d buckets=%+v", res.Tombstoned, res.Repaired, res.Buckets)
	}
	close(done)
	wg.Wait()
	fmt.Printf("PEAK alloc=%d live=%d %s\n", topAlloc.Load(), topLive.Load(), result)
}
