package producer

import (
	"bytes"
	"sync"

	"github.com/pierrec/lz4/v4"
	"github.com/twmb/franz-go/pkg/kgo"
)

// lz4Compressor writes each batch as an LZ4 frame of 64 KiB blocks, the
// block size of the Java client, where franz-go's own compressor writes
// 4 MiB blocks. A reader decompressing a batch allocates (or takes from a
// pool) a buffer of the frame's block size, so 4 MiB blocks cost every
// consumer of the topic 4 MiB per batch it reads; a Kafka batch is at most
// about 1 MB anyway.
//
// Nor does it write the frame's content checksum, an xxHash32 of the whole
// batch (about a tenth of BenchmarkLZ4Compress's time, in six alternating
// runs at GOMAXPROCS 1): the Java and librdkafka producers write none
// either. The record batch's CRC-32C covers the compressed frame: the
// broker checks it on append, and Java, franz-go and Sarama consumers by
// default (librdkafka's only with check.crcs=true).
type lz4Compressor struct {
	pool sync.Pool
}

func newLZ4Compressor() *lz4Compressor {
	c := &lz4Compressor{}
	c.pool.New = func() any {
		w := lz4.NewWriter(nil)
		// Valid options: Apply cannot fail.
		_ = w.Apply(lz4.BlockSizeOption(lz4.Block64Kb), lz4.ChecksumOption(false), lz4.ConcurrencyOption(1))
		return w
	}
	return c
}

// Compress implements kgo.Compressor.
func (c *lz4Compressor) Compress(dst *bytes.Buffer, src []byte, _ ...kgo.CompressFlag) ([]byte, kgo.CompressionCodecType) {
	w := c.pool.Get().(*lz4.Writer)
	defer c.pool.Put(w)
	w.Reset(dst)
	if _, err := w.Write(src); err != nil {
		return nil, kgo.CodecError
	}
	if err := w.Close(); err != nil {
		return nil, kgo.CodecError
	}
	return dst.Bytes(), kgo.CodecLz4
}
