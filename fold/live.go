package fold

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// Topic reads a data topic's live keys for the sweep and verify.
type Topic struct {
	Opts  []kgo.Opt
	Topic string
	// Wait says how Live and Pin fix the view (see ViewWait); its zero
	// fields are taken from the context's (WithViewWait), then from the
	// defaults. Wait.Report is how a caller learns that a view stops
	// before an open transaction (Pinned.Open lists them too).
	Wait ViewWait
	// SameRecords has every whole read of a pinned partition give as many
	// records as the first, failing otherwise: compaction between two
	// reads removes records, which changes verify's counts (duplicate
	// publications, repeats). A fold of live keys and last values, the
	// sweep's, is the same either way, so it leaves this unset.
	SameRecords bool
}

var (
	_ connector.TopicView   = Topic{}
	_ connector.TopicPinner = Topic{}
)

// Live folds the topic read_committed, up to the last stable offsets when
// it began, into a compact key set: every live key with the digest of its
// last value (connector.Digest, so it compares with source rows directly),
// counting repeats of the previous record (connector.TopicFold).
// Memory grows with the live keys, not the records.
func (t Topic) Live(ctx context.Context) (*connector.KeySet, connector.TopicStats, error) {
	pin, err := t.pin(ctx)
	if err != nil {
		return nil, connector.TopicStats{}, err
	}
	f := connector.NewTopicFold(1 << 16)
	err = pin.Read(ctx, nil, func(key, value, at []byte) error {
		_, err := f.Add(key, value, at)
		return err
	})
	f.Stats.End = pin.End()
	f.Stats.Misplaced = pin.Misplaced()
	f.Stats.CutShort = pin.CutShort()
	return f.Live, f.Stats, err
}

// Pin fixes the topic's view: its start and last stable offsets now, once
// the transactions that had written before are resolved (see ViewWait). Every
// Read of the pinned topic stops at those offsets, so records committed
// later (a sweep's own) are never seen.
func (t Topic) Pin(ctx context.Context) (connector.PinnedTopic, error) { return t.pin(ctx) }

func (t Topic) pin(ctx context.Context) (*Pinned, error) {
	adm, err := kgo.NewClient(t.Opts...)
	if err != nil {
		return nil, fmt.Errorf("pin %s: %w", t.Topic, err)
	}
	ends, starts, open, err := bounds(ctx, kadm.NewClient(adm), t.Topic, t.Wait.or(ctx))
	adm.Close()
	if err != nil {
		return nil, err
	}
	return &Pinned{opts: t.Opts, topic: t.Topic, starts: starts, ends: ends, open: open, checked: map[int32]int64{}, records: map[int32]int64{}, same: t.SameRecords}, nil
}

// Pinned is a topic fixed at the offsets observed by Pin.
type Pinned struct {
	opts         []kgo.Opt
	topic        string
	starts, ends map[int32]int64
	open         []OpenTxn

	mu sync.Mutex
	// checked is, per partition, the offset up to which records were
	// checked against their key's partition; misplaced counts those
	// outside it (each record once, however often it is read).
	checked   map[int32]int64
	misplaced int64
	// records is, per partition, how many records its first whole read
	// gave; with same, every later whole read must give as many (see Read).
	records map[int32]int64
	same    bool
}

// home is the partitioner the producer uses (docs/design.md, "Records"):
// a keyed record goes to murmur2(key) modulo the partition count.
var home = kgo.StickyKeyPartitioner(nil).ForTopic("")

// Misplaced is the number of records read so far that sit in a partition
// their key does not hash to with the topic's current partition count: the
// count changed since they were written, or another producer wrote them.
// A key can then be live in two partitions.
// CutShort is how many partitions' views stop before a transaction that
// stayed open through the wait (see Open).
func (p *Pinned) CutShort() int { return len(p.open) }

func (p *Pinned) Misplaced() int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.misplaced
}

func (p *Pinned) check(r *kgo.Record) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r.Offset < p.checked[r.Partition] || r.Key == nil {
		return
	}
	p.checked[r.Partition] = r.Offset + 1
	if int32(home.Partition(r, len(p.ends))) != r.Partition {
		p.misplaced++
	}
}

var _ connector.PinnedTopic = (*Pinned)(nil)

// Parts lists the partitions with the offsets each holds in the view (an
// upper bound on its live keys: records, tombstones and markers).
func (p *Pinned) Parts() []connector.Part {
	out := make([]connector.Part, 0, len(p.ends))
	for _, id := range slices.Sorted(maps.Keys(p.ends)) {
		out = append(out, connector.Part{ID: id, Records: max(0, p.ends[id]-p.starts[id])})
	}
	return out
}

// Read calls fn for every committed record of parts (nil: all), in offset
// order per partition, up to the pinned end offsets (fetches of at most
// fetchBytes, one partition at a time).
//
// The comparisons read a partition more than once. Verify's counts rely on
// every read giving the same records, and compaction running between two
// reads removes some: with Topic.SameRecords, Read then fails, naming the
// partition, rather than let a second read disagree with the first
// unnoticed. (The live keys and their last values are the same either way.)
func (p *Pinned) Read(ctx context.Context, parts []int32, fn func(key, value, updatedAt []byte) error) error {
	cl, err := kgo.NewClient(p.opts...)
	if err != nil {
		return fmt.Errorf("read %s: %w", p.topic, err)
	}
	defer cl.Close()
	n := map[int32]int64{}
	stopped := false
	err = scanRanges(ctx, cl, p.topic, p.starts, p.ends, parts, func(r *kgo.Record) error {
		p.check(r)
		n[r.Partition]++
		var at []byte
		for _, h := range r.Headers {
			if h.Key == schemas.HeaderUpdatedAt {
				at = h.Value
			}
		}
		err := fn(r.Key, r.Value, at)
		stopped = errors.Is(err, ErrStop)
		return err
	})
	if err != nil || stopped || !p.same {
		return err
	}
	return p.sameRecords(parts, n)
}

// sameRecords compares the records per partition of a whole read with the
// first whole read's.
func (p *Pinned) sameRecords(parts []int32, n map[int32]int64) error {
	if parts == nil {
		parts = slices.Sorted(maps.Keys(p.ends))
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, id := range parts {
		first, ok := p.records[id]
		if !ok {
			p.records[id] = n[id]
			continue
		}
		if first != n[id] {
			return fmt.Errorf("partition %d of %s gave %d records, then %d, within one view: compaction removed records between the two reads; run it again", id, p.topic, first, n[id])
		}
	}
	return nil
}

// End is the pinned last stable offset of each partition.
func (p *Pinned) End() map[int32]int64 { return maps.Clone(p.ends) }

// Open lists the partitions whose view stops before a transaction that
// stayed open through the wait (see ViewWait), by partition.
func (p *Pinned) Open() []OpenTxn { return slices.Clone(p.open) }

// Close releases nothing: a pinned topic holds no connection.
func (p *Pinned) Close(context.Context) error { return nil }
