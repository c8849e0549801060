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
)

// DefaultViewWait bounds how long fixing a view waits for the
// transactions that had written before it (see ViewWait).
const DefaultViewWait = 10 * time.Second

// ViewWait says how a read fixes its view of a topic: Topic.Pin and
// Topic.Live, Scan and ScanTail.
//
// A view ends at each partition's last stable offset. Apache Kafka writes
// a transaction's markers after EndTxn has returned, so right after a
// commit the last stable offset can still stop before that transaction
// (README, "Against Apache Kafka"): a verify or a sweep would miss it.
// Fixing a view therefore waits until, on every partition, the last
// stable offset has reached the high watermark listed first: then every
// transaction that had written anything before the view was fixed is
// resolved, committed or aborted. A transaction that writes its first
// record later lies at or after that high watermark and is not waited
// for. A transaction that stays open longer than Timeout (a slow or dead
// writer of another connector, say) ends the wait: the view stops before
// it, and the partition is reported as an OpenTxn.
type ViewWait struct {
	// Timeout bounds the wait: 0 is DefaultViewWait, negative does not
	// wait.
	Timeout time.Duration
	// Report, when set, is called for each partition whose view stops
	// before an open transaction.
	Report func(OpenTxn)
}

// OpenTxn is a partition whose view stops before a transaction that was
// still open when the view was fixed.
type OpenTxn struct {
	Topic     string
	Partition int32
	// Offset is where the view stops: the partition's last stable offset,
	// the first offset of the oldest transaction still open.
	Offset int64
	// HighWatermark is the partition's end when the view was fixed; the
	// offsets from Offset up to it are not in the view.
	HighWatermark int64
}

func (o OpenTxn) String() string {
	return fmt.Sprintf("%s partition %d: a transaction is still open at offset %d; the view stops before it (offsets %d to %d are not read)",
		o.Topic, o.Partition, o.Offset, o.Offset, o.HighWatermark-1)
}

type viewWaitKey struct{}

// WithViewWait returns ctx carrying w, for the reads that take no
// ViewWait of their own: Scan and ScanTail (and so offsets.Store and
// offsets.Ledger), and a Topic whose Wait is zero.
func WithViewWait(ctx context.Context, w ViewWait) context.Context {
	return context.WithValue(ctx, viewWaitKey{}, w)
}

// ViewWaitOf returns the ViewWait ctx carries, if any.
func ViewWaitOf(ctx context.Context) (ViewWait, bool) {
	w, ok := ctx.Value(viewWaitKey{}).(ViewWait)
	return w, ok
}

// or returns w with its zero fields taken from ctx (WithViewWait), then
// from the defaults.
func (w ViewWait) or(ctx context.Context) ViewWait {
	c, _ := ctx.Value(viewWaitKey{}).(ViewWait)
	if w.Timeout == 0 {
		w.Timeout = c.Timeout
	}
	if w.Timeout == 0 {
		w.Timeout = DefaultViewWait
	}
	if w.Report == nil {
		w.Report = c.Report
	}
	return w
}

// bounds fixes a view of topic (see ViewWait): its start offsets, its end
// offsets, and the partitions whose end stops before an open transaction.
// The high watermarks are listed first, then the last stable offsets
// until each has reached its partition's high watermark or w.Timeout has
// passed, polling with a backoff from viewPollMin up to viewPollMax.
func bounds(ctx context.Context, adm *kadm.Client, topic string, w ViewWait) (ends, starts map[int32]int64, open []OpenTxn, err error) {
	fail := func(what string, err error) error {
		if errors.Is(err, ErrNoTopic) {
			return fmt.Errorf("%s: %w", topic, ErrNoTopic)
		}
		return fmt.Errorf("%s of %s: %w", what, topic, err)
	}
	hwm, err := listed(adm.ListEndOffsets(ctx, topic))
	if err != nil {
		return nil, nil, nil, fail("high watermarks", err)
	}
	deadline := time.Now().Add(w.Timeout)
	for n := 1; ; n++ {
		if ends, err = listed(adm.ListCommittedOffsets(ctx, topic)); err != nil {
			return nil, nil, nil, fail("last stable offsets", err)
		}
		open = open[:0]
		for _, p := range slices.Sorted(maps.Keys(ends)) {
			if ends[p] < hwm[p] {
				open = append(open, OpenTxn{Topic: topic, Partition: p, Offset: ends[p], HighWatermark: hwm[p]})
			}
		}
		left := time.Until(deadline)
		if len(open) == 0 || w.Timeout < 0 || left <= 0 {
			break
		}
		if err := sleep(ctx, min(backoff(n, viewPollMin, viewPollMax), left)); err != nil {
			return nil, nil, nil, fmt.Errorf("fix the view of %s: %w", topic, err)
		}
	}
	if starts, err = listed(adm.ListStartOffsets(ctx, topic)); err != nil {
		return nil, nil, nil, fail("start offsets", err)
	}
	if w.Report != nil {
		for _, o := range open {
			w.Report(o)
		}
	}
	return ends, starts, open, nil
}

// The last stable offsets are polled after a backoff that doubles from
// viewPollMin up to viewPollMax.
const (
	viewPollMin = 10 * time.Millisecond
	viewPollMax = 250 * time.Millisecond
)

// listed turns a listing of one topic's offsets into partition -> offset.
func listed(l kadm.ListedOffsets, err error) (map[int32]int64, error) {
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, ps := range l {
		for p, o := range ps {
			if errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
				return nil, ErrNoTopic
			}
			if o.Err != nil {
				return nil, fmt.Errorf("partition %d: %w", p, o.Err)
			}
			out[p] = o.Offset
		}
	}
	if len(out) == 0 {
		return nil, ErrNoTopic
	}
	return out, nil
}
