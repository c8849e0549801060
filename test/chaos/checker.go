package chaos

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
)

// Target is what Check compares: a PostgreSQL table (read with the
// connector's own source, so values are encoded exactly as the connector
// encodes them) and the Kafka topics one connector writes.
type Target struct {
	// Kafka configures the connection (seed brokers).
	Kafka []kgo.Opt
	// Topic is the data topic, OffsetsTopic the checkpoint topic.
	Topic, OffsetsTopic string
	// Name is the connector name (the checkpoint key).
	Name string
	// Source opens the table the connector reads.
	Source postgres.Config
	// ResetMarks are end offsets of the data topic (partition -> offset)
	// taken just before an operator reset to scratch. A reset re-publishes
	// every row (documented: `tidemark reset`), so a record repeated across a
	// mark is counted as Republished, not as a duplicate.
	ResetMarks []map[int32]int64
}

// Report holds the six counts that must all be 0, and figures for the log.
type Report struct {
	// Lost keys: live in the table, absent from the folded topic.
	Lost int
	// Stale keys: in both, with another value than the table's.
	Stale int
	// Extra keys: live in the folded topic, not live in the table.
	Extra int
	// Duplicates: a record that repeats an earlier record of the same key
	// anywhere in the log (same operation, value and updated_at header; a
	// tombstone included), i.e. one row version published twice. The only
	// exception is a repeat across a ResetMark (see Republished).
	Duplicates int
	// KeyRegressions: a record whose updated_at header is older than the
	// previous record's of the same key.
	KeyRegressions int
	// WatermarkRegressions: a checkpoint whose watermark is lower than the
	// previous checkpoint's, other than a checkpoint written by a reset.
	WatermarkRegressions int

	// Documented cases, reported but not failures.
	//
	// Republished counts repeats across a ResetMark: a reset to scratch
	// re-publishes every row once.
	Republished int

	// Figures.
	SourceRows  int // live rows in the table
	LiveKeys    int // live keys in the folded topic
	Records     int // committed records in the data topic
	Tombstones  int
	Checkpoints int // committed checkpoints in the offsets topic
	Resets      int // checkpoints written by `tidemark reset`
	// HeadCheckpoints are the checkpoints committed after a head pass
	// and before the next full pass (heads_since_full).
	HeadCheckpoints int

	// Samples holds a few examples of each failure.
	Samples []string
}

// Failures is the sum of the six counts.
func (r Report) Failures() int {
	return r.Lost + r.Stale + r.Extra + r.Duplicates + r.KeyRegressions + r.WatermarkRegressions
}

// Counts formats the six counts on one line.
func (r Report) Counts() string {
	return fmt.Sprintf("lost=%d stale=%d extra=%d duplicates=%d key_regressions=%d watermark_regressions=%d",
		r.Lost, r.Stale, r.Extra, r.Duplicates, r.KeyRegressions, r.WatermarkRegressions)
}

func (r Report) String() string {
	s := fmt.Sprintf("six counts: %s (source rows %d, live keys %d, records %d, tombstones %d, checkpoints %d, resets %d, republished by reset %d)",
		r.Counts(), r.SourceRows, r.LiveKeys, r.Records, r.Tombstones, r.Checkpoints, r.Resets, r.Republished)
	if len(r.Samples) > 0 {
		s += "\n  " + strings.Join(r.Samples, "\n  ")
	}
	return s
}

const maxSamples = 5

func (r *Report) sample(counter *int, format string, args ...any) {
	*counter++
	if *counter <= maxSamples {
		r.Samples = append(r.Samples, fmt.Sprintf(format, args...))
	}
}

