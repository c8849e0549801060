package sweep

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/verify"
)

// TestVerifyRowsTouchedOutsideTheRecord: with source.columns leaving out
// updated_at, a row updated only in columns the record leaves out is a new
// version with the same value. Its first version was settled (not in the
// dedupe set), so the engine publishes it again, and that is no row
// version published twice: verify must match, with no duplicate
// publication (it reported EXACTLY-ONCE VIOLATED for every touched row).
func TestVerifyRowsTouchedOutsideTheRecord(t *testing.T) {
	r := newRig(t)
	pg := r.PG
	pg.Columns = []string{"id", "v"}
	src := r.Open(pg)
	r.Seed(1, 20, time.Millisecond)
	cfg := connector.Config{PageSize: 7}
	r.Once(src, cfg)
	r.Exec(`UPDATE items SET updated_at = clock_timestamp() WHERE id <= 5`)
	r.Once(src, cfg)

	// The scenario happened: each touched row's value is in the topic
	// twice.
	st := r.Fold()
	for _, id := range []string{"1", "5"} {
		total := 0
		for _, n := range st.Publications[id] {
			total += n
		}
		if total != 2 || len(st.Publications[id]) != 1 {
			t.Fatalf("key %s: publications %v; want one value published twice (by the load, then for the touch)", id, st.Publications[id])
		}
	}
	for _, budget := range []int{0, -1} { // in memory, by buckets
		rep, err := verify.Options{MaxKeysInMemory: budget}.Compare(context.Background(), src, r.TopicView(), "topic "+r.Topic)
		if err != nil {
			t.Fatal(err)
		}
		if !rep.OK() || rep.Duplicates != 0 || rep.SourceRows != 20 {
			t.Errorf("budget %d: verify after touching 5 rows:\n%s", budget, rep.Text())
		}
	}
}
