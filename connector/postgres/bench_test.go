package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/harness"
)

// BenchmarkPage walks a table of ~200-byte rows end to end against real
// PostgreSQL and reports rows/s.
func BenchmarkPage(b *testing.B) {
	db := harness.NewDB(b)
	db.Exec(b, `CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, name text, email text,
		price numeric(12,2), active boolean, attrs jsonb, tags text[])`)
	db.Exec(b, `CREATE INDEX ON t (updated_at, id)`)
	const n = 100000
	db.Exec(b, `INSERT INTO t SELECT g, timestamptz '2024-01-01' + g * interval '1 millisecond',
		'Customer number ' || g, 'customer' || g || '@example.com', g / 100.0, g % 2 = 0,
		jsonb_build_object('plan', 'pro', 'seats', g % 50, 'region', 'eu-west-1'), ARRAY['alpha', 'beta', 'gamma']
		FROM generate_series(1, $1) g`, n)
	db.Exec(b, "ANALYZE t")
	src := open(b, config(db, "t"))
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	rows, bytes := 0, 0
	start := time.Now()
	for b.Loop() {
		req := connector.PageRequest{Limit: 1000}
		for {
			p, err := src.Page(ctx, req)
			if err != nil {
				b.Fatal(err)
			}
			if p.End {
				break
			}
			for _, r := range p.Rows {
				bytes += len(r.Value)
			}
			rows += len(p.Rows)
			req.Cursor = p.Next
		}
	}
	el := time.Since(start).Seconds()
	b.ReportMetric(float64(rows)/el, "rows/s")
	b.ReportMetric(float64(bytes)/float64(rows), "B/row")
}
