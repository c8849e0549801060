package producer_test

import (
	"bytes"
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/test/harness"
)

// BenchmarkPartitioner is the partitioner the Writer configures
// (kgo.StickyKeyPartitioner(nil): Java-compatible murmur2 of the key)
// choosing one of 6 partitions for a bigint id key.
func BenchmarkPartitioner(b *testing.B) {
	p := kgo.StickyKeyPartitioner(nil).ForTopic("bench")
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte(strconv.Itoa(1_000_000 + i*7919))
	}
	rec := &kgo.Record{Topic: "bench"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		rec.Key = keys[i&1023]
		_ = p.Partition(rec, 6)
		i++
	}
}

var benchValue = []byte(`{"id":123456,"updated_at":"2024-05-01T12:34:56.123456Z","note":"Customer 123456 placed an order for 3 items","amount":"1234.56","attrs":{"plan": "pro", "seats": 6, "region": "eu-west-1", "flags": [1, 2, 3]}}`)

// BenchmarkWriterTxn publishes transactions of 1,000 and 10,000 ~200-byte
// records, plus a small checkpoint, into an in-process kfake broker (or
// KAFKA_BROKERS): Begin, Publish each row, Commit. One op is one record.
func BenchmarkWriterTxn(b *testing.B) {
	for _, per := range []int{1000, 10000} {
		b.Run("records_per_txn="+strconv.Itoa(per), func(b *testing.B) {
			k := harness.NewKafka(b)
			ctx := context.Background()
			name := "bench-writer-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
			cl, err := kgo.NewClient(opts...)
			if err != nil {
				b.Fatal(err)
			}
			_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: name, Partitions: 6, ReplicationFactor: -1, Offsets: name + "-offsets"})
			cl.Close()
			if err != nil {
				b.Fatal(err)
			}
			w, err := producer.New(ctx, producer.Config{Name: name, Topic: name, OffsetsTopic: name + "-offsets", Opts: opts})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			rows := make([]connector.Row, per)
			now := time.Now()
			for i := range rows {
				rows[i] = connector.Row{ID: strconv.Itoa(1_000_000 + i), UpdatedAt: now, Value: benchValue}
			}
			checkpoint := []byte(`{"version":1}`)
			b.SetBytes(int64(len(benchValue)))
			b.ReportAllocs()
			i := 0
			open := false
			for b.Loop() {
				if !open {
					if err := w.Begin(ctx); err != nil {
						b.Fatal(err)
					}
					open = true
				}
				if err := w.Publish(ctx, &rows[i%per]); err != nil {
					b.Fatal(err)
				}
				i++
				if i%per == 0 {
					if err := w.Commit(ctx, &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return checkpoint, nil }}); err != nil {
						b.Fatal(err)
					}
					open = false
				}
			}
			if open {
				if err := w.Commit(ctx, &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return checkpoint, nil }}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkLZ4Compress is the writer's LZ4 compressor on a batch of about
// 1 MB of row-like JSON values, as an initial load fills them.
func BenchmarkLZ4Compress(b *testing.B) {
	var src []byte
	for i := 0; len(src) < 1<<20; i++ {
		src = fmt.Appendf(src, `{"id":%d,"updated_at":"2024-05-01T12:00:00.%06dZ","name":"row %d","amount":%d.%02d,"attrs":{"seq":%d,"tag":"t%d"}}`,
			i, i%1000000, i, i*7919%100000, i%100, i, i%97)
	}
	c := producer.NewLZ4Compressor()
	var buf bytes.Buffer
	b.SetBytes(int64(len(src)))
	b.ReportAllocs()
	for b.Loop() {
		buf.Reset()
		if _, codec := c.Compress(&buf, src); codec != kgo.CodecLz4 {
			b.Fatalf("codec %d", codec)
		}
	}
}
