package fold

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// ErrNoTopic is returned by Scan when the topic does not exist.
var ErrNoTopic = errors.New("topic does not exist")

// Scan calls fn for every committed data record of topic (read_committed;
// aborted records and transaction markers are skipped), partition by
// partition in offset order, up to the view fixed when Scan began: the last
// stable offsets once every transaction that had written before then is
// resolved, within the ViewWait of ctx (WithViewWait; by default up to
// DefaultViewWait). opts configure the connection (brokers, TLS, SASL).
func Scan(ctx context.Context, opts []kgo.Opt, topic string, fn func(*kgo.Record) error) error {
	return ScanTail(ctx, opts, topic, -1, fn)
}

// ErrStop may be returned by a Scan callback to end the scan early; Scan
// then returns nil.
var ErrStop = errors.New("stop scan")

// ScanTail is Scan over at most the last n offsets of each partition (n < 0:
// all of them).
func ScanTail(ctx context.Context, opts []kgo.Opt, topic string, n int64, fn func(*kgo.Record) error) error {
	_, err := ScanOn(ctx, opts, topic, nil, n, fn)
	return err
}

// Position is where a scan's view of a topic ended (ScanOn): the topic's
// id and, per partition, the offset after the view.
type Position struct {
	TopicID [16]byte
	Ends    map[int32]int64
	// Afresh: the scan that returned it did not go on from its from (none,
	// or the topic was created again since): it read as ScanTail reads.
	Afresh bool
}

// ScanOn is ScanTail going on from an earlier scan (from; nil: none): a
// partition of from is read from where from ended (from its start offset
// once retention has passed that), a partition added since from all of
// it. A topic deleted and created again since (another id; with brokers
// before Kafka 2.8, which give no ids, a partition that ends before from)
// is read as ScanTail reads it. It returns where this scan's view ended, the from of
// the next scan, which then reads each committed record once, however
// many were written in between. (After a callback's ErrStop, the scan
// ended early and the returned position is no place to go on from.)
func ScanOn(ctx context.Context, opts []kgo.Opt, topic string, from *Position, n int64, fn func(*kgo.Record) error) (*Position, error) {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("scan %s: %w", topic, err)
	}
	defer cl.Close()
	// The id first: a topic created again between the two reads pairs the
	// old id with the new offsets, and the next scan, seeing another id,
	// reads afresh (the other way round it could skip entries).
	f := &fetcher{cl: cl, topic: topic, dec: kgo.DefaultDecompressor()}
	if err := f.locate(ctx); err != nil {
		return nil, err
	}
	ends, starts, _, err := bounds(ctx, kadm.NewClient(cl), topic, ViewWait{}.or(ctx))
	if err != nil {
		return nil, err
	}
	if from != nil && (from.TopicID != f.id || f.id == [16]byte{} && shrank(from.Ends, ends)) {
		from = nil
	}
	for p, end := range ends {
		var at int64
		var seen bool
		if from != nil {
			at, seen = from.Ends[p]
		}
		switch {
		case seen && at <= end:
			starts[p] = max(starts[p], at)
		case from != nil && !seen:
			// added since from: read from its start
		case n >= 0 && end-n > starts[p]:
			starts[p] = end - n
		}
	}
	if err := f.scanRanges(ctx, starts, ends, nil, fn); err != nil {
		return nil, err
	}
	return &Position{TopicID: f.id, Ends: ends, Afresh: from == nil}, nil
}

// shrank reports whether a partition ends before an earlier view of it
// did.
func shrank(before, now map[int32]int64) bool {
	for p, b := range before {
		if n, ok := now[p]; ok && n < b {
			return true
		}
	}
	return false
}

// ScanRange calls fn for every committed data record of one partition of
// topic from offset from up to and including offset to, which must lie
// below the partition's last stable offset (the scan waits for the range
// to become stable otherwise).
func ScanRange(ctx context.Context, opts []kgo.Opt, topic string, partition int32, from, to int64, fn func(*kgo.Record) error) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("scan %s: %w", topic, err)
	}
	defer cl.Close()
	return scanRanges(ctx, cl, topic, map[int32]int64{partition: from}, map[int32]int64{partition: to + 1}, []int32{partition}, fn)
}

// fetchBytes bounds one fetch response (one partition at a time): the
// callbacks are CPU-bound, so larger fetches buy nothing but heap. A
// record batch larger than this still comes whole (the broker always
// returns the first batch).
const fetchBytes = 1 << 20

