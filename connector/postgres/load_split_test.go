package postgres_test

import (
	"context"
	"testing"

	"github.com/tidemark/tidemark/test/harness"
)

// An id column whatever its name (here the alias the split query once gave
// its output, tidemark_split_key, when a bare ORDER BY then sorted the
// sample by the id's text): the split points come in the id's own order,
// and the ranges read every id exactly once.
func TestSplitKeysIDNamedLikeAnAlias(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (tidemark_split_key bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	db.Exec(t, `INSERT INTO items SELECT g::bigint * g * g, now() FROM generate_series(1, 5000) g`)
	db.Exec(t, "ANALYZE items")
	cfg := config(db, "items")
	cfg.IDColumn = "tidemark_split_key"
	src := open(t, cfg)
	ranges, err := src.SplitKeys(context.Background(), 8)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("ranges: %v", ranges)
	seen := map[string]int{}
	for _, ids := range loadAll(t, src, ranges, 500) {
		for _, id := range ids {
			seen[id]++
		}
	}
	twice := 0
	for _, n := range seen {
		if n > 1 {
			twice++
		}
	}
	if len(seen) != 5000 || twice > 0 {
		t.Errorf("the ranges %v read %d distinct ids of 5000, %d of them more than once", ranges, len(seen), twice)
	}
}
