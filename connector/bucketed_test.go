package connector

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

// TestBucketStable: the bucket of a key is the same in every process (it
// does not depend on a random seed) and spreads keys over all buckets.
func TestBucketStable(t *testing.T) {
	for key, want := range map[string]int{"": Bucket(""), "1": Bucket("1")} {
		if got := Bucket(key); got != want {
			t.Errorf("Bucket(%q) = %d then %d", key, want, got)
		}
	}
	// Pinned values: a change of the hash would silently change bucket
	// assignments between builds; make it a visible decision.
	for key, want := range map[string]int{"1": bucketFromHash("1"), "order-42": bucketFromHash("order-42")} {
		if got := Bucket(key); got != want {
			t.Errorf("Bucket(%q) = %d, want %d", key, got, want)
		}
	}
	seen := map[int]int{}
	for i := range 100 * Buckets {
		b := Bucket(fmt.Sprint(i))
		if b < 0 || b >= Buckets {
			t.Fatalf("bucket %d out of range", b)
		}
		seen[b]++
	}
	if len(seen) != Buckets {
		t.Errorf("100 keys per bucket on average reach only %d of %d buckets", len(seen), Buckets)
	}
	for b, n := range seen {
		if n < 40 || n > 180 {
			t.Errorf("bucket %d holds %d of %d keys: badly spread", b, n, 100*Buckets)
		}
	}
}

// bucketFromHash recomputes Bucket from its definition: FNV-1a 64, the
// SplitMix64 finaliser, the top 12 bits.
func bucketFromHash(key string) int {
	h := uint64(14695981039346656037)
	for _, c := range []byte(key) {
		h ^= uint64(c)
		h *= 1099511628211
	}
	h ^= h >> 30
	h *= 0xbf58476d1ce4e5b9
	h ^= h >> 27
	h *= 0x94d049bb133111eb
	h ^= h >> 31
	return int(h >> 52)
}

// TestBucketDigest: order does not matter; any change of key, value or
// multiplicity does, including a pair held twice.
func TestBucketDigest(t *testing.T) {
	keys := []string{"a", "b", "c", "d"}
	var fwd, back BucketDigest
	for i := range keys {
		fwd.Add(keys[i], uint64(i*7))
		back.Add(keys[len(keys)-1-i], uint64((len(keys)-1-i)*7))
	}
	if fwd != back {
		t.Errorf("digest depends on order: %+v vs %+v", fwd, back)
	}
	var other BucketDigest
	for i := range keys {
		other.Add(keys[i], uint64(i*7))
	}
	other.Add("a", 0)
	var twice BucketDigest
	twice.Add("x", 1)
	twice.Add("x", 1)
	var none BucketDigest
	for name, d := range map[string]BucketDigest{"an extra pair": other, "a pair twice": twice, "empty": none} {
		if d == fwd {
			t.Errorf("%s has the same digest", name)
		}
	}
	var swapped BucketDigest // same keys, same values, paired differently
	swapped.Add("a", 7)
	swapped.Add("b", 0)
	swapped.Add("c", 14)
	swapped.Add("d", 21)
	if swapped == fwd {
		t.Error("swapping two keys' values keeps the digest")
	}
	var x1, x2 BucketDigest
	x1.Add("x", 1)
	x2.Add("x", 2)
	if x1 == x2 || x1.N != x2.N {
		t.Errorf("a changed value must change the sum, not the count: %+v %+v", x1, x2)
	}
}

// TestKeySetFilterReset: Filter keeps exactly what keep accepts, and the
// set goes on working (lookups, puts, deletes); Reset empties it. Also with
// key hashes cut to 4 bits, so that the rebuilt index holds long runs of
// keys that share a hash.
func TestKeySetFilterReset(t *testing.T) {
	for _, mask := range []uint32{^uint32(0), 0xf} {
		t.Run(fmt.Sprintf("hash mask %#x", mask), func(t *testing.T) { testKeySetFilterReset(t, NewWeakKeySet(4, mask)) })
	}
}