// fetchWait is how long a broker may hold a fetch that has nothing stable
// to return yet.
const fetchWait = 500 * time.Millisecond

// A fetch that fails, or that returns nothing past the position, is
// retried after a backoff that doubles from retryMin up to retryMax, so a
// read that cannot progress never spins. maxFailures consecutive failed
// fetches of one partition, or stallLimit without progress, end the scan
// with an error.
const (
	retryMin    = 50 * time.Millisecond
	retryMax    = time.Second
	maxFailures = 20
	stallLimit  = 2 * time.Minute
)

// scanRanges calls fn for every committed data record of the partitions
// (all of ends when parts is nil) from starts up to ends (exclusive), in
// offset order per partition, one partition after the other.
//
// A partition is done when the fetch position reaches its end offset, not
// when a particular record arrives: read_committed never delivers an
// aborted record, nor a marker that lies beyond the last stable offset,
// so the record at end-1 may never be seen (an aborted record whose abort
// marker follows another producer's open transaction, on a topic that
// several connectors share, as the offsets and ledger topics are). The
// scan therefore issues its own read_committed fetches to the partition's
// leader and moves its position by the next offset that
// kgo.ProcessFetchPartition returns for each response: the offset after
// the last whole batch it decoded, aborted batches and markers included.
// The broker returns only batches below its last stable offset, with the
// aborted transactions that overlap them, so every batch below end is
// either delivered (committed data), skipped as aborted, or a marker; and
// the position reaches end exactly when nothing committed below end is
// left.
func scanRanges(ctx context.Context, cl *kgo.Client, topic string, starts, ends map[int32]int64, parts []int32, fn func(*kgo.Record) error) error {
	return (&fetcher{cl: cl, topic: topic, dec: kgo.DefaultDecompressor()}).scanRanges(ctx, starts, ends, parts, fn)
}

// scanRanges is scanRanges with f, located on first use.
func (f *fetcher) scanRanges(ctx context.Context, starts, ends map[int32]int64, parts []int32, fn func(*kgo.Record) error) error {
	topic := f.topic
	if parts == nil {
		parts = slices.Sorted(maps.Keys(ends))
	}
	type span struct {
		p        int32
		from, to int64
	}
	var todo []span
	for _, p := range parts {
		end, ok := ends[p]
		if !ok {
			return fmt.Errorf("scan %s: no partition %d", topic, p)
		}
		if end > starts[p] {
			todo = append(todo, span{p, starts[p], end})
		}
	}
	if len(todo) == 0 {
		return nil
	}
	if f.leaders == nil {
		if err := f.locate(ctx); err != nil {
			return err
		}
	}
	for _, s := range todo {
		if err := f.scan(ctx, s.p, s.from, s.to, fn); err != nil {
			if errors.Is(err, ErrStop) {
				return nil
			}
			return err
		}
	}
	return nil
}

// fetcher reads partitions of one topic read_committed with its own fetch
// requests.
type fetcher struct {
	cl      *kgo.Client
	topic   string
	id      [16]byte
	leaders map[int32]leader
	dec     kgo.Decompressor
}

type leader struct {
	id, epoch int32
	err       error
}

// locate loads the topic's id and partition leaders.
func (f *fetcher) locate(ctx context.Context) error {
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(f.topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, f.cl)
	if err != nil {
		return fmt.Errorf("scan %s: metadata: %w", f.topic, err)
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != f.topic {
			continue
		}
		err := kerr.ErrorForCode(t.ErrorCode)
		if errors.Is(err, kerr.UnknownTopicOrPartition) {
			return fmt.Errorf("%s: %w", f.topic, ErrNoTopic)
		}
		if err != nil {
			return fmt.Errorf("scan %s: metadata: %w", f.topic, err)
		}
		f.id = t.TopicID
		f.leaders = make(map[int32]leader, len(t.Partitions))
		for _, p := range t.Partitions {
			f.leaders[p.Partition] = leader{id: p.Leader, epoch: p.LeaderEpoch, err: kerr.ErrorForCode(p.ErrorCode)}
		}
		return nil
	}
	return fmt.Errorf("%s: %w", f.topic, ErrNoTopic)
}