// Check folds the data topic read_committed (last record per key wins, a
// tombstone deletes) and compares it with the table, then checks the record
// sequence of every key and the checkpoint history. The table must not
// change while Check runs: it is walked page by page, not under a snapshot,
// exactly like a pass of the connector from scratch.
func Check(ctx context.Context, t Target) (Report, error) {
	var r Report
	want, err := expected(ctx, t.Source)
	if err != nil {
		return r, err
	}
	r.SourceRows = len(want)

	type last struct {
		value     []byte
		tombstone bool
		updatedAt string
		partition int32
		offset    int64
	}
	prev := map[string]*last{}
	// Every version of every key published so far, with where it was last
	// seen: a repeat anywhere later in the log is a duplicate, not only a
	// repeat of the key's previous record. A repeat across a reset mark is
	// the reset's re-publication, once: the next repeat is measured from
	// it, so a second one after the same mark is a duplicate.
	type at struct {
		partition int32
		offset    int64
	}
	seen := map[string]map[string]at{}
	err = fold.Scan(ctx, t.Kafka, t.Topic, func(rec *kgo.Record) error {
		r.Records++
		k := string(rec.Key)
		cur := &last{value: rec.Value, tombstone: rec.Value == nil, partition: rec.Partition, offset: rec.Offset}
		for _, h := range rec.Headers {
			if h.Key == schemas.HeaderUpdatedAt {
				cur.updatedAt = string(h.Value)
			}
		}
		if cur.tombstone {
			r.Tombstones++
		}
		version := "U" + cur.updatedAt + "\x00" + string(cur.value)
		if cur.tombstone {
			version = "D" + cur.updatedAt
		}
		if seen[k] == nil {
			seen[k] = map[string]at{}
		}
		if before, ok := seen[k][version]; ok {
			if before.partition == cur.partition && crossesMark(t.ResetMarks, before.partition, before.offset, cur.offset) {
				r.Republished++
			} else {
				kind := "value"
				if cur.tombstone {
					kind = "tombstone"
				}
				r.sample(&r.Duplicates, "duplicate: key %s: the same %s (updated_at %s) published at %d/%d and again at %d/%d", k, kind, cur.updatedAt, before.partition, before.offset, cur.partition, cur.offset)
			}
		}
		seen[k][version] = at{cur.partition, cur.offset}
		if p := prev[k]; p != nil {
			pt, perr := schemas.ParseTime(p.updatedAt)
			ct, cerr := schemas.ParseTime(cur.updatedAt)
			switch {
			case perr != nil || cerr != nil:
				return fmt.Errorf("key %s: unreadable updated_at header (%q, %q)", k, p.updatedAt, cur.updatedAt)
			case ct.Before(pt):
				r.sample(&r.KeyRegressions, "regression: key %s went from updated_at %s (offset %d) back to %s (offset %d)", k, p.updatedAt, p.offset, cur.updatedAt, cur.offset)
			}
		}
		prev[k] = cur
		return nil
	})
	if err != nil && !errors.Is(err, fold.ErrNoTopic) {
		return r, fmt.Errorf("fold %s: %w", t.Topic, err)
	}
	for k, p := range prev {
		if p.tombstone {
			continue
		}
		r.LiveKeys++
		v, ok := want[k]
		switch {
		case !ok:
			r.sample(&r.Extra, "extra: key %s is live in the topic (%.80s) but not live in the table", k, p.value)
		case v != string(p.value):
			r.sample(&r.Stale, "stale: key %s: topic has %.120s, table has %.120s", k, p.value, v)
		}
	}
	for k := range want {
		if p := prev[k]; p == nil || p.tombstone {
			r.sample(&r.Lost, "lost: key %s is live in the table but not in the topic", k)
		}
	}

	cps, err := offsets.NewStore(t.Kafka, t.OffsetsTopic, t.Name).History(ctx)
	if err != nil {
		return r, fmt.Errorf("checkpoint history: %w", err)
	}
	r.Checkpoints = len(cps)
	for i, cp := range cps {
		if cp.HeadsSinceFull {
			r.HeadCheckpoints++
		}
		if cp.RunID == schemas.ResetRunID {
			r.Resets++
			continue // an operator decision may move W anywhere
		}
		if i == 0 {
			continue
		}
		before, now := cps[i-1].Watermark, cp.Watermark
		if below(now, before) {
			r.sample(&r.WatermarkRegressions, "watermark regression: seq %d has W %s after seq %d had %s", cp.Seq, orInf(now), cps[i-1].Seq, orInf(before))
		}
	}
	return r, nil
}

// expected reads the table under one snapshot with the connector's own source
// and encoder (ScanLive) and returns id -> value of every live row.
func expected(ctx context.Context, cfg postgres.Config) (map[string]string, error) {
	src, err := postgres.New(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("open the source table: %w", err)
	}
	defer src.Close()
	want := map[string]string{}
	if _, err := src.ScanLive(ctx, func(row *connector.Row) error {
		want[row.ID] = string(row.Value)
		return nil
	}); err != nil {
		return nil, fmt.Errorf("scan the source table: %w", err)
	}
	return want, nil
}

// crossesMark reports whether offsets a < b of one partition lie on both
// sides of a reset mark.
func crossesMark(marks []map[int32]int64, partition int32, a, b int64) bool {
	for _, m := range marks {
		if end, ok := m[partition]; ok && a < end && b >= end {
			return true
		}
	}
	return false
}

// below reports whether watermark a is lower than b ("" = minus infinity).
func below(a, b string) bool {
	if b == "" {
		return false
	}
	if a == "" {
		return true
	}
	ta, err1 := schemas.ParseTime(a)
	tb, err2 := schemas.ParseTime(b)
	if err1 != nil || err2 != nil {
		return a < b
	}
	return ta.Before(tb)
}

func orInf(ts string) string {
	if ts == "" {
		return "-infinity"
	}
	return ts
}