func testKeySetFilterReset(t *testing.T, ks *KeySet) {
	for i := range 5000 {
		if _, err := ks.Put(fmt.Sprint(i), uint64(i)); err != nil {
			t.Fatal(err)
		}
	}
	ks.Filter(func(k string) bool { return len(k)%2 == 0 })
	want := 0
	for i := range 5000 {
		k := fmt.Sprint(i)
		d, ok := ks.Lookup(k)
		if keep := len(k)%2 == 0; ok != keep || (ok && d != uint64(i)) {
			t.Fatalf("after Filter, key %s: %d %v", k, d, ok)
		}
		if len(k)%2 == 0 {
			want++
		}
	}
	if ks.Len() != want {
		t.Fatalf("Len %d, want %d", ks.Len(), want)
	}
	n := 0
	_ = ks.Each(func(string, uint64) error { n++; return nil })
	if n != want {
		t.Fatalf("Each saw %d keys, want %d", n, want)
	}
	for i := range 100 {
		ks.Delete(fmt.Sprint(10 + i))
		if _, err := ks.Put(fmt.Sprint("new", i), 1); err != nil {
			t.Fatal(err)
		}
	}
	want += 100 - 90 // 100 new keys; of 10..109, the 90 two-digit ones were there
	if _, ok := ks.Lookup("new7"); !ok || ks.Len() != want {
		t.Fatalf("after deletes and puts: len %d, want %d", ks.Len(), want)
	}
	ks.Reset()
	if _, ok := ks.Lookup("new7"); ok || ks.Len() != 0 {
		t.Fatal("Reset left keys")
	}
	if _, err := ks.Put("again", 3); err != nil {
		t.Fatal(err)
	}
	if d, ok := ks.Lookup("again"); !ok || d != 3 || ks.Len() != 1 {
		t.Fatal("put after Reset")
	}
}

// memTopic is a partitioned target with a record history per partition.
type memTopic struct {
	parts map[int32][][3][]byte // key, value (nil = tombstone), updated_at header
	reads int
}

func (m *memTopic) Live(ctx context.Context) (*KeySet, TopicStats, error) {
	f := NewTopicFold(16)
	err := m.Read(ctx, nil, func(k, v, at []byte) error {
		_, err := f.Add(k, v, at)
		return err
	})
	f.Stats.End = m.End()
	return f.Live, f.Stats, err
}

func (m *memTopic) Pin(context.Context) (PinnedTopic, error) { return m, nil }

func (m *memTopic) Parts() []Part {
	var out []Part
	for _, p := range slices.Sorted(maps.Keys(m.parts)) {
		out = append(out, Part{ID: p, Records: int64(len(m.parts[p]))})
	}
	return out
}

func (m *memTopic) Read(_ context.Context, parts []int32, fn func(k, v, at []byte) error) error {
	if parts == nil {
		parts = slices.Sorted(maps.Keys(m.parts))
	}
	for _, p := range parts {
		m.reads++
		for _, r := range m.parts[p] {
			if err := fn(r[0], r[1], r[2]); err != nil {
				return err
			}
		}
	}
	return nil
}

func (m *memTopic) End() map[int32]int64 {
	out := map[int32]int64{}
	for p, rs := range m.parts {
		out[p] = int64(len(rs))
	}
	return out
}

func (m *memTopic) Close(context.Context) error { return nil }

// memSource is a source of live rows that can hold a view.
type memSource struct {
	rows  map[string]string
	scans int
}

var view0 = time.Date(2025, 1, 2, 3, 4, 5, 6000, time.UTC)

func (s *memSource) ScanLive(ctx context.Context, fn func(*Row) error) (time.Time, error) {
	return view0, s.scan(ctx, fn)
}

func (s *memSource) scan(_ context.Context, fn func(*Row) error) error {
	s.scans++
	for _, id := range slices.Sorted(maps.Keys(s.rows)) {
		if err := fn(&Row{ID: id, Value: []byte(s.rows[id])}); err != nil {
			return err
		}
	}
	return nil
}

func (s *memSource) LiveView(context.Context) (LiveView, error) { return memView{s}, nil }

type memView struct{ s *memSource }

func (v memView) Start() time.Time { return view0 }
func (v memView) ScanLive(ctx context.Context, fn func(*Row) error) error {
	return v.s.scan(ctx, fn)
}
func (v memView) Close(context.Context) error { return nil }

type diffSets struct{ missing, mismatched, extra []string }

