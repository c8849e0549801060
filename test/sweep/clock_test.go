package sweep

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/schemas"
)

// TestSweepTombstonesCarryTheSourceClock: the host's clock is an hour
// ahead of the database's. A sweep's tombstone must carry the source's
// clock (its snapshot's start), like every other record, not the host's:
// otherwise it would sort an hour into the future against the rows the
// walk publishes.
func TestSweepTombstonesCarryTheSourceClock(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 5, time.Millisecond)
	ahead := func() time.Time { return time.Now().Add(time.Hour) }
	r.Once(r.Src, connector.Config{PageSize: 2, Now: ahead})
	r.Exec(`DELETE FROM items WHERE id = 3`)
	var before time.Time
	if err := r.DB.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&before); err != nil {
		t.Fatal(err)
	}
	res := r.Sweep(connector.Config{Now: ahead})
	if res.Tombstoned != 1 {
		t.Fatalf("sweep: %s; want 1 tombstoned", res)
	}
	var after time.Time
	if err := r.DB.Pool.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&after); err != nil {
		t.Fatal(err)
	}
	var header string
	if err := fold.Scan(context.Background(), r.Opts, r.Topic, func(rec *kgo.Record) error {
		if string(rec.Key) == "3" && rec.Value == nil {
			for _, h := range rec.Headers {
				if h.Key == schemas.HeaderUpdatedAt {
					header = string(h.Value)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	ts, err := schemas.ParseTime(header)
	if err != nil {
		t.Fatalf("tombstone updated_at header %q: %v", header, err)
	}
	if ts.Before(before.Add(-time.Second)) || ts.After(after.Add(time.Second)) {
		t.Errorf("tombstone updated_at %s, want the database's clock during the sweep (%s .. %s), not the host's", header, before.UTC(), after.UTC())
	}
	r.AssertTable()
}
