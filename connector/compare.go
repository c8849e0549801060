package connector

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// DefaultMaxKeysInMemory is the default budget of a comparison: the most
// live target keys held in one KeySet (some 56 bytes each, so about
// 212 MiB).
const DefaultMaxKeysInMemory = 4_000_000

// LiveViewer is implemented by sources that can hold one consistent view
// open for several scans, which a bucketed comparison needs. Discovered by
// type assertion.
type LiveViewer interface {
	LiveView(ctx context.Context) (LiveView, error)
}

// LiveView is one fixed view of a source's live rows, scanned as often as
// needed. Close it: it holds a connection and a transaction.
type LiveView interface {
	// Start is when the view was taken (the view boundary).
	Start() time.Time
	// ScanLive calls fn for every live row of the view.
	ScanLive(ctx context.Context, fn func(*Row) error) error
	Close(ctx context.Context) error
}

// TopicPinner is implemented by targets that can be read several times at
// one fixed view (a topic up to fixed end offsets), which a bucketed
// comparison needs. Discovered by type assertion.
type TopicPinner interface {
	Pin(ctx context.Context) (PinnedTopic, error)
}

// ErrCannotPin is returned by a TopicPinner that cannot fix its view after
// all; Compare then holds the whole target in memory.
var ErrCannotPin = errors.New("cannot fix the view")

// PinnedTopic is a target fixed at one view.
type PinnedTopic interface {
	// Parts lists the pieces of the target that hold disjoint keys (a
	// topic's partitions), each with how many records it holds: an upper
	// bound on its live keys, or -1 when unknown.
	Parts() []Part
	// Read calls fn for every record of parts (all of them when nil), in
	// order within each part, up to the pinned view; a nil value is a
	// tombstone.
	Read(ctx context.Context, parts []int32, fn func(key, value, updatedAt []byte) error) error
	// End is the view: partition -> the offset reads stop at (nil for a
	// target without offsets).
	End() map[int32]int64
	Close(ctx context.Context) error
}

// Part is one piece of a pinned target.
type Part struct {
	ID      int32
	Records int64
}

// CompareFuncs receive what a comparison finds. Nil funcs do nothing.
type CompareFuncs struct {
	// Missing: a source row the target lacks. Mismatched: a source row the
	// target holds with another value. Matched: the same value.
	Missing, Mismatched, Matched func(*Row) error
	// Extra: a target key that is not live in the source, with the time
	// the source view was taken (the source's clock).
	Extra func(key string, view time.Time) error
	// Progress is called now and then during long reads (the sweep commits
	// a full transaction there, so none stays open for a whole scan).
	Progress func() error
	// Repeats counts as duplicates the repeats of an earlier version after
	// a newer one too (verify), reading again the parts of a pinned target
	// where keys went back in time (TopicFold.Recheck). The sweep, which
	// repairs state and reports no duplicates, leaves it unset.
	Repeats bool
	// TargetRead, when set, is called once the whole target has been read
	// and before the source is scanned or any other func is called, with
	// what the read found; an error ends the comparison there. The sweep
	// stops on records outside their key's partition.
	TargetRead func(TopicStats) error
}

func (f *CompareFuncs) defaults() {
	nop := func(*Row) error { return nil }
	for _, p := range []*func(*Row) error{&f.Missing, &f.Mismatched, &f.Matched} {
		if *p == nil {
			*p = nop
		}
	}
	if f.Extra == nil {
		f.Extra = func(string, time.Time) error { return nil }
	}
	if f.Progress == nil {
		f.Progress = func() error { return nil }
	}
	if f.TargetRead == nil {
		f.TargetRead = func(TopicStats) error { return nil }
	}
}

// cutShort is how many of a pinned target's partitions' views stop before
// an open transaction, when it tells.
func cutShort(pin PinnedTopic) int {
	if c, ok := pin.(interface{ CutShort() int }); ok {
		return c.CutShort()
	}
	return 0
}

// misplaced is a pinned target's count of records outside their key's
// partition, when it counts them.
func misplaced(pin PinnedTopic) int64 {
	if m, ok := pin.(interface{ Misplaced() int64 }); ok {
		return m.Misplaced()
	}
	return 0
}

// CompareStats describes a comparison.
type CompareStats struct {
	// View is when the source view was taken.
	View time.Time
	// SourceRows live in the source view; TargetKeys live in the target.
	SourceRows, TargetKeys int64
	// Records, Tombstones, Duplicates, Backwards (and their keys' sample)
	// and Unchecked read from the target (see TopicStats); End is the
	// target view.
	Records, Tombstones, Duplicates int64
	Backwards, Unchecked            int64
	BackwardsSample                 []string
	// Undated are target records without a readable updated_at header
	// (see TopicStats).
	Undated int64
	// Misplaced are target records outside their key's partition (see
	// TopicStats).
	Misplaced int64
	// CutShort is how many partitions' views of the target stop before a
	// transaction that stayed open (see TopicStats).
	CutShort int
	End      map[int32]int64
	// Bucketed is set when the comparison went by buckets.
	Bucketed *BucketStats
}

// BucketStats describes a bucketed comparison: the cost beyond one read of
// each side.
type BucketStats struct {
	// Buckets compared; Differing buckets were read again (drilled into).
	Buckets   int `json:"buckets"`
	Differing int `json:"differing"`
	// Rounds of drilling down, each one read of the target's partitions
	// that hold keys of its buckets and one scan of the source.
	Rounds int `json:"rounds"`
	// TargetReads counts the reads of one partition (or a whole replica);
	// SourceScans the scans of the source view.
	TargetReads int `json:"target_reads"`
	SourceScans int `json:"source_scans"`
	// MaxKeys is the most keys the KeySet held at once.
	MaxKeys int `json:"max_keys"`
}

