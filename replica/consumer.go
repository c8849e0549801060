package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Mode says when Run returns.
type Mode int

const (
	// Follow applies records until the context ends.
	Follow Mode = iota
	// Once stops when every partition is caught up with the end (last
	// stable offset) observed when Run began.
	Once
)

// Config configures a Consumer.
type Config struct {
	// Topic is the data topic to fold. Required.
	Topic string
	// Opts connect to the cluster (seed brokers, TLS, SASL). The Consumer
	// adds its own consumer options; do not pass consumer-group options.
	Opts []kgo.Opt
	// BatchRecords bounds the records of one Apply. Default 5000.
	BatchRecords int
	// ProgressInterval is how often Run logs progress and lag at Info.
	// Default 10s; negative disables the periodic line (the final one is
	// always logged).
	ProgressInterval time.Duration
	// Logger receives progress (Info) and per-batch lines (Debug). Default:
	// slog.Default().
	Logger *slog.Logger
}

// Stats is what a Run did and where it ended.
type Stats struct {
	// Records is the number of data records applied (upserts + tombstones).
	Records int64
	// Upserts and Tombstones split Records.
	Upserts, Tombstones int64
	// Batches is the number of successful Apply calls.
	Batches int64
	// Positions is the next offset to read per partition after the run.
	Positions map[int32]int64
	// Lag is, per partition, the last stable offset last seen minus the
	// position: how many offsets (records and transaction markers) are
	// still to apply.
	Lag map[int32]int64
}

// TotalLag sums Lag.
func (s Stats) TotalLag() int64 {
	var n int64
	for _, l := range s.Lag {
		n += l
	}
	return n
}

// TopicChecker is a Store that keeps, with its positions, the Kafka topic
// id they belong to. CheckTopic is called before a run reads anything: it
// fails wrapping ErrPosition when the stored positions belong to another
// topic of the same name (deleted and created again), and otherwise keeps
// id for the positions it stores from then on.
type TopicChecker interface {
	CheckTopic(ctx context.Context, id string) error
}

// ErrPosition marks a stored position the topic cannot serve: before its
// log start (records were deleted) or past its end (the topic was
// recreated). Nothing is guessed; rebuild the store from the beginning.
var ErrPosition = errors.New("stored position does not fit the topic")

// Consumer folds the topic into a Store, exactly once.
type Consumer struct {
	cfg   Config
	store Store
	log   *slog.Logger
}