func runCompare(t *testing.T, src *memSource, tp *memTopic, maxKeys int, repeats bool) (diffSets, CompareStats) {
	t.Helper()
	var d diffSets
	cs, err := Compare(context.Background(), src, tp, maxKeys, CompareFuncs{
		Repeats:    repeats,
		Missing:    func(r *Row) error { d.missing = append(d.missing, r.ID); return nil },
		Mismatched: func(r *Row) error { d.mismatched = append(d.mismatched, r.ID); return nil },
		Extra:      func(k string, _ time.Time) error { d.extra = append(d.extra, k); return nil },
	})
	if err != nil {
		t.Fatalf("Compare(maxKeys %d): %v", maxKeys, err)
	}
	slices.Sort(d.missing)
	slices.Sort(d.mismatched)
	slices.Sort(d.extra)
	return d, cs
}

// TestCompareBucketedEqualsInMemory: on random topics (histories with
// updates, tombstones, repeats of the previous and of an earlier version,
// keys going back in time, 3 partitions) and sources that differ by
// missing, extra and changed keys, every budget gives the in-memory
// outcome and counts, and both count exactly the repeats written; the
// bucketed runs drill into exactly the buckets of the differing keys and
// keep the KeySet within the budget.
func TestCompareBucketedEqualsInMemory(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for seed := range uint64(4) {
		rng := rand.New(rand.NewPCG(seed, 7))
		src := &memSource{rows: map[string]string{}}
		tp := &memTopic{parts: map[int32][][3][]byte{}}
		n := 500 + rng.IntN(3000)
		tick := 0 // every record a newer updated_at, unless given one
		putAt := func(k string, v []byte, at string) {
			p := int32(keyHash(k) % 3)
			tp.parts[p] = append(tp.parts[p], [3][]byte{[]byte(k), v, []byte(at)})
		}
		next := func() string {
			tick++
			return schemas.FormatTime(t0.Add(time.Duration(tick) * time.Millisecond))
		}
		put := func(k string, v []byte) string { at := next(); putAt(k, v, at); return at }
		differ := map[int]bool{}
		var repeats, adjacent, backwards int64
		for i := range n {
			k := fmt.Sprint("k", i)
			v := fmt.Sprintf(`{"id":%d,"v":%d}`, i, rng.IntN(5))
			src.rows[k] = v
			for range rng.IntN(3) { // history: older values, a tombstone
				if rng.IntN(4) == 0 {
					put(k, nil)
				} else {
					put(k, []byte(v+"old"))
				}
			}
			switch x := rng.IntN(100); {
			case x < 2 && seed > 0: // missing from the topic
				differ[Bucket(k)] = true
			case x < 3 && seed > 0: // tombstoned in the topic
				put(k, []byte(v))
				put(k, nil)
				differ[Bucket(k)] = true
			case x < 5 && seed > 0: // stale in the topic
				put(k, []byte(v+"stale"))
				differ[Bucket(k)] = true
			case x < 8: // an earlier version published again after a newer one
				at := put(k, []byte(v+"A"))
				put(k, []byte(v+"B"))
				putAt(k, []byte(v+"A"), at)
				put(k, []byte(v))
				repeats++
				backwards++
			case x < 10: // back in time with a new version (an older transaction wrote last)
				put(k, []byte(v+"B"))
				putAt(k, []byte(v), schemas.FormatTime(t0))
				backwards++
			default:
				at := put(k, []byte(v))
				if x < 15 {
					putAt(k, []byte(v), at) // a duplicate publication
					repeats++
					adjacent++
				}
			}
		}
		for i := range rng.IntN(20) * int(min(seed, 1)) { // extra keys
			k := fmt.Sprint("x", i)
			put(k, []byte("ghost"))
			differ[Bucket(k)] = true
		}
		tp.reads = 0
		_, scs := runCompare(t, src, tp, 1<<30, false)
		if scs.Duplicates != adjacent || tp.reads != len(tp.parts) {
			t.Errorf("seed %d in memory without Repeats (the sweep): %d duplicates in %d partition reads; want %d (the repeats of the previous record) in one read of each of the %d", seed, scs.Duplicates, tp.reads, adjacent, len(tp.parts))
		}
		want, wcs := runCompare(t, src, tp, 1<<30, true)
		if wcs.Bucketed != nil {
			t.Fatal("a large budget compared by buckets")
		}
		if seed == 0 && (len(want.missing)+len(want.mismatched)+len(want.extra) != 0) {
			t.Fatalf("seed 0 is an exact copy, got %+v", want)
		}
		if wcs.Duplicates != repeats || wcs.Backwards != backwards {
			t.Errorf("seed %d in memory: %d duplicates, %d records back in time; wrote %d, %d", seed, wcs.Duplicates, wcs.Backwards, repeats, backwards)
		}
		for _, limit := range []int{-1, 3, 50, 400} {
			tp.reads, src.scans = 0, 0
			got, cs := runCompare(t, src, tp, limit, true)
			name := fmt.Sprintf("seed %d, %d keys, budget %d", seed, n, limit)
			if !slices.Equal(got.missing, want.missing) || !slices.Equal(got.mismatched, want.mismatched) || !slices.Equal(got.extra, want.extra) {
				t.Errorf("%s: differences\n got %+v\nwant %+v", name, got, want)
			}
			if cs.SourceRows != wcs.SourceRows || cs.TargetKeys != wcs.TargetKeys || cs.Records != wcs.Records ||
				cs.Tombstones != wcs.Tombstones || cs.Duplicates != wcs.Duplicates || cs.Backwards != wcs.Backwards ||
				!slices.Equal(cs.BackwardsSample, wcs.BackwardsSample) || !cs.View.Equal(wcs.View) || !maps.Equal(cs.End, wcs.End) {
				t.Errorf("%s: stats %+v, in memory %+v", name, cs, wcs)
			}
			bs := cs.Bucketed
			if bs == nil {
				t.Errorf("%s: not compared by buckets", name)
				continue
			}
			if bs.Differing != len(differ) {
				t.Errorf("%s: drilled into %d buckets, %d hold differing keys", name, bs.Differing, len(differ))
			}
			if limit > 0 && bs.MaxKeys > max(limit+1, 8) {
				t.Errorf("%s: the KeySet held %d keys", name, bs.MaxKeys)
			}
			if bs.TargetReads != tp.reads || bs.SourceScans != src.scans {
				t.Errorf("%s: reported %d target reads, %d source scans; counted %d, %d", name, bs.TargetReads, bs.SourceScans, tp.reads, src.scans)
			}
			if len(differ) == 0 && bs.Rounds != 0 {
				t.Errorf("%s: %d rounds with nothing to drill into", name, bs.Rounds)
			}
			t.Logf("%s: %+v", name, *bs)
		}
	}
}

