package connector

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tidemark/tidemark/schemas"
)

// LiveScanner is implemented by sources that can list every live row (not
// soft-deleted, inside the filter) under one fixed view, for the
// reconciliation sweep and verify. Discovered by type assertion.
type LiveScanner interface {
	// ScanLive calls fn for every live row of one consistent view, and
	// returns when the view was taken.
	ScanLive(ctx context.Context, fn func(*Row) error) (view time.Time, err error)
}

// TopicView reads the live keys of the data topic read_committed, with the
// digest of each key's last value.
type TopicView interface {
	Live(ctx context.Context) (*KeySet, TopicStats, error)
}

// TopicStats describes a topic read.
type TopicStats struct {
	// Records and Tombstones read; Duplicates are records that repeated
	// an earlier record of their key: its previous one, or an earlier
	// version after a newer one (see TopicFold).
	Records, Tombstones, Duplicates int64
	// Backwards are records whose updated_at header is older than an
	// earlier record's of their key (see TopicFold); BackwardsSample
	// names some of their keys, the smallest. Unchecked are those of them
	// whose keys were past the recheck budget: not checked for repeats.
	Backwards, Unchecked int64
	BackwardsSample      []string
	// Undated are records without an updated_at header that reads as a
	// time: tidemark writes one on every record, so another producer
	// wrote them. Such a record is compared by its value alone; the
	// version published after it (A, X, A: the sweep's repair of a key
	// another producer overwrote) is not a repeat of it.
	Undated int64
	// Misplaced are records in a partition their key does not hash to (a
	// changed partition count; see fold.Pinned.Misplaced); 0 when the
	// reader cannot tell.
	Misplaced int64
	// CutShort is how many partitions' views stop before a transaction
	// that stayed open (see fold.ViewWait); 0 when the reader cannot tell.
	CutShort int
	// End is the last stable offset of each partition the read stopped at.
	End map[int32]int64
}

// TopicFold folds a topic's records by key, in offset order per
// partition: Live holds every live key with the digest of its last value,
// and a tombstone deletes. It counts what it read, and as Duplicates every
// record that repeats its key's previous one: the same value with the same
// updated_at header (a record without the header, or after one without,
// repeats by its value alone), or a tombstone right after a tombstone with
// the same updated_at header. Both are one row version published twice:
// the engine dedupes deletes as it dedupes values. (Two deletes of
// different versions, with an insert between them that no pass saw, are
// two versions.)
//
// A version can also come back later, after a newer one: A, B, A. Its
// updated_at header is then older than the key's newest, and such a
// record is counted as Backwards. That alone is no fault (a row's
// updated_at goes back when a transaction that began earlier writes it
// last, and a row dated in the future may be corrected). With Repeats set
// (verify), Add remembers those keys and Recheck reads them again, counting
// as Duplicates the records that repeat an earlier version of their key,
// its value and its updated_at header. A version repeated under the key's
// newest updated_at right after another record with it is not counted: the
// header cannot tell it from a row changed without a new updated_at.
type TopicFold struct {
	Live  *KeySet
	dead  *KeySet // keys whose last record is a tombstone: digest of its updated_at
	Stats TopicStats
	// Repeats makes Add remember the keys that went back in time, for
	// Recheck.
	Repeats bool
	// back holds those keys, up to maxBack (MaxRecheckKeys); once a key
	// was refused, full refuses every further one until Reset.
	back    map[string]struct{}
	maxBack int
	full    bool
	// sample is the smallest keys that went back in time (BackwardsSample).
	sample []string
	// maxVersions bounds the versions Recheck holds (MaxRecheckVersions).
	maxVersions int
}

// MaxRecheckKeys bounds the keys Recheck reads again, and
// MaxRecheckVersions the versions of theirs it holds (8 bytes and a map
// slot each: some 60 MiB at most, both together). The records back in time
// of keys past either bound are counted as Unchecked.
const (
	MaxRecheckKeys     = 1 << 18
	MaxRecheckVersions = 1 << 21
)

// recheckKeys and recheckVersions are the bounds NewTopicFold gives a
// fold (tests lower them).
var recheckKeys, recheckVersions = MaxRecheckKeys, MaxRecheckVersions

