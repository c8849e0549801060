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

// BenchmarkBoundaryPut is the per-row cost of remembering a published row
// in B while it has room.
func BenchmarkBoundaryPut(b *testing.B) {
	rows := make([]Row, 20000)
	for i := range rows {
		rows[i] = Row{ID: strconv.Itoa(1_000_000 + i), Value: []byte(`{"id":1,"v":"x"}`)}
	}
	bd := newBoundary(len(rows), nil)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		r := &rows[i%len(rows)]
		if !bd.seen(r) {
			bd.published(r, int64(i))
		}
		i++
	}
}

// BenchmarkBoundaryEntries is the per-commit cost of turning a full B
// (20,000 entries, the default bound) into the sorted checkpoint list,
// before JSON encoding (see schemas.BenchmarkEncodeCheckpoint).
func BenchmarkBoundaryEntries(b *testing.B) {
	for _, n := range []int{1000, 20000} {
		b.Run("entries="+strconv.Itoa(n), func(b *testing.B) {
			bd := newBoundary(n, nil)
			for i := range n {
				bd.put(strconv.Itoa(1_000_000+i), 1_714_560_000_000_000+int64(i/50)*1000, uint64(i))
			}
			b.ReportAllocs()
			for b.Loop() {
				_ = bd.entries()
			}
		})
	}
}

// BenchmarkBoundaryPrune is the per-commit mid-pass prune of a full B when
// nothing falls out (the common case during an initial load with a
// margin wider than one transaction).
func BenchmarkBoundaryPrune(b *testing.B) {
	bd := newBoundary(20000, nil)
	for i := range 20000 {
		bd.put(strconv.Itoa(1_000_000+i), 1_714_560_000_000_000+int64(i), uint64(i))
	}
	b.ReportAllocs()
	for b.Loop() {
		bd.prune(0)
	}
}