// TestTopicFold: a tombstone right after the key's tombstone is a second
// publication of the same delete (the engine dedupes tombstones too), as is
// an upsert that repeats the key's value and updated_at; a first tombstone
// of a key never seen, a value after a tombstone, or the same value of a
// newer version (a row touched in columns the record leaves out) is not.
func TestTopicFold(t *testing.T) {
	f := NewTopicFold(4)
	for _, r := range []struct{ k, v, at string }{
		{"a", "1", "t1"}, {"a", "1", "t1"}, // duplicate value
		{"b", "", "t1"}, {"b", "", "t1"}, // a tombstone of a key never seen, then again: duplicate
		{"c", "1", "t1"}, {"c", "", "t2"}, {"c", "1", "t3"}, {"c", "", "t4"}, // delete, re-insert, delete: none
		{"d", "1", "t1"}, {"d", "", "t2"}, {"d", "", "t2"}, {"d", "", "t2"}, // two duplicates
		{"e", "", "t1"}, {"e", "", "t2"}, // two deletes of two versions (an insert between that no pass saw): none
		{"f", "1", "t1"}, {"f", "1", "t2"}, {"f", "1", "t2"}, // a touched row, then that version again: one duplicate
		{"g", "1", ""}, {"g", "1", ""}, // no updated_at header (another producer): the value decides
		{"h", "1", "t1"}, {"h", "1", ""}, {"h", "1", "t2"}, // the value again without a header, then with another: both repeats
	} {
		var v []byte
		if r.v != "" {
			v = []byte(r.v)
		}
		if _, err := f.Add([]byte(r.k), v, []byte(r.at)); err != nil {
			t.Fatal(err)
		}
	}
	if f.Stats.Records != 22 || f.Stats.Tombstones != 9 || f.Stats.Duplicates != 8 || f.Live.Len() != 4 {
		t.Errorf("stats %+v, live keys %d; want 22 records, 9 tombstones, 8 duplicates, 4 live keys", f.Stats, f.Live.Len())
	}
}