// Compare compares the live rows of src with the live keys of target, by
// key and content digest, and reports every difference to f. The target is
// always fixed before the source view is taken (see Engine.Sweep for why
// the sweep needs that order).
//
// maxKeys is the memory budget in live target keys (0: the default,
// DefaultMaxKeysInMemory; negative: always compare in buckets). When the
// target may hold more (its record count, an upper bound on its live keys,
// exceeds the budget), and both sides can be fixed (TopicPinner,
// LiveViewer), the comparison goes by buckets: bucket = Bucket(key). Phase
// 1 folds the target one partition at a time, and within a partition one
// range of buckets at a time so the KeySet stays within the budget, into a
// digest per bucket; one scan of the source does the same. Phase 2 reads
// again, in rounds that fit the budget, only the buckets whose digests
// differ, and compares them key by key as the in-memory comparison does.
// The outcome is the same; the cost is the extra reads.
func Compare(ctx context.Context, src LiveScanner, target TopicView, maxKeys int, f CompareFuncs) (CompareStats, error) {
	f.defaults()
	if maxKeys == 0 {
		maxKeys = DefaultMaxKeysInMemory
	}
	pinner, okT := target.(TopicPinner)
	if !okT {
		return compareInMemory(ctx, src, target, f)
	}
	pin, err := pinner.Pin(ctx)
	if errors.Is(err, ErrCannotPin) {
		return compareInMemory(ctx, src, target, f)
	}
	if err != nil {
		return CompareStats{}, staged("kafka", fmt.Errorf("fix the target view: %w", err))
	}
	defer pin.Close(context.WithoutCancel(ctx))
	parts := pin.Parts()
	var total int64
	for _, p := range parts {
		if p.Records < 0 {
			total = -1
			break
		}
		total += p.Records
	}
	var cs CompareStats
	viewer, okS := src.(LiveViewer)
	if !okS || maxKeys > 0 && total >= 0 && total <= int64(maxKeys) {
		cs, err = comparePinned(ctx, src, pin, parts, f)
	} else {
		c := &bucketed{src: viewer, pin: pin, f: f, limit: maxKeys, tf: NewTopicFold(1 << 10)}
		c.tf.Repeats = f.Repeats
		cs, err = c.run(ctx, parts)
	}
	cs.Misplaced, cs.CutShort = misplaced(pin), cutShort(pin)
	return cs, err
}

// comparePinned is compareInMemory on a pinned target, read one part at a
// time into one fold and, with f.Repeats, again in the parts where keys
// went back in time.
func comparePinned(ctx context.Context, src LiveScanner, pin PinnedTopic, parts []Part, f CompareFuncs) (CompareStats, error) {
	tf := NewTopicFold(1 << 16)
	tf.Repeats = f.Repeats
	ids := make([]int32, len(parts))
	for i, p := range parts {
		ids[i] = p.ID
	}
	add := func(key, value, at []byte) error {
		_, err := tf.Add(key, value, at)
		return err
	}
	back, err := readParts(ctx, pin, ids, tf, add)
	if err == nil {
		err = tf.Recheck(func(fn func(key, value, at []byte) error) error { return readAgain(ctx, pin, back, fn) }, nil)
	}
	if err != nil {
		return CompareStats{}, staged("kafka", fmt.Errorf("read the live keys of the target: %w", err))
	}
	tf.Stats.End = pin.End()
	tf.Stats.BackwardsSample = tf.BackwardsSample()
	tf.Stats.Misplaced, tf.Stats.CutShort = misplaced(pin), cutShort(pin)
	return compareWith(ctx, src, tf.Live, tf.Stats, f)
}

// compareInMemory holds the whole target in one KeySet and streams the
// source past it.
func compareInMemory(ctx context.Context, src LiveScanner, target TopicView, f CompareFuncs) (CompareStats, error) {
	live, st, err := target.Live(ctx)
	if err != nil {
		return CompareStats{}, staged("kafka", fmt.Errorf("read the live keys of the target: %w", err))
	}
	return compareWith(ctx, src, live, st, f)
}

// compareWith streams the source past the target's live keys.
func compareWith(ctx context.Context, src LiveScanner, live *KeySet, st TopicStats, f CompareFuncs) (CompareStats, error) {
	cs := CompareStats{TargetKeys: int64(live.Len()), Records: st.Records, Tombstones: st.Tombstones, Duplicates: st.Duplicates,
		Backwards: st.Backwards, Unchecked: st.Unchecked, BackwardsSample: st.BackwardsSample, Undated: st.Undated, Misplaced: st.Misplaced, CutShort: st.CutShort, End: st.End}
	if err := f.TargetRead(st); err != nil {
		return cs, err
	}
	view, err := src.ScanLive(ctx, func(r *Row) error {
		cs.SourceRows++
		return compareRow(live, r, &f)
	})
	cs.View = view
	if err != nil {
		return cs, stagedOnce("source", fmt.Errorf("scan the source: %w", err))
	}
	return cs, live.Unmarked(func(key string, _ uint64) error { return f.Extra(key, view) })
}

// compareRow compares one source row with the target's keys, marking the
// key as seen.
func compareRow(live *KeySet, r *Row, f *CompareFuncs) error {
	got, ok := live.Lookup(r.ID)
	if !ok {
		return f.Missing(r)
	}
	live.Mark(r.ID)
	if got != Digest(r) {
		return f.Mismatched(r)
	}
	return f.Matched(r)
}

// stagedOnce tags err with stage unless a stage is already known (a publish
// failing inside a scan is Kafka's).
func stagedOnce(stage string, err error) error {
	var se *stageError
	if errors.As(err, &se) {
		return err
	}
	return staged(stage, err)
}
