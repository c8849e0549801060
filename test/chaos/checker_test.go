package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// TestCheckerCountsEachAnomaly plants one of each anomaly in the topics and
// checks that the checker counts each exactly once: a checker that cannot
// fail proves nothing.
func TestCheckerCountsEachAnomaly(t *testing.T) {
	w := newWorld(t, nil)
	w.ensureTopics(w.opts)
	t1 := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	for i := 1; i <= 5; i++ {
		w.db.Exec(t, `INSERT INTO items (id, updated_at, v) VALUES ($1, $2, 'x')`, i, t1.Add(time.Duration(i)*time.Second))
	}
	w.db.Exec(t, `UPDATE items SET deleted_at = updated_at WHERE id = 5`)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	want, err := expected(ctx, w.src)
	if err != nil {
		t.Fatal(err)
	}
	ts := func(i int) string { return schemas.FormatTime(t1.Add(time.Duration(i) * time.Second)) }
	rec := func(key, value, updatedAt string) *kgo.Record {
		r := &kgo.Record{Topic: w.topic, Key: []byte(key), Headers: []kgo.RecordHeader{{Key: schemas.HeaderUpdatedAt, Value: []byte(updatedAt)}}}
		if value != "" {
			r.Value = []byte(value)
		}
		return r
	}
	cl, err := kgo.NewClient(append(append([]kgo.Opt{}, w.opts...), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	produce := func(rs ...*kgo.Record) {
		t.Helper()
		if err := cl.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	produce(
		rec("1", want["1"], ts(1)), rec("1", want["1"], ts(1)), // duplicate
		// key 2 never published: lost
		rec("3", `{"stale":true}`, ts(3)),                                                                // stale
		rec("4", `{"first":true}`, ts(4)), rec("4", `{"older":true}`, ts(0)), rec("4", want["4"], ts(4)), // regression
		rec("5", `{"deleted":"but live in the topic"}`, ts(5)), // extra
		rec("6", "", ts(6)), rec("6", "", ts(7)), // two tombstones of different versions: not a duplicate
	)
	cp := func(seq int64, run, wm string) *kgo.Record {
		b, err := schemas.EncodeCheckpoint(&schemas.Checkpoint{Version: schemas.CheckpointVersion, Connector: w.name, Phase: schemas.PhaseIdle, Watermark: wm, RunID: run, Seq: seq})
		if err != nil {
			t.Fatal(err)
		}
		return &kgo.Record{Topic: w.offsets, Key: []byte(w.name), Value: b}
	}
	produce(cp(1, "a", ts(1)), cp(2, "a", ts(3)), cp(3, "a", ts(2)), // regression
		cp(4, schemas.ResetRunID, ""), cp(5, "b", ts(1))) // a reset may move W back

	r, err := Check(ctx, w.target())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s", r)
	got := [6]int{r.Lost, r.Stale, r.Extra, r.Duplicates, r.KeyRegressions, r.WatermarkRegressions}
	if got != [6]int{1, 1, 1, 1, 1, 1} {
		t.Errorf("want each of the six counts at 1, got %s", r.Counts())
	}

	// A repeat across a reset mark is the documented re-publication.
	produce(rec("1", want["1"], ts(1)))
	r, err = Check(ctx, w.target())
	if err != nil {
		t.Fatal(err)
	}
	if r.Duplicates != 2 {
		t.Fatalf("want 2 duplicates after a third publication of key 1, got %d", r.Duplicates)
	}
	// Mark key 1's partition just before its last record.
	tg := w.target()
	var part int32
	var off int64
	if err := fold.Scan(ctx, w.opts, w.topic, func(r *kgo.Record) error {
		if string(r.Key) == "1" {
			part, off = r.Partition, r.Offset
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tg.ResetMarks = []map[int32]int64{{part: off}}
	r, err = Check(ctx, tg)
	if err != nil {
		t.Fatal(err)
	}
	if r.Duplicates != 1 || r.Republished != 1 {
		t.Errorf("with a reset mark before the last publication: want 1 duplicate and 1 re-publication, got %d and %d", r.Duplicates, r.Republished)
	}
	// A reset re-publishes a version once: a second repeat after the mark
	// is a duplicate (each repeat is measured from the latest one before it).
	produce(rec("1", want["1"], ts(1)))
	if r, err = Check(ctx, tg); err != nil {
		t.Fatal(err)
	}
	if r.Duplicates != 2 || r.Republished != 1 {
		t.Errorf("a version published twice after a reset mark: want 2 duplicates and 1 re-publication, got %d and %d", r.Duplicates, r.Republished)
	}

	// A repeat that is not the key's previous record is a duplicate too,
	// and so is a tombstone of one version published twice.
	produce(rec("3", want["3"], ts(3)), rec("3", `{"stale":true}`, ts(3)), rec("3", want["3"], ts(3)))
	produce(rec("6", "", ts(6)))
	r, err = Check(ctx, w.target())
	if err != nil {
		t.Fatal(err)
	}
	if r.Duplicates != 6 {
		t.Errorf("want 6 duplicates (key 1 three times, key 3's stale value and its table value again, key 6's first tombstone again), got %d: %s", r.Duplicates, r)
	}
}
