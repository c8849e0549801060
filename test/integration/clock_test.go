package integration

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/rig"
)

// TestFutureDatedRowLosesNothingLater: one row is written five minutes
// ahead of the database's clock. It is published, but the watermark stays
// at the database's clock, so a row written afterwards with a real
// timestamp is still read by the next pass (it would be below W - M if the
// future row had moved W).
func TestFutureDatedRowLosesNothingLater(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Exec(`INSERT INTO items (id, updated_at, v) VALUES (1, now() - interval '1 minute', 'past'), (2, now() + interval '5 minutes', 'future')`)
	fut := &futureCounter{}
	cfg := connector.Config{PageSize: 2, Margin: time.Second, Observer: fut}
	r.Once(r.Src, cfg)
	if fut.rows != 1 {
		t.Errorf("%d rows reported dated after the database clock, want 1", fut.rows)
	}
	var dbNow time.Time
	if err := r.DB.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&dbNow); err != nil {
		t.Fatal(err)
	}
	if w, err := schemas.ParseTime(r.Checkpoint().Watermark); err != nil || w.After(dbNow) {
		t.Errorf("watermark %s after a row dated 5 minutes ahead: want it capped at the database clock (now %s)", r.Checkpoint().Watermark, dbNow)
	}
	time.Sleep(1500 * time.Millisecond) // the later write is beyond the margin from the first pass
	r.Exec(`INSERT INTO items (id, updated_at, v) VALUES (3, clock_timestamp(), 'written later')`)
	r.Once(r.Src, cfg)
	st := r.AssertTable()
	rig.AssertNoDupes(t, st)
	if _, ok := st.Live["3"]; !ok {
		t.Error("the row written after the future-dated one was lost")
	}
}

// TestYear10000IsRefusedClearly: an updated_at after year 9999 cannot be
// written as an RFC 3339 timestamp (headers, checkpoint). The page that
// holds it fails with an error naming the row and the fix, classed as a
// table that does not meet the requirements (exit 2), not a retry and not a
// safety stop; nothing already committed is touched.
func TestYear10000IsRefusedClearly(t *testing.T) {
	r := newRig(t, rig.ItemsDDL, "items")
	r.Seed(1, 3, time.Second)
	cfg := connector.Config{PageSize: 2}
	r.Once(r.Src, cfg)
	seq := r.Checkpoint().Seq
	r.Exec(`INSERT INTO items (id, updated_at, v) VALUES (42, '10000-01-01 00:00:00+00', 'far')`)
	_, err := r.Engine(r.Src, cfg).Run(context.Background(), connector.Once)
	if err == nil {
		t.Fatal("a row in year 10000 was accepted")
	}
	var stop *connector.StopError
	if !errors.Is(err, postgres.ErrBadConfig) || !connector.Fatal(err) || errors.As(err, &stop) {
		t.Errorf("want a permanent table error (exit 2), got %v", err)
	}
	for _, s := range []string{`"42"`, "years 1..9999"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("the error does not mention %s: %v", s, err)
		}
	}
	if got := r.Checkpoint().Seq; got != seq {
		t.Errorf("checkpoint moved from seq %d to %d", seq, got)
	}
	rep, err := r.Src.Check(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Err() == nil || !strings.Contains(rep.Err().Error(), "years 1..9999") {
		t.Errorf("check does not fail on the row after year 9999: %v", rep.Err())
	}
}

// futureCounter counts the rows the engine reports as dated after the
// source's clock.
type futureCounter struct {
	connector.Observer
	rows int
}

func (f *futureCounter) ObservePage(time.Duration, int)     {}
func (f *futureCounter) ObserveCommit(connector.CommitInfo) {}
func (f *futureCounter) ObserveAbort()                      {}
func (f *futureCounter) ObserveRetry(string)                {}
func (f *futureCounter) ObserveStop(string)                 {}
func (f *futureCounter) ObserveSweep(connector.SweepResult) {}
func (f *futureCounter) ObserveFutureDated(rows int)        { f.rows += rows }