// NewTopicFold returns an empty fold sized for n live keys.
func NewTopicFold(n int) *TopicFold {
	return &TopicFold{Live: NewKeySet(n), dead: NewKeySet(16), back: map[string]struct{}{}, maxBack: recheckKeys, maxVersions: recheckVersions}
}

// Add folds one record (value nil: a tombstone; updatedAt its header)
// and reports whether it repeats its key's previous record.
func (f *TopicFold) Add(key, value, updatedAt []byte) (dup bool, err error) {
	f.Stats.Records++
	at := headerTime(updatedAt)
	if at == noTime {
		f.Stats.Undated++
	}
	var newest int64
	if value == nil {
		f.Stats.Tombstones++
		floor := f.Live.Take(string(key))
		dup, newest, err = f.dead.PutVersionAt(string(key), digest(false, updatedAt), 0, at, floor)
	} else {
		floor := f.dead.Take(string(key))
		// The value alone does not tell a version: a row updated only in
		// columns the record leaves out (source.columns without
		// updated_at) is published again with the same value, and that is
		// not a repeat. Its updated_at header tells them apart.
		dup, newest, err = f.Live.PutVersionAt(string(key), digest(false, value), versionOf(updatedAt), at, floor)
	}
	if dup {
		f.Stats.Duplicates++
	}
	if at != noTime && at < newest {
		f.backwards(string(key))
	}
	return dup, err
}

// versionOf fingerprints a record's updated_at header, for TopicFold's
// repeat test; 0 when there is none (a record of another producer), which
// KeySet.PutVersion treats as any version, so that a value repeated
// without a header is still a repeat.
func versionOf(updatedAt []byte) uint32 {
	if len(updatedAt) == 0 {
		return 0
	}
	return uint32(xxhash.Sum64(updatedAt)) | 1
}

// Len is the number of keys the fold holds: live, and deleted last.
func (f *TopicFold) Len() int { return f.Live.Len() + f.dead.Len() }

// Filter keeps only the keys keep accepts.
func (f *TopicFold) Filter(keep func(key string) bool) {
	f.Live.Filter(keep)
	f.dead.Filter(keep)
	maps.DeleteFunc(f.back, func(k string, _ struct{}) bool { return !keep(k) })
	f.sample = slices.DeleteFunc(f.sample, func(k string) bool { return !keep(k) })
}

// Reset empties the fold (its counts too), keeping its memory.
func (f *TopicFold) Reset() {
	f.Live.Reset()
	f.dead.Reset()
	clear(f.back)
	f.full = false
	f.sample = f.sample[:0]
	f.Stats = TopicStats{}
}

// SweepResult is what a sweep did.
type SweepResult struct {
	// View is when the source snapshot was taken.
	View time.Time
	// SourceRows live in the snapshot; TopicKeys live in the topic before.
	SourceRows, TopicKeys int64
	// Tombstoned ids were gone from the source; Repaired ids were missing
	// from the topic or held another value.
	Tombstoned, Repaired int64
	Took                 time.Duration
	// Buckets is set when the topic was compared by buckets (it may hold
	// more live keys than Config.SweepMaxKeys).
	Buckets *BucketStats `json:",omitempty"`
	// Resumed is set when the sweep went on from a part committed before
	// a failure or a crash: Tombstoned and Repaired count that part too,
	// while View, SourceRows and TopicKeys are the resumed scan's (its
	// topic holds the part's repairs and tombstones).
	Resumed bool `json:",omitempty"`
}

func (r SweepResult) String() string {
	s := fmt.Sprintf("sweep at view %s: %d source rows, %d live topic keys, %d tombstoned, %d repaired, took %s",
		schemas.FormatTime(r.View), r.SourceRows, r.TopicKeys, r.Tombstoned, r.Repaired, r.Took.Round(time.Millisecond))
	if b := r.Buckets; b != nil {
		s += fmt.Sprintf(" (by buckets: %d of %d differed, %d rounds, %d partition reads, %d source scans)",
			b.Differing, b.Buckets, b.Rounds, b.TargetReads, b.SourceScans)
	}
	if r.Resumed {
		s += " (resumed from a committed part)"
	}
	return s
}

