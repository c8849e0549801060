// Package verify proves (or disproves) that a topic, or a replica table,
// holds exactly the source's live rows: same key set, same content digest
// per key (docs/design.md, "Proof"). Reaching the end of a walk is not proof; this is.
//
// The target is read first (the topic up to its last stable offsets, or a
// replica under its own snapshot), then the source under one snapshot, and
// the two are compared by key and connector.Digest of the value. Memory is
// one compact KeySet of the target (about 56 bytes per live key), up to
// Options.MaxKeysInMemory keys; a larger target is compared by buckets
// (connector.Compare): per-bucket digests first, then key by key only in
// the buckets that differ, with the same report.
package verify

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// MaxSamples is how many examples of each kind of difference a report keeps.
const MaxSamples = 10

// Report is the result of a comparison.
type Report struct {
	// Target says what was compared with the source ("topic orders", "table
	// public.orders_replica").
	Target string `json:"target"`
	// SourceRows live in the source view; LiveKeys live in the target.
	SourceRows int64 `json:"source_rows"`
	LiveKeys   int64 `json:"live_keys"`
	// Missing: in the source, not in the target. Extra: in the target, not
	// in the source. Mismatched: in both with different content.
	Missing    int64 `json:"missing"`
	Extra      int64 `json:"extra"`
	Mismatched int64 `json:"mismatched"`
	// Duplicates are target records that repeated an earlier record of
	// their key, value and updated_at header: its previous one, or an
	// older version after a newer one (A, B, A). One row version published
	// twice (a newer version with the same value is not one) breaks the
	// exactly-once promise even when the state matches (only visible in
	// the uncompacted part of a topic). They fail the verify too.
	Duplicates int64 `json:"duplicate_publications"`
	// Backwards are target records whose updated_at header is older than
	// an earlier record's of their key; BackwardsSample names the
	// smallest of their keys. Not a failure by itself: a row's updated_at
	// goes back when a transaction that began earlier writes it last, or
	// when a row dated in the future is corrected. The ones that repeat
	// an earlier version are Duplicates. Unchecked of them could not be
	// checked for repeats (too many keys or versions went back): that
	// fails the verify, which then proves nothing about duplicates.
	Backwards       int64    `json:"records_back_in_time"`
	BackwardsSample []string `json:"back_in_time_sample"`
	Unchecked       int64    `json:"back_in_time_unchecked"`
	// Undated are target records without an updated_at header that reads
	// as a time. tidemark writes one on every record, so another producer
	// wrote them into the topic. Reported, not a failure by itself: the
	// version tidemark publishes after one (A, X, A, the sweep's repair
	// of the key X overwrote) restores the source's state and is not
	// counted as a repeat, so a count above 0 says that the repeat counts
	// of those keys rest on that reading.
	Undated int64 `json:"records_without_updated_at"`
	// Misplaced are topic records in a partition their key does not hash
	// to (the producer's partitioner): the partition count changed since
	// they were written, or another producer wrote them. A key may then be
	// live in two partitions, and which record is its last is up to the
	// consumer's read order. They fail the verify too.
	Misplaced int64 `json:"misplaced_records"`
	// CutShort is how many partitions' views of the topic stop before a
	// transaction that stayed open through the view's wait (another
	// producer's, or one that hangs): the records after it were not read,
	// so nothing is proven about them. It fails the verify too.
	CutShort int `json:"partitions_cut_short"`
	// Records and Tombstones read from the topic (0 for a replica).
	Records    int64 `json:"records"`
	Tombstones int64 `json:"tombstones"`
	// SourceView is when the source snapshot was taken; TargetEnd the
	// topic offsets read up to (partition -> next offset).
	SourceView string          `json:"source_view"`
	TargetEnd  map[int32]int64 `json:"target_end,omitempty"`
	// Samples of each kind of difference: the smallest ids, sorted.
	MissingSample    []string `json:"missing_sample"`
	ExtraSample      []string `json:"extra_sample"`
	MismatchedSample []string `json:"mismatched_sample"`
	// Buckets is set when the comparison went by buckets.
	Buckets *connector.BucketStats `json:"buckets,omitempty"`
	Seconds float64                `json:"seconds"`
}

// OK reports whether the target equals the source and holds no duplicate
// publication and no record outside its key's partition.
func (r *Report) OK() bool {
	return r.Matches() && r.Duplicates == 0 && r.Unchecked == 0 && r.Misplaced == 0 && r.CutShort == 0
}

