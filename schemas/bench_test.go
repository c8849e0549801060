package schemas_test

import (
	"testing"

	"github.com/tidemark/tidemark/schemas"
)

// BenchmarkBoundarySegment encodes and decodes one full segment of the
// dedupe set: paid per segment written at a commit, and per segment read
// when a connector starts or recovers.
func BenchmarkBoundarySegment(b *testing.B) {
	es := make([]schemas.BoundaryRecord, schemas.MaxSegmentEntries)
	for i := range es {
		es[i] = schemas.BoundaryRecord{Hash: uint64(i) * 0x9e3779b97f4a7c15, Digest: ^uint64(i), UpdatedAt: 1_714_560_000_000_000 + int64(i/50)*1000}
	}
	buf := schemas.AppendBoundarySegment(nil, es)
	b.Logf("%d entries in %d bytes: %.1f bytes an entry", len(es), len(buf), float64(len(buf))/float64(len(es)))
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		out := make([]byte, 0, len(buf))
		for b.Loop() {
			out = schemas.AppendBoundarySegment(out[:0], es)
		}
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(len(buf)))
		b.ReportAllocs()
		for b.Loop() {
			if _, err := schemas.DecodeBoundarySegment(buf, func(schemas.BoundaryRecord) {}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkAppendTime formats the updated_at header of every record.
func BenchmarkAppendTime(b *testing.B) {
	t, _ := schemas.ParseTime("2024-05-01T12:34:56.123456Z")
	buf := make([]byte, 0, 32)
	b.ReportAllocs()
	for b.Loop() {
		buf = schemas.AppendTime(buf[:0], t)
	}
}