// NewConsumer returns a Consumer applying cfg.Topic to store.
func NewConsumer(cfg Config, store Store) (*Consumer, error) {
	if cfg.Topic == "" {
		return nil, errors.New("replica: topic is required")
	}
	if store == nil {
		return nil, errors.New("replica: store is required")
	}
	if cfg.BatchRecords <= 0 {
		cfg.BatchRecords = 5000
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = 10 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	return &Consumer{cfg: cfg, store: store, log: log.With("topic", cfg.Topic)}, nil
}

// Reset empties store and its positions when it implements Resetter, so
// the next Run rebuilds from the beginning of the topic.
func Reset(ctx context.Context, store Store) error {
	r, ok := store.(Resetter)
	if !ok {
		return fmt.Errorf("replica: store %T cannot be reset", store)
	}
	return r.Reset(ctx)
}

// Run reads the topic read_committed from the store's positions and applies
// it batch by batch until mode says stop. A cancelled context is a clean
// stop (nil error): whatever Apply committed is the state, and the next Run
// resumes from it. The first Apply error ends the run with nothing of that
// batch applied.
func (c *Consumer) Run(ctx context.Context, mode Mode) (Stats, error) {
	st := Stats{Positions: map[int32]int64{}, Lag: map[int32]int64{}}
	ends, starts, id, err := c.bounds(ctx)
	if err != nil {
		return st, stopErr(ctx, err)
	}
	if tc, ok := c.store.(TopicChecker); ok && id != "" {
		if err := tc.CheckTopic(ctx, id); err != nil {
			return st, stopErr(ctx, err)
		}
	}
	stored, err := c.store.Positions(ctx)
	if err != nil {
		return st, stopErr(ctx, fmt.Errorf("read stored positions: %w", err))
	}
	from := map[int32]kgo.Offset{}
	for p, end := range ends {
		pos, ok := stored[p]
		switch {
		case !ok:
			pos = starts[p]
		case pos < starts[p]:
			return st, fmt.Errorf("%w: partition %d: applied up to offset %d, but the topic now starts at %d (records were deleted); rebuild with --from-beginning", ErrPosition, p, pos, starts[p])
		case pos > end:
			return st, fmt.Errorf("%w: partition %d: applied up to offset %d, past the topic's end %d (was the topic recreated?); rebuild with --from-beginning", ErrPosition, p, pos, end)
		}
		st.Positions[p] = pos
		st.Lag[p] = end - pos
		from[p] = kgo.NewOffset().At(pos)
	}
	for p := range stored {
		if _, ok := ends[p]; !ok {
			return st, fmt.Errorf("%w: positions stored for partition %d, which topic %s does not have", ErrPosition, p, c.cfg.Topic)
		}
	}
	c.log.Info("replica starting", "mode", modeName(mode), "positions", attrMap(st.Positions), "lag", st.TotalLag())
	caughtUp := func() bool {
		for p, end := range ends {
			if st.Positions[p] < end {
				return false
			}
		}
		return true
	}
	if mode == Once && caughtUp() {
		c.logProgress("replica caught up", st)
		return st, nil
	}

	cl, err := kgo.NewClient(append(slices.Clone(c.cfg.Opts),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{c.cfg.Topic: from}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		// Transaction markers are kept so that positions move past them:
		// the end of a partition is usually a commit marker, and Once must
		// be able to reach it.
		kgo.KeepControlRecords(),
		// A position the log no longer has (records deleted by retention
		// or DeleteRecords while the replica ran, before it applied them)
		// is an error, not a jump to the new log start past them.
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
	)...)
	if err != nil {
		return st, fmt.Errorf("consume %s: %w", c.cfg.Topic, err)
	}
	defer cl.Close()

	lastLog := time.Now()
	var batch []Change
	for !(mode == Once && caughtUp()) {
		fs := cl.PollRecords(ctx, c.cfg.BatchRecords)
		if ctx.Err() != nil {
			break
		}
		var ferr error
		fs.EachError(func(t string, p int32, err error) {
			switch {
			case ferr != nil:
			case errors.Is(err, kerr.OffsetOutOfRange):
				ferr = fmt.Errorf("%w: partition %d: the records from offset %d on were deleted (retention or DeleteRecords) before the replica applied them; rebuild with --from-beginning",
					ErrPosition, p, st.Positions[p])
			default:
				ferr = fmt.Errorf("fetch %s partition %d: %w", t, p, err)
			}
		})
		if ferr != nil {
			return st, ferr
		}
		batch = batch[:0]
		advanced := map[int32]int64{}
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if fp.LastStableOffset > 0 && fp.LastStableOffset > ends[fp.Partition] && mode == Follow {
				ends[fp.Partition] = fp.LastStableOffset
			}
			for _, r := range fp.Records {
				if r.Offset < st.Positions[r.Partition] {
					continue // already applied (never expected with exact offsets)
				}
				advanced[r.Partition] = r.Offset + 1
				if r.Attrs.IsControl() {
					continue
				}
				batch = append(batch, Change{Key: string(r.Key), Value: r.Value, Partition: r.Partition, Offset: r.Offset})
			}
		})
		if len(advanced) == 0 {
			continue
		}
		if err := c.store.Apply(ctx, batch, advanced); err != nil {
			return st, stopErr(ctx, fmt.Errorf("apply %d records (through %s): %w", len(batch), describe(advanced), err))
		}
		st.Batches++
		for _, ch := range batch {
			st.Records++
			if ch.Delete() {
				st.Tombstones++
			} else {
				st.Upserts++
			}
		}
		maps.Copy(st.Positions, advanced)
		for p, end := range ends {
			st.Lag[p] = max(end-st.Positions[p], 0)
		}
		c.log.Debug("replica batch applied", "records", len(batch), "positions", attrMap(advanced))
		if c.cfg.ProgressInterval > 0 && time.Since(lastLog) >= c.cfg.ProgressInterval {
			lastLog = time.Now()
			c.logProgress("replica progress", st)
		}
	}
	msg := "replica stopped"
	if mode == Once && caughtUp() {
		msg = "replica caught up"
	}
	c.logProgress(msg, st)
	return st, nil
}

