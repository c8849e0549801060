package schemas_test

import (
	"strconv"
	"testing"

	"github.com/tidemark/tidemark/schemas"
)

// benchCheckpoint is a checkpoint with a full dedupe set of n entries, the
// shape committed with every transaction near the watermark.
func benchCheckpoint(n int) *schemas.Checkpoint {
	c := realCheckpoint()
	c.Boundary = make([]schemas.BoundaryEntry, n)
	base := int64(1_714_560_000_000_000)
	for i := range c.Boundary {
		c.Boundary[i] = schemas.BoundaryEntry{
			ID:        strconv.Itoa(1_000_000 + i),
			UpdatedAt: base + int64(i/50)*1000,
			Digest:    uint64(i) * 0x9e3779b97f4a7c15,
		}
	}
	return c
}

// BenchmarkEncodeCheckpoint encodes a checkpoint with 20,000 boundary
// entries (the default sync.dedupe_max_entries): the worst case paid once
// per committed transaction.
func BenchmarkEncodeCheckpoint(b *testing.B) {
	for _, n := range []int{0, 1000, 20000} {
		b.Run("entries="+strconv.Itoa(n), func(b *testing.B) {
			c := benchCheckpoint(n)
			buf, err := schemas.EncodeCheckpoint(c)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := schemas.EncodeCheckpoint(c); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkDecodeCheckpoint decodes the same checkpoint: paid on start and
// after every failure (recovery reloads the checkpoint).
func BenchmarkDecodeCheckpoint(b *testing.B) {
	buf, err := schemas.EncodeCheckpoint(benchCheckpoint(20000))
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(buf)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := schemas.DecodeCheckpoint(buf); err != nil {
			b.Fatal(err)
		}
	}
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
