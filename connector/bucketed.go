package connector

import (
	"context"
	"fmt"
	"slices"
)

// Buckets is the number of buckets of a bucketed comparison.
const Buckets = 1 << bucketBits

const bucketBits = 12

// progressEvery is how many records or rows pass between two Progress calls.
const progressEvery = 1024

// Bucket returns the bucket of key, 0..Buckets-1: the top bits of a stable
// 64-bit hash (FNV-1a, mixed), the same in every process.
func Bucket(key string) int { return int(mix64(keyHash(key)) >> (64 - bucketBits)) }

func bucketOf[T ~string | ~[]byte](key T) (bucket int, h uint64) {
	h = keyHash(key)
	return int(mix64(h) >> (64 - bucketBits)), h
}

// keyHash is FNV-1a 64 of key.
func keyHash[T ~string | ~[]byte](key T) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(key); i++ {
		h ^= uint64(key[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is the SplitMix64 finaliser.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// BucketDigest is an order-independent digest of the (key, value digest)
// pairs of one bucket: their count and the sum of a hash of each pair. A
// sum, not a XOR, so that a pair held twice (a key in two partitions) does
// not cancel out.
type BucketDigest struct {
	N   int64
	Sum uint64
}

// Add adds the pair (key, digest), key given by its keyHash.
func (d *BucketDigest) add(keyHash, digest uint64) {
	d.N++
	d.Sum += mix64(keyHash ^ mix64(digest^0x9e3779b97f4a7c15))
}

// Add adds the pair (key, value digest).
func (d *BucketDigest) Add(key string, digest uint64) { d.add(keyHash(key), digest) }

// bucketed is one bucketed comparison (see Compare).
type bucketed struct {
	src   LiveViewer
	pin   PinnedTopic
	f     CompareFuncs
	limit int // most keys in the fold; <= 0: no limit (forced)
	tf    *TopicFold

	target, source [Buckets]BucketDigest
	// Counts of the target's records per bucket: the totals, and those of
	// the current fold (dropped with their buckets when the fold shrinks).
	records, tombstones, duplicate [Buckets]int64
	backwards, unchecked, undated  [Buckets]int64
	backKeys                       []string // the smallest keys with a record back in time
	pass                           [Buckets]passCounts
	groups                         []group
	stats                          CompareStats
	bs                             BucketStats
	sel                            [Buckets]bool
}

type passCounts struct{ records, tombstones, duplicate, backwards, unchecked, undated int64 }

// sumPasses adds phase 1's per-bucket target counts to the stats.
func (c *bucketed) sumPasses() {
	for b := range Buckets {
		c.stats.Records += c.records[b]
		c.stats.Tombstones += c.tombstones[b]
		c.stats.Duplicates += c.duplicate[b]
		c.stats.Backwards += c.backwards[b]
		c.stats.Unchecked += c.unchecked[b]
		c.stats.Undated += c.undated[b]
	}
	c.stats.BackwardsSample = c.backSample()
}

// group is a set of parts folded together in phase 1, and how many live
// keys it holds per bucket.
type group struct {
	ids  []int32
	keys *[Buckets]int32
}

func (c *bucketed) run(ctx context.Context, parts []Part) (CompareStats, error) {
	// The target is fixed (pinned) before the source view is taken, and
	// the view is taken once phase 1 has read the target: a snapshot held
	// open, idle, through a long topic read would hold back vacuum, and a
	// server's idle_in_transaction_session_timeout would end it.
	var view LiveView
	defer func() {
		if view != nil {
			view.Close(context.WithoutCancel(ctx))
		}
	}()
	openView := func() error {
		st := TopicStats{Records: c.stats.Records, Tombstones: c.stats.Tombstones, Duplicates: c.stats.Duplicates, Backwards: c.stats.Backwards,
			Unchecked: c.stats.Unchecked, BackwardsSample: c.stats.BackwardsSample, Undated: c.stats.Undated, Misplaced: misplaced(c.pin), CutShort: cutShort(c.pin), End: c.pin.End()}
		if err := c.f.TargetRead(st); err != nil {
			return err
		}
		v, err := c.src.LiveView(ctx)
		if err != nil {
			return staged("source", fmt.Errorf("open the source view: %w", err))
		}
		view, c.stats.View = v, v.Start()
		return nil
	}
	c.stats.End = c.pin.End()
	c.bs.Buckets = Buckets

	// Phase 1, target: a digest per bucket. A key lives in one partition,
	// so partitions are folded one at a time when their sizes are known;
	// else (a replica) all together.
	known := true
	for _, p := range parts {
		known = known && p.Records >= 0
	}
	for _, p := range parts {
		switch {
		case !known:
			if len(c.groups) == 0 {
				c.groups = append(c.groups, group{keys: new([Buckets]int32)})
			}
			c.groups[0].ids = append(c.groups[0].ids, p.ID)
		case p.Records > 0:
			c.groups = append(c.groups, group{ids: []int32{p.ID}, keys: new([Buckets]int32)})
		}
	}
	for gi := range c.groups {
		g := &c.groups[gi]
		width := Buckets
		for lo := 0; lo < Buckets; {
			hi, err := c.fold(ctx, g.ids, lo, min(Buckets, lo+width))
			if err != nil {
				return c.stats, err
			}
			if c.limit > 0 && len(c.groups) == 1 && lo == 0 && hi == Buckets {
				// Everything fit at once after all: compare directly.
				c.sumPasses()
				if err := openView(); err != nil {
					return c.stats, err
				}
				return c.direct(ctx, view)
			}
			_ = c.tf.Live.Each(func(key string, d uint64) error {
				b, h := bucketOf(key)
				c.target[b].add(h, d)
				g.keys[b]++
				return nil
			})
			width = hi - lo
			if c.limit > 0 && c.tf.Live.Len() < c.limit/2 {
				width *= 2
			}
			lo = hi
		}
	}
	for b := range Buckets {
		c.stats.TargetKeys += c.target[b].N
	}
	c.sumPasses()
	if err := openView(); err != nil {
		return c.stats, err
	}

	// Phase 1, source: one scan.
	n := 0
	err := view.ScanLive(ctx, func(r *Row) error {
		c.stats.SourceRows++
		b, h := bucketOf(r.ID)
		c.source[b].add(h, Digest(r))
		if n++; n%progressEvery == 0 {
			return c.f.Progress()
		}
		return nil
	})
	c.bs.SourceScans++
	if err != nil {
		return c.stats, stagedOnce("source", fmt.Errorf("scan the source: %w", err))
	}

	// Phase 2: drill down into the differing buckets, in rounds whose
	// target keys fit the budget (at least one bucket per round).
	var round []int
	var keys int64
	flush := func() error {
		if len(round) == 0 {
			return nil
		}
		err := c.drill(ctx, view, round)
		round, keys = round[:0], 0
		return err
	}
	for b := range Buckets {
		if c.target[b] == c.source[b] {
			continue
		}
		c.bs.Differing++
		if c.limit > 0 && len(round) > 0 && keys+c.target[b].N > int64(c.limit) {
			if err := flush(); err != nil {
				return c.stats, err
			}
		}
		round = append(round, b)
		keys += c.target[b].N
	}
	if err := flush(); err != nil {
		return c.stats, err
	}
	c.stats.Bucketed = &c.bs
	return c.stats, nil
}

// fold reads parts into the KeySet, keeping the keys of buckets lo..hi-1
// and counting their records. When the set outgrows the budget it drops the
// upper half of the range (and its counts) and goes on with the lower half;
// it returns the hi it ended with.
func (c *bucketed) fold(ctx context.Context, parts []int32, lo, hi int) (int, error) {
	c.tf.Reset()
	clear(c.pass[lo:hi])
	n := 0
	back, err := readParts(ctx, c.pin, parts, c.tf, func(key, value, at []byte) error {
		b, _ := bucketOf(key)
		if b < lo || b >= hi {
			return nil
		}
		pc := &c.pass[b]
		pc.records++
		if value == nil {
			pc.tombstones++
		}
		back, unchecked, undated := c.tf.Stats.Backwards, c.tf.Stats.Unchecked, c.tf.Stats.Undated
		dup, err := c.tf.Add(key, value, at)
		if err != nil {
			return err
		}
		if dup {
			pc.duplicate++
		}
		pc.backwards += c.tf.Stats.Backwards - back
		pc.unchecked += c.tf.Stats.Unchecked - unchecked
		pc.undated += c.tf.Stats.Undated - undated
		if c.limit > 0 && c.tf.Len() > c.limit && hi-lo > 1 {
			mid := lo + (hi-lo)/2
			c.tf.Filter(func(k string) bool { return Bucket(k) < mid })
			hi = mid
		}
		c.bs.MaxKeys = max(c.bs.MaxKeys, c.tf.Len())
		if n++; n%progressEvery == 0 {
			return c.f.Progress()
		}
		return nil
	})
	c.bs.TargetReads += len(parts)
	if err != nil {
		return hi, stagedOnce("kafka", fmt.Errorf("read the target, buckets %d..%d: %w", lo, hi-1, err))
	}
	// Keys of these buckets went back in time: read their parts again for
	// repeats of earlier versions (TopicFold.Recheck).
	err = c.tf.Recheck(func(fn func(key, value, at []byte) error) error {
		c.bs.TargetReads += len(back)
		return readAgain(ctx, c.pin, back, func(key, value, at []byte) error {
			if b, _ := bucketOf(key); b < lo || b >= hi {
				return nil
			}
			return fn(key, value, at)
		})
	}, func(key string, dup bool) {
		b, _ := bucketOf(key)
		if dup {
			c.pass[b].duplicate++
		} else {
			c.pass[b].unchecked++
		}
	})
	if err != nil {
		return hi, stagedOnce("kafka", fmt.Errorf("read the target again for keys back in time, buckets %d..%d: %w", lo, hi-1, err))
	}
	for b := lo; b < hi; b++ {
		c.records[b] += c.pass[b].records
		c.tombstones[b] += c.pass[b].tombstones
		c.duplicate[b] += c.pass[b].duplicate
		c.backwards[b] += c.pass[b].backwards
		c.unchecked[b] += c.pass[b].unchecked
		c.undated[b] += c.pass[b].undated
	}
	for _, k := range c.tf.BackwardsSample() {
		if !slices.Contains(c.backKeys, k) { // a misplaced key is in two partitions
			c.backKeys = SmallestKeys(c.backKeys, k, backSample)
		}
	}
	return hi, nil
}

// backSample is the sample of keys back in time, sorted.
func (c *bucketed) backSample() []string {
	out := slices.Clone(c.backKeys)
	slices.Sort(out)
	return out
}

// direct compares the KeySet, which holds the whole target, with one scan
// of the source: the in-memory comparison, inside the fixed views.
func (c *bucketed) direct(ctx context.Context, view LiveView) (CompareStats, error) {
	c.stats.TargetKeys = int64(c.tf.Live.Len())
	err := view.ScanLive(ctx, func(r *Row) error {
		c.stats.SourceRows++
		return compareRow(c.tf.Live, r, &c.f)
	})
	if err != nil {
		return c.stats, stagedOnce("source", fmt.Errorf("scan the source: %w", err))
	}
	return c.stats, c.tf.Live.Unmarked(func(key string, _ uint64) error { return c.f.Extra(key, c.stats.View) })
}

// drill compares the buckets of one round key by key: the target's keys of
// those buckets (only the partitions that hold any) into the KeySet, then
// one scan of the source.
func (c *bucketed) drill(ctx context.Context, view LiveView, round []int) error {
	c.bs.Rounds++
	for _, b := range round {
		c.sel[b] = true
	}
	defer func() {
		for _, b := range round {
			c.sel[b] = false
		}
	}()
	var parts []int32
	for _, g := range c.groups {
		for _, b := range round {
			if g.keys[b] > 0 {
				parts = append(parts, g.ids...)
				break
			}
		}
	}
	c.tf.Reset()
	n := 0
	if len(parts) > 0 {
		err := c.pin.Read(ctx, parts, func(key, value, at []byte) error {
			// Only the live keys: the records were counted in the
			// first read.
			if b, _ := bucketOf(key); c.sel[b] {
				if value == nil {
					c.tf.Live.Delete(string(key))
				} else if _, err := c.tf.Live.Put(string(key), digest(false, value)); err != nil {
					return err
				}
			}
			if n++; n%progressEvery == 0 {
				return c.f.Progress()
			}
			return nil
		})
		c.bs.TargetReads += len(parts)
		c.bs.MaxKeys = max(c.bs.MaxKeys, c.tf.Len())
		if err != nil {
			return stagedOnce("kafka", fmt.Errorf("read the target again, %d buckets: %w", len(round), err))
		}
	}
	err := view.ScanLive(ctx, func(r *Row) error {
		if b, _ := bucketOf(r.ID); c.sel[b] {
			return compareRow(c.tf.Live, r, &c.f)
		}
		if n++; n%progressEvery == 0 {
			return c.f.Progress()
		}
		return nil
	})
	c.bs.SourceScans++
	if err != nil {
		return stagedOnce("source", fmt.Errorf("scan the source again, %d buckets: %w", len(round), err))
	}
	return c.tf.Live.Unmarked(func(key string, _ uint64) error { return c.f.Extra(key, c.stats.View) })
}