// Sweep reconciles the topic with the source (docs/design.md, "Deletes and the sweep"): it publishes a
// tombstone for every live topic key whose id is gone from the source, and
// republishes every source row the topic lacks or holds with another value.
//
// Why nothing live is ever tombstoned: the sweep runs inside the engine's
// loop, between passes, so no walk publishes while it runs, and it reads in
// this order: (1) the topic's live keys up to its last stable offsets E,
// then (2) the source under one snapshot S taken after E. Every key in the
// topic at E was read from a source state committed before E, so a row that
// still exists at S is in S; a key absent from S was deleted before S. A row
// inserted or re-inserted after S is absent from both sides or newer than
// the tombstone: the next pass reads it (its updated_at is new) and
// publishes it after the tombstone, so the last record per key is right.
// Repairs publish S's version, which is never older than what the topic held
// at E. A crash mid-sweep leaves its committed tombstones and repairs in the
// topic and the sweep marked in the checkpoint; the next start sweeps again
// from a new E and S and converges.
//
// When the topic may hold more live keys than Config.SweepMaxKeys, the
// comparison goes by buckets (see Compare) and reads each side several
// times; the argument still holds because the views do not move: E is
// fixed once, before S is taken, and every read of the topic stops at E
// (so it never sees the sweep's own records), and every read of the source
// happens in the one snapshot S.
func (e *Engine) Sweep(ctx context.Context, topic TopicView) (SweepResult, error) {
	scanner, ok := e.src.(LiveScanner)
	if !ok {
		return SweepResult{}, fmt.Errorf("the source %T cannot list its live rows, so it cannot be swept: %w", e.src, ErrPermanent)
	}
	e.sweeping = true
	defer func() { e.sweeping = false }()
	if e.cp == nil {
		if err := e.load(ctx, true); err != nil {
			return SweepResult{}, err
		}
	}
	if p := e.cp.Phase; p == schemas.PhaseLoad || p == schemas.PhaseSnapshot {
		// The rows the load has not reached are missing from the topic: a
		// sweep would republish them, and B, pruned to the load's floor,
		// would not stop the resumed load from publishing them again.
		return SweepResult{}, fmt.Errorf("%w (phase %s, committed seq %d): a sweep now would republish every row the load has not reached yet, and the load would then publish them again; "+
			"finish the load with `tidemark run --once` (or let `tidemark run` finish it), then sweep: %w", ErrInitialLoadOpen, p, e.cp.Seq, ErrPermanent)
	}
	if e.cp.Watermark == "" && e.cp.Sweep == nil && (e.keyOrdered() || e.cfg.Consistent) {
		// Nothing loaded yet (a new connector, or a reset to scratch): a
		// sweep would publish every row as missing, and a load that prunes
		// the dedupe set to its own floor (in key order, or consistent)
		// would then publish them again. Those loads leave a watermark
		// even on an empty table; the moving load, whose dedupe floor
		// trails what it has read, leaves none there, and is safe.
		return SweepResult{}, fmt.Errorf("%w: connector %q has not loaded the table yet (no watermark): a sweep now would publish every row, and the initial load would publish them again; "+
			"run `tidemark run --once` (or let `tidemark run` load it), then sweep: %w", ErrInitialLoadOpen, e.cfg.Name, ErrPermanent)
	}
	if e.cfg.SweepMemory != nil {
		keys := e.cfg.SweepMaxKeys
		if keys <= 0 { // the default, or always by buckets: counted as the default
			keys = DefaultMaxKeysInMemory
		}
		defer e.cfg.SweepMemory(keys)()
	}
	start := time.Now()
	resumed := e.cp.Sweep != nil
	if e.cp.Sweep == nil {
		// Committed before anything is read: a sweep stopped before its
		// first repair (a `tidemark sweep` fenced by the process running
		// the connector, say) is then finished by that process's next
		// pass, not forgotten.
		e.cp.Sweep = &schemas.SweepProgress{StartedAt: schemas.FormatTime(e.cfg.Now())}
		if err := e.commit(ctx); err != nil {
			return SweepResult{}, err
		}
	}
	// A sweep resumed after a failure or a crash counts on from what its
	// committed part repaired and tombstoned: those keys now match, so the
	// new scan does not meet them again.
	res := SweepResult{Tombstoned: e.cp.Sweep.Tombstoned, Repaired: e.cp.Sweep.Repaired, Resumed: resumed}
	var lowB int64 = -1 << 63
	if fw := e.fullWatermark(); fw != "" {
		if w, err := schemas.ParseTime(fw); err == nil {
			lowB = w.Add(-e.cfg.Margin).UnixMicro()
		}
	}
	// A sweep transaction is bounded like a walk's: records, bytes and
	// time (an early repair must not hold a transaction open for the
	// whole scan of a large table).
	commitIfFull := func() error {
		if !e.txOpen || !e.txFull() {
			return nil
		}
		e.cp.Sweep.Tombstoned, e.cp.Sweep.Repaired = res.Tombstoned, res.Repaired
		return e.commit(ctx)
	}
	publish := func(r *Row) error {
		if !e.txOpen {
			if err := e.begin(ctx); err != nil {
				return staged("kafka", err)
			}
			e.txStart = e.cfg.Now()
		}
		if err := e.pub.Publish(ctx, r); err != nil {
			return staged("kafka", fmt.Errorf("publish id %s: %w", r.ID, err))
		}
		e.txRecords++
		e.txBytes += int64(len(r.ID) + len(r.Value))
		e.txKeys++
		e.txKeySum += fnv64(r.ID)
		e.cp.Counters.Published++
		if r.Deleted {
			e.cp.Counters.Tombstones++
		}
		// Keep B truthful, so the walk does not publish the same value again.
		ts := r.UpdatedAt.UnixMicro()
		if _, inB := e.b.find(idHash(r.ID)); inB || ts >= lowB {
			e.b.put(r.ID, ts, Digest(r))
		}
		return commitIfFull()
	}
	repair := func(r *Row) error {
		res.Repaired++
		return publish(r)
	}
	cs, err := Compare(ctx, scanner, topic, e.cfg.SweepMaxKeys, CompareFuncs{
		Missing:    repair,
		Mismatched: repair,
		Matched:    func(*Row) error { return commitIfFull() },
		Extra: func(key string, view time.Time) error {
			// The tombstone carries the source's clock (the snapshot's
			// start), like every record the walk publishes, never the
			// host's.
			res.Tombstoned++
			return publish(&Row{ID: key, UpdatedAt: view.UTC().Truncate(time.Microsecond), Deleted: true})
		},
		Progress: commitIfFull,
		TargetRead: func(st TopicStats) error {
			if st.CutShort > 0 {
				// Keys whose last record lies past the open transaction
				// would look older or absent, and be published again.
				return staged("kafka", fmt.Errorf("the view of the topic stops before a transaction still open on %d partition(s) (another producer's, or one that hangs): "+
					"a sweep would compare the source with an incomplete topic; trying again", st.CutShort))
			}
			if st.Misplaced == 0 {
				return nil
			}
			// A key live in two partitions: its old record stays live, and
			// every sweep would publish it again into its new partition.
			// Nothing is published; the sweep is no longer in progress, so
			// that the walk goes on without it.
			e.cp.Sweep = nil
			if err := e.commit(ctx); err != nil {
				return err
			}
			return &StopError{
				Reason: fmt.Sprintf("the topic holds %d records in a partition their key does not hash to (was its partition count changed?): a key can be live in two partitions, "+
					"and a sweep would publish such keys again on every run while their old records stay", st.Misplaced),
				Hint: "the sweep published nothing; re-create the topic with its partition count and run `tidemark reset` to republish into it (`tidemark verify` reports PARTITIONS CHANGED)",
			}
		},
	})
	res.View, res.SourceRows, res.TopicKeys, res.Buckets = cs.View, cs.SourceRows, cs.TargetKeys, cs.Bucketed
	if err != nil {
		e.abort(ctx)
		return res, fmt.Errorf("sweep: %w", err)
	}
	view := cs.View
	res.Took = time.Since(start)
	e.cp.Sweep = nil
	e.cp.LastSweep = &schemas.SweepSummary{
		At: schemas.FormatTime(e.cfg.Now()), View: schemas.FormatTime(view),
		SourceRows: res.SourceRows, TopicKeys: res.TopicKeys, Tombstoned: res.Tombstoned, Repaired: res.Repaired,
	}
	if err := e.commit(ctx); err != nil {
		return res, err
	}
	e.lastSweep = &res
	e.cfg.Observer.ObserveSweep(res)
	e.log.Info(res.String())
	return res, nil
}