// Matches reports whether the target's live state equals the source's.
func (r *Report) Matches() bool { return r.Missing == 0 && r.Extra == 0 && r.Mismatched == 0 }

// Options tune a comparison.
type Options struct {
	// MaxKeysInMemory is the most live target keys held in memory at once;
	// default connector.DefaultMaxKeysInMemory (0), and a negative value
	// always compares by buckets.
	MaxKeysInMemory int
}

// Compare reads target, then source, and compares them with the default
// Options.
func Compare(ctx context.Context, source connector.LiveScanner, target connector.TopicView, targetName string) (*Report, error) {
	return Options{}.Compare(ctx, source, target, targetName)
}

// Compare fixes the target's view, then the source's, and compares them.
func (o Options) Compare(ctx context.Context, source connector.LiveScanner, target connector.TopicView, targetName string) (*Report, error) {
	start := time.Now()
	r := &Report{Target: targetName, MissingSample: []string{}, ExtraSample: []string{}, MismatchedSample: []string{}}
	cs, err := connector.Compare(ctx, source, target, o.MaxKeysInMemory, connector.CompareFuncs{
		Repeats: true,
		Missing: func(row *connector.Row) error {
			r.Missing++
			r.MissingSample = sample(r.MissingSample, row.ID)
			return nil
		},
		Mismatched: func(row *connector.Row) error {
			r.Mismatched++
			r.MismatchedSample = sample(r.MismatchedSample, row.ID)
			return nil
		},
		Extra: func(key string, _ time.Time) error {
			r.Extra++
			r.ExtraSample = sample(r.ExtraSample, key)
			return nil
		},
	})
	if err != nil {
		return nil, fmt.Errorf("compare %s with the source: %w", targetName, err)
	}
	r.SourceRows, r.LiveKeys, r.Duplicates, r.Misplaced, r.CutShort = cs.SourceRows, cs.TargetKeys, cs.Duplicates, cs.Misplaced, cs.CutShort
	r.Backwards, r.Unchecked, r.BackwardsSample = cs.Backwards, cs.Unchecked, cs.BackwardsSample
	if r.BackwardsSample == nil {
		r.BackwardsSample = []string{}
	}
	if cs.End != nil { // a topic; a replica has no records to count, and no headers
		r.Records, r.Tombstones, r.TargetEnd, r.Undated = cs.Records, cs.Tombstones, cs.End, cs.Undated
	}
	r.SourceView = schemas.FormatTime(cs.View)
	r.Buckets = cs.Bucketed
	sort.Strings(r.MissingSample)
	sort.Strings(r.ExtraSample)
	sort.Strings(r.MismatchedSample)
	r.Seconds = time.Since(start).Seconds()
	return r, nil
}

// sample keeps the MaxSamples smallest ids (by string order), so that the
// samples do not depend on the order the comparison met the differences
// in (in memory or by buckets).
func sample(s []string, id string) []string { return connector.SmallestKeys(s, id, MaxSamples) }

