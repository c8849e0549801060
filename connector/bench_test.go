package connector

import (
	"strconv"
	"testing"
)

// benchValue is a record value of the benchmark table's width (~200 bytes).
var benchValue = []byte(`{"id":123456,"updated_at":"2024-05-01T12:34:56.123456Z","note":"Customer 123456 placed an order for 3 items","amount":"1234.56","attrs":{"plan": "pro", "seats": 6, "region": "eu-west-1", "flags": [1, 2, 3]}}`)

// BenchmarkDigest is the per-row content digest the engine computes for
// every row it reads (dedupe against B).
func BenchmarkDigest(b *testing.B) {
	r := &Row{ID: "123456", Value: benchValue}
	b.SetBytes(int64(len(benchValue)))
	b.ReportAllocs()
	for b.Loop() {
		_ = Digest(r)
	}
}

// BenchmarkBoundaryPublish is the per-row cost of remembering a published
// row in B (its digest is deferred) and of meeting it again.
func BenchmarkBoundaryPublish(b *testing.B) {
	rows := make([]Row, 20000)
	for i := range rows {
		rows[i] = Row{ID: strconv.Itoa(1_000_000 + i), Value: []byte(`{"id":1,"v":"x"}`)}
	}
	bd := newBoundary()
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := &rows[i%len(rows)]
		h := idHash(r.ID)
		if _, same := bd.seen(r, h); !same {
			bd.publish(r, h, int64(i))
		}
		i++
	}
}

// BenchmarkBoundarySeal is the per-commit cost of writing a transaction's
// changes (10,000 entries, a full default transaction) as segments.
func BenchmarkBoundarySeal(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		bd := newBoundary()
		for i := range 10000 {
			bd.put(strconv.Itoa(1_000_000+i), 1_714_560_000_000_000+int64(i/50)*1000, uint64(i))
		}
		b.StartTimer()
		s := bd.seal()
		bd.done(s, 1, []int64{1})
	}
}

// BenchmarkBoundaryPrune is the per-commit prune of a full B when nothing
// falls out (the common case with a margin wider than one transaction).
func BenchmarkBoundaryPrune(b *testing.B) {
	bd := newBoundary()
	for i := range 20000 {
		bd.put(strconv.Itoa(1_000_000+i), 1_714_560_000_000_000+int64(i), uint64(i))
	}
	b.ReportAllocs()
	for b.Loop() {
		bd.prune(1_714_560_000_000_000 + 1)
	}
}