// TestTopicFoldRepeatOfAnEarlierVersion: a record that repeats an earlier,
// not the previous, version of its key (same value, same updated_at
// header, older than the key's newest) is a row version published twice
// too; Recheck finds it on a second read of the keys that went back in
// time. A record older than the key's newest with a version never seen (a
// row whose updated_at went back: an older transaction wrote it last) is
// counted as Backwards, not as a repeat, and so is a value repeated under
// the key's newest updated_at right after another record with it (the
// header cannot tell those versions apart), and a version that comes back
// after a delete of its key (a row restored as it was, which the sweep
// republishes). The newest version repeated after an older record is a
// repeat.
func TestTopicFoldRepeatOfAnEarlierVersion(t *testing.T) {
	at := func(s int) string {
		return schemas.FormatTime(time.Date(2026, 12, 2, 3, 0, s, 123456000, time.UTC))
	}
	type rec struct{ k, v, at string }
	recs := []rec{
		{"a", "A", at(1)}, {"a", "B", at(2)}, {"a", "A", at(1)}, // A again after B: a repeat
		{"b", "A", at(1)}, {"b", "B", at(3)}, {"b", "C", at(2)}, // back in time, a new version: none
		{"c", "A", at(1)}, {"c", "", at(2)}, {"c", "A", at(1)}, // A again after its delete: the row came back (restored), none
		{"d", "", at(1)}, {"d", "A", at(2)}, {"d", "", at(1)}, // the delete again after a re-insert: a repeat
		{"e", "A", at(1)}, {"e", "B", at(2)}, {"e", "A", at(1)}, {"e", "A", at(1)}, // a repeat, then the previous again: two
		{"f", "A", at(2)}, {"f", "B", at(2)}, {"f", "A", at(2)}, // one updated_at for all: none
		{"g", "A", at(1)}, {"g", "B", at(2)}, {"g", "C", at(3)}, {"g", "A", at(1)}, {"g", "D", at(4)}, // far back, then newer: one
		{"h", "A", at(1)}, {"h", "A", ""}, {"h", "B", at(2)}, {"h", "A", at(1)}, // a header-less record between: one
		{"i", "A", at(1)}, {"i", "", at(5)}, {"i", "A", at(1)}, // deleted (the sweep's tombstone, at its view), restored as it was: none
		{"j", "A", at(1)}, {"j", "", at(5)}, {"j", "A", at(1)}, {"j", "B", at(2)}, {"j", "A", at(1)}, // restored, then A again after B: one
		{"k", "A", at(2)}, {"k", "B", at(1)}, {"k", "A", at(2)}, // the newest again after an older one: one
		{"l", "A", at(2)}, {"l", "B", at(2)}, {"l", "C", at(1)}, {"l", "B", at(2)}, // the same, under one updated_at: one
	}
	read := func(fn func(k, v, at []byte) error) error {
		for _, r := range recs {
			var v []byte
			if r.v != "" {
				v = []byte(r.v)
			}
			if err := fn([]byte(r.k), v, []byte(r.at)); err != nil {
				return err
			}
		}
		return nil
	}
	f := NewTopicFold(4)
	f.Repeats = true
	if err := read(func(k, v, at []byte) error { _, err := f.Add(k, v, at); return err }); err != nil {
		t.Fatal(err)
	}
	var keys []string
	if err := f.Recheck(read, func(k string, dup bool) {
		if dup {
			keys = append(keys, k)
		}
	}); err != nil {
		t.Fatal(err)
	}
	slices.Sort(keys)
	// e's second A repeats its previous record: the first read counts it.
	if want := []string{"a", "d", "e", "g", "h", "j", "k", "l"}; !slices.Equal(keys, want) {
		t.Errorf("Recheck found repeats of earlier versions in %v, want %v", keys, want)
	}
	if f.Stats.Duplicates != 10 || f.Stats.Backwards != 14 || f.Stats.Records != int64(len(recs)) {
		t.Errorf("stats %+v; want 10 duplicates (h's header-less A repeats by its value), 14 records back in time", f.Stats)
	}
	if got := f.BackwardsSample(); !slices.Equal(got, []string{"a", "b", "c", "d", "e", "g", "h", "i", "j", "k"}) {
		t.Errorf("keys back in time %v", got)
	}
}