// Text renders the report for people.
func (r *Report) Text() string {
	var b strings.Builder
	verdict := "MATCH: the target holds exactly the source's live rows"
	switch {
	case r.CutShort > 0:
		verdict = fmt.Sprintf("UNPROVEN: the topic view stops before a transaction still open on %d partition(s) (another producer's, or one that hangs until the broker's transaction timeout); the records after it were not read: run verify again once it has ended", r.CutShort)
	case !r.Matches():
		verdict = "MISMATCH: the target differs from the source"
	case r.Misplaced > 0:
		verdict = fmt.Sprintf("PARTITIONS CHANGED: %d records are in a partition their key does not hash to (was the topic's partition count changed?); a key can be live in two partitions, in an order no consumer knows: re-create the topic and run `tidemark reset` to republish", r.Misplaced)
	case r.Duplicates > 0:
		verdict = fmt.Sprintf("EXACTLY-ONCE VIOLATED: the state matches, but %d row versions were published twice", r.Duplicates)
	case r.Unchecked > 0:
		verdict = fmt.Sprintf("UNPROVEN: the state matches, but %d records back in time could not be checked for repeats of an earlier version (too many keys or versions went back); verify by buckets, each range with a budget of its own: --sweep.max_keys_in_memory 200000", r.Unchecked)
	}
	fmt.Fprintf(&b, "verify %s against the source\n", r.Target)
	fmt.Fprintf(&b, "  source view:   snapshot at %s\n", r.SourceView)
	if len(r.TargetEnd) > 0 {
		parts := make([]string, 0, len(r.TargetEnd))
		for p, o := range r.TargetEnd {
			parts = append(parts, fmt.Sprintf("%d:%d", p, o))
		}
		sort.Strings(parts)
		fmt.Fprintf(&b, "  target view:   read_committed up to offsets %s (%d records, %d tombstones)\n", strings.Join(parts, " "), r.Records, r.Tombstones)
	}
	fmt.Fprintf(&b, "  source rows:   %d\n", r.SourceRows)
	fmt.Fprintf(&b, "  live keys:     %d\n", r.LiveKeys)
	fmt.Fprintf(&b, "  missing:       %d %s\n", r.Missing, list(r.MissingSample))
	fmt.Fprintf(&b, "  extra:         %d %s\n", r.Extra, list(r.ExtraSample))
	fmt.Fprintf(&b, "  mismatched:    %d %s\n", r.Mismatched, list(r.MismatchedSample))
	fmt.Fprintf(&b, "  duplicate publications: %d\n", r.Duplicates)
	if len(r.TargetEnd) > 0 {
		fmt.Fprintf(&b, "  records back in time: %d %s\n", r.Backwards, list(r.BackwardsSample))
		if r.Unchecked > 0 {
			fmt.Fprintf(&b, "    not checked for repeats: %d\n", r.Unchecked)
		}
		if r.Undated > 0 {
			fmt.Fprintf(&b, "  records without an updated_at header: %d (tidemark writes one on every record: another producer wrote into the topic)\n", r.Undated)
		}
	}
	if len(r.TargetEnd) > 0 {
		fmt.Fprintf(&b, "  records outside their key's partition: %d\n", r.Misplaced)
	}
	if bs := r.Buckets; bs != nil {
		fmt.Fprintf(&b, "  by buckets:    %d of %d differed, %d rounds, %d partition reads, %d source scans\n",
			bs.Differing, bs.Buckets, bs.Rounds, bs.TargetReads, bs.SourceScans)
	}
	fmt.Fprintf(&b, "%s (%.1fs)\n", verdict, r.Seconds)
	return b.String()
}

func list(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return "e.g. " + strings.Join(s, ", ")
}

// Scanned adapts a LiveScanner (a replica table) to a TopicView, so a
// replica can be the target of Compare. When the replica is also a
// LiveViewer, it can be pinned (held in one snapshot) and compared by
// buckets.
type Scanned struct{ connector.LiveScanner }

var (
	_ connector.TopicView   = Scanned{}
	_ connector.TopicPinner = Scanned{}
)

// Live scans every live row into a KeySet.
func (s Scanned) Live(ctx context.Context) (*connector.KeySet, connector.TopicStats, error) {
	ks := connector.NewKeySet(1 << 16)
	_, err := s.ScanLive(ctx, func(r *connector.Row) error {
		_, err := ks.Put(r.ID, connector.Digest(r))
		return err
	})
	return ks, connector.TopicStats{}, err
}

// Pin opens one view of the replica: a single part of unknown size, read
// as often as needed.
func (s Scanned) Pin(ctx context.Context) (connector.PinnedTopic, error) {
	lv, ok := s.LiveScanner.(connector.LiveViewer)
	if !ok {
		return nil, fmt.Errorf("%T: %w", s.LiveScanner, connector.ErrCannotPin)
	}
	v, err := lv.LiveView(ctx)
	if err != nil {
		return nil, err
	}
	return scannedPin{v}, nil
}

type scannedPin struct{ v connector.LiveView }

func (p scannedPin) Parts() []connector.Part { return []connector.Part{{ID: 0, Records: -1}} }

func (p scannedPin) Read(ctx context.Context, _ []int32, fn func(key, value, updatedAt []byte) error) error {
	return p.v.ScanLive(ctx, func(r *connector.Row) error { return fn([]byte(r.ID), r.Value, nil) })
}

func (p scannedPin) End() map[int32]int64 { return nil }

func (p scannedPin) Close(ctx context.Context) error { return p.v.Close(ctx) }