// fetch issues one read_committed fetch of partition p at pos to its
// leader.
func (f *fetcher) fetch(ctx context.Context, p int32, pos int64) (*kmsg.FetchResponseTopicPartition, error) {
	l, ok := f.leaders[p]
	switch {
	case !ok:
		return nil, kerr.UnknownTopicOrPartition
	case l.err != nil:
		return nil, l.err
	case l.id < 0:
		return nil, kerr.LeaderNotAvailable
	}
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis = int32(fetchWait / time.Millisecond)
	req.MinBytes = 1
	// The partition's limit, not the request's, must be what cuts a
	// response short: kfake leaves the aborted transactions out of a
	// response that fills the request-wide limit, and a read_committed
	// reader without them takes aborted records for committed ones.
	req.MaxBytes = 2 * fetchBytes
	req.IsolationLevel = 1 // read_committed
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = f.topic, f.id // by name before v13, by id after
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.CurrentLeaderEpoch, rp.PartitionMaxBytes = p, pos, l.epoch, fetchBytes
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	kresp, err := f.cl.Broker(int(l.id)).RetriableRequest(ctx, req)
	if err != nil {
		return nil, err
	}
	resp := kresp.(*kmsg.FetchResponse)
	if err := kerr.ErrorForCode(resp.ErrorCode); err != nil {
		return nil, err
	}
	for i := range resp.Topics {
		for j := range resp.Topics[i].Partitions {
			if part := &resp.Topics[i].Partitions[j]; part.Partition == p {
				return part, kerr.ErrorForCode(part.ErrorCode)
			}
		}
	}
	return nil, fmt.Errorf("fetch response without partition %d", p)
}

// scan delivers the committed records of partition p in [pos, end).
func (f *fetcher) scan(ctx context.Context, p int32, pos, end int64, fn func(*kgo.Record) error) error {
	fail := func(err error) error {
		return fmt.Errorf("scan %s partition %d at offset %d: %w", f.topic, p, pos, err)
	}
	var failures, stalls int
	progressed := time.Now()
	for pos < end {
		rp, err := f.fetch(ctx, p, pos)
		if err != nil {
			switch {
			case ctx.Err() != nil:
				return fail(ctx.Err())
			case errors.Is(err, kerr.OffsetOutOfRange):
				// Retention removed the records at pos since the
				// bounds were read: they are gone for every reader,
				// so the read goes on from the new start.
				if start, lerr := f.logStart(ctx, p); lerr == nil && start > pos {
					pos = start
					continue
				}
				return fail(err)
			case failures < maxFailures && (kerr.IsRetriable(err) || !isKerr(err)):
				failures++
				if err := sleep(ctx, backoff(failures, retryMin, retryMax)); err != nil {
					return fail(err)
				}
				if lerr := f.locate(ctx); lerr != nil {
					return lerr
				}
				continue
			default:
				return fail(err)
			}
		}
		failures = 0
		fp, next := kgo.ProcessFetchPartition(kgo.ProcessFetchPartitionOpts{
			Offset:         pos,
			IsolationLevel: kgo.ReadCommitted(),
			Topic:          f.topic,
			Partition:      p,
		}, rp, f.dec, nil)
		if fp.Err != nil {
			return fail(fp.Err)
		}
		for _, r := range fp.Records {
			if r.Offset >= end {
				break
			}
			if err := fn(r); err != nil {
				return err
			}
		}
		if next > pos {
			pos, stalls, progressed = next, 0, time.Now()
			continue
		}
		// Nothing stable past pos yet (the broker already held the
		// fetch for fetchWait): wait, and never for ever.
		if time.Since(progressed) > stallLimit {
			return fail(fmt.Errorf("no progress for %s (the partition's last stable offset is %d, its high watermark %d; the scan reads up to %d)",
				stallLimit, rp.LastStableOffset, rp.HighWatermark, end))
		}
		stalls++
		if err := sleep(ctx, backoff(stalls, retryMin, retryMax)); err != nil {
			return fail(err)
		}
	}
	return nil
}

// logStart lists partition p's log start offset.
func (f *fetcher) logStart(ctx context.Context, p int32) (int64, error) {
	l, err := kadm.NewClient(f.cl).ListStartOffsets(ctx, f.topic)
	if err != nil {
		return 0, err
	}
	o, ok := l.Lookup(f.topic, p)
	if !ok {
		return 0, kerr.UnknownTopicOrPartition
	}
	return o.Offset, o.Err
}

func isKerr(err error) bool {
	var ke *kerr.Error
	return errors.As(err, &ke)
}

// backoff is the wait before the nth retry: lo doubled n-1 times, at most
// hi.
func backoff(n int, lo, hi time.Duration) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	return min(d, hi)
}

// sleep waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