// stopErr turns an error caused by the context ending into a clean stop.
func stopErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (c *Consumer) logProgress(msg string, st Stats) {
	c.log.Info(msg, "records", st.Records, "upserts", st.Upserts, "tombstones", st.Tombstones,
		"batches", st.Batches, "lag", st.TotalLag(), "lag_by_partition", attrMap(st.Lag), "positions", attrMap(st.Positions))
}

// bounds lists the last stable (committed) end and the start offset of
// every partition, and the topic's id ("" when the cluster has none).
func (c *Consumer) bounds(ctx context.Context) (ends, starts map[int32]int64, id string, err error) {
	cl, err := kgo.NewClient(c.cfg.Opts...)
	if err != nil {
		return nil, nil, "", fmt.Errorf("connect: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	td, err := adm.ListTopics(ctx, c.cfg.Topic)
	if err != nil {
		return nil, nil, "", fmt.Errorf("describe %s: %w", c.cfg.Topic, err)
	}
	if d, ok := td[c.cfg.Topic]; ok && d.Err == nil && d.ID != (kadm.TopicID{}) {
		id = d.ID.String()
	}
	endL, err := adm.ListCommittedOffsets(ctx, c.cfg.Topic)
	if err != nil {
		return nil, nil, "", fmt.Errorf("list end offsets of %s: %w", c.cfg.Topic, err)
	}
	startL, err := adm.ListStartOffsets(ctx, c.cfg.Topic)
	if err != nil {
		return nil, nil, "", fmt.Errorf("list start offsets of %s: %w", c.cfg.Topic, err)
	}
	ends, starts = map[int32]int64{}, map[int32]int64{}
	for _, ps := range endL {
		for p, o := range ps {
			if errors.Is(o.Err, kerr.UnknownTopicOrPartition) {
				return nil, nil, "", fmt.Errorf("topic %s does not exist", c.cfg.Topic)
			}
			if o.Err != nil {
				return nil, nil, "", fmt.Errorf("end offset of %s/%d: %w", c.cfg.Topic, p, o.Err)
			}
			ends[p] = o.Offset
		}
	}
	if len(ends) == 0 {
		return nil, nil, "", fmt.Errorf("topic %s does not exist", c.cfg.Topic)
	}
	for _, ps := range startL {
		for p, o := range ps {
			if o.Err != nil {
				return nil, nil, "", fmt.Errorf("start offset of %s/%d: %w", c.cfg.Topic, p, o.Err)
			}
			starts[p] = o.Offset
		}
	}
	return ends, starts, id, nil
}

func modeName(m Mode) string {
	if m == Once {
		return "once"
	}
	return "follow"
}

// attrMap renders partition -> offset as a log group with sorted keys.
func attrMap(m map[int32]int64) slog.Value {
	ps := slices.Sorted(maps.Keys(m))
	attrs := make([]slog.Attr, len(ps))
	for i, p := range ps {
		attrs[i] = slog.Int64(fmt.Sprint(p), m[p])
	}
	return slog.GroupValue(attrs...)
}

func describe(pos map[int32]int64) string {
	ps := slices.Sorted(maps.Keys(pos))
	s := ""
	for i, p := range ps {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("partition %d offset %d", p, pos[p]-1)
	}
	return s
}