// TestTopicFoldRecheckBudget: past the budget of keys to read again, or
// of versions to hold, the records back in time that cannot be checked
// are counted as Unchecked (verify then cannot prove there was no
// repeat), never dropped silently; the rest are still checked.
func TestTopicFoldRecheckBudget(t *testing.T) {
	at := func(s int) []byte {
		return []byte(schemas.FormatTime(time.Date(2026, 12, 2, 3, 0, s, 0, time.UTC)))
	}
	var recs [][3][]byte
	for _, k := range []string{"a", "b", "c"} {
		recs = append(recs, [3][]byte{[]byte(k), []byte("A"), at(1)}, [3][]byte{[]byte(k), []byte("B"), at(2)}, [3][]byte{[]byte(k), []byte("A"), at(1)})
	}
	read := func(fn func(k, v, at []byte) error) error {
		for _, r := range recs {
			if err := fn(r[0], r[1], r[2]); err != nil {
				return err
			}
		}
		return nil
	}
	foldTwice := func(f *TopicFold) *TopicFold {
		t.Helper()
		f.Repeats = true
		if err := read(func(k, v, at []byte) error { _, err := f.Add(k, v, at); return err }); err != nil {
			t.Fatal(err)
		}
		if err := f.Recheck(read, nil); err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := NewTopicFold(4)
	f.maxBack = 2
	foldTwice(f)
	if f.Stats.Duplicates != 2 || f.Stats.Backwards != 3 || f.Stats.Unchecked != 1 {
		t.Errorf("stats %+v; want 2 duplicates, 3 records back in time, 1 unchecked", f.Stats)
	}

	// Past the budget of versions: a's first version fits, so its repeat
	// is found; none of b's does, so its record back in time is unchecked.
	recs = recs[:6]
	f = NewTopicFold(4)
	f.maxVersions = 1
	foldTwice(f)
	if f.Stats.Duplicates != 1 || f.Stats.Backwards != 2 || f.Stats.Unchecked != 1 {
		t.Errorf("with one version held: stats %+v; want 1 duplicate, 2 records back in time, 1 unchecked", f.Stats)
	}
}

// TestCompareRecheckBudgetSameByBuckets: what the second read cannot check
// (past its budget of versions) is unchecked in memory and by buckets
// alike; by buckets it was lost from the totals.
func TestCompareRecheckBudgetSameByBuckets(t *testing.T) {
	defer func(v int) { recheckVersions = v }(recheckVersions)
	recheckVersions = 1
	at := func(s int) []byte {
		return []byte(schemas.FormatTime(time.Date(2026, 12, 2, 3, 0, s, 0, time.UTC)))
	}
	src := &memSource{rows: map[string]string{}}
	tp := &memTopic{parts: map[int32][][3][]byte{}}
	for _, k := range []string{"a", "b"} {
		src.rows[k] = "A"
		tp.parts[0] = append(tp.parts[0], [3][]byte{[]byte(k), []byte("A"), at(1)}, [3][]byte{[]byte(k), []byte("B"), at(2)}, [3][]byte{[]byte(k), []byte("A"), at(1)})
	}
	_, mem := runCompare(t, src, tp, 1<<30, true)
	_, byBuckets := runCompare(t, src, tp, -1, true)
	if mem.Duplicates != 1 || mem.Unchecked != 1 {
		t.Errorf("in memory: %d duplicates, %d unchecked; want 1, 1", mem.Duplicates, mem.Unchecked)
	}
	if byBuckets.Duplicates != mem.Duplicates || byBuckets.Unchecked != mem.Unchecked || byBuckets.Backwards != mem.Backwards {
		t.Errorf("by buckets: %d duplicates, %d unchecked, %d back in time; in memory %d, %d, %d",
			byBuckets.Duplicates, byBuckets.Unchecked, byBuckets.Backwards, mem.Duplicates, mem.Unchecked, mem.Backwards)
	}
}
