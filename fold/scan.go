package fold

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// ErrNoTopic is returned by Scan when the topic does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// Scan calls fn for every committed data record of topic (read_committed;
// aborted records and transaction markers are skipped), partition by
// partition in offset order, up to the last stable offsets observed when
// Scan began. opts configure the connection (brokers, TLS, SASL); Scan adds
// its own consumer options.
func Scan(ctx context.Context, opts []kgo.Opt, topic string, fn func(*kgo.Record) error) error {
	return ScanTail(ctx, opts, topic, -1, fn)
}

// ErrStop may be returned by a Scan callback to end the scan early; Scan
// then returns nil.
var ErrStop = errors.New("stop scan")

// ScanTail is Scan over at most the last n offsets of each partition (n < 0:
// all of them).
func ScanTail(ctx context.Context, opts []kgo.Opt, topic string, n int64, fn func(*kgo.Record) error) error {
	adm, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("scan %s: %w", topic, err)
	}
	ends, starts, err := bounds(ctx, kadm.NewClient(adm), topic)
	adm.Close()
	if err != nil {
		return err
	}
	for p, end := range ends {
		if n >= 0 && end-n > starts[p] {
			starts[p] = end - n
		}
	}
	return scanRanges(ctx, opts, topic, starts, ends, nil, fn)
}

// ScanRange calls fn for every committed data record of one partition of
// topic from offset from up to and including offset to, which must be a
// committed data record (so that the scan knows it is done when it sees
// it).
func ScanRange(ctx context.Context, opts []kgo.Opt, topic string, partition int32, from, to int64, fn func(*kgo.Record) error) error {
	return scanRanges(ctx, opts, topic, map[int32]int64{partition: from}, map[int32]int64{partition: to + 1}, []int32{partition}, fn)
}

// scanRanges calls fn for every committed data record of the partitions
// (all of ends when parts is nil) from starts up to ends (exclusive), in
// offset order per partition.
func scanRanges(ctx context.Context, opts []kgo.Opt, topic string, starts, ends map[int32]int64, parts []int32, fn func(*kgo.Record) error) error {
	if parts == nil {
		for p := range ends {
			parts = append(parts, p)
		}
	}
	want := map[int32]kgo.Offset{}
	remaining := map[int32]int64{} // partition -> last offset to reach
	for _, p := range parts {
		end, ok := ends[p]
		if !ok {
			return fmt.Errorf("scan %s: no partition %d", topic, p)
		}
		if end > starts[p] {
			want[p] = kgo.NewOffset().At(starts[p])
			remaining[p] = end - 1
		}
	}
	if len(want) == 0 {
		return nil
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: want}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Markers are kept so that the last offset before the stable end is
		// always seen, even when it closes an aborted transaction.
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return fmt.Errorf("scan %s: %w", topic, err)
	}
	defer cl.Close()
	for len(remaining) > 0 {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("scan %s: %w", topic, err)
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			if ferr == nil {
				ferr = fmt.Errorf("scan %s partition %d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return ferr
		}
		var cberr error
		fs.EachRecord(func(r *kgo.Record) {
			last, ok := remaining[r.Partition]
			if !ok || r.Offset > last || cberr != nil {
				return
			}
			if r.Offset == last {
				delete(remaining, r.Partition)
			}
			if r.Attrs.IsControl() {
				return
			}
			cberr = fn(r)
		})
		if errors.Is(cberr, ErrStop) {
			return nil
		}
		if cberr != nil {
			return cberr
		}
	}
	return nil
}

// bounds lists the start and the last stable (committed) end offsets.
func bounds(ctx context.Context, adm *kadm.Client, topic string) (ends, starts map[int32]int64, err error) {
	endL, err := adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("list end offsets of %s: %w", topic, err)
	}
	startL, err := adm.ListStartOffsets(ctx, topic)
	if err != nil {
		return nil, nil, fmt.Errorf("list start offsets of %s: %w", topic, err)
	}
	ends, starts = map[int32]int64{}, map[int32]int64{}
	for _, ps := range endL {
		for p, o := range ps {
			if errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
				return nil, nil, fmt.Errorf("%s: %w", topic, ErrNoTopic)
			}
			if o.Err != nil {
				return nil, nil, fmt.Errorf("end offset of %s/%d: %w", topic, p, o.Err)
			}
			ends[p] = o.Offset
		}
	}
	if len(ends) == 0 {
		return nil, nil, fmt.Errorf("%s: %w", topic, ErrNoTopic)
	}
	for _, ps := range startL {
		for p, o := range ps {
			if o.Err != nil {
				return nil, nil, fmt.Errorf("start offset of %s/%d: %w", topic, p, o.Err)
			}
			starts[p] = o.Offset
		}
	}
	return ends, starts, nil
}
