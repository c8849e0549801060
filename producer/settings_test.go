package producer_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
	"github.com/tidemark/tidemark/test/harness"
)

// settingsWriter opens a Writer with cfg's producer settings on fresh
// topics data (parts partitions) and off of broker k.
func settingsWriter(t *testing.T, k *harness.Kafka, parts int32, cfg producer.Config) ([]kgo.Opt, *producer.Writer) {
	t.Helper()
	ctx := context.Background()
	opts := []kgo.Opt{kgo.SeedBrokers(k.Brokers...)}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := producer.EnsureTopics(ctx, cl, producer.Topics{Data: cfg.Topic, Partitions: parts, ReplicationFactor: -1, Offsets: cfg.OffsetsTopic}); err != nil {
		t.Fatal(err)
	}
	cfg.Opts = opts
	w, err := producer.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return opts, w
}

// storedBatch is one record batch as the broker serves it.
type storedBatch struct {
	partition int32
	kmsg.RecordBatch
}

// storedBatches fetches every record batch of topic from its leaders, raw
// and read_uncommitted (transaction markers included), from offset 0 to the
// high watermark: what the broker holds, not what a consumer makes of it.
func storedBatches(t *testing.T, opts []kgo.Opt, topic string) []storedBatch {
	t.Helper()
	ctx := context.Background()
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	details, err := kadm.NewClient(cl).ListTopics(ctx, topic)
	if err != nil {
		t.Fatal(err)
	}
	d := details[topic]
	if d.Err != nil {
		t.Fatal(d.Err)
	}
	var out []storedBatch
	for _, p := range d.Partitions.Sorted() {
		for next, hwm := int64(0), int64(1); next < hwm; {
			req := kmsg.NewPtrFetchRequest()
			req.ReplicaID, req.MaxBytes, req.SessionEpoch = -1, 64<<20, -1
			rt := kmsg.NewFetchRequestTopic()
			rt.Topic, rt.TopicID = topic, d.ID
			rp := kmsg.NewFetchRequestTopicPartition()
			rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = p.Partition, next, 64<<20
			rt.Partitions = append(rt.Partitions, rp)
			req.Topics = append(req.Topics, rt)
			resp, err := req.RequestWith(ctx, cl.Broker(int(p.Leader)))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
				t.Fatalf("fetch %s/%d: unexpected response shape", topic, p.Partition)
			}
			fp := resp.Topics[0].Partitions[0]
			if fp.ErrorCode != 0 {
				t.Fatalf("fetch %s/%d: error code %d", topic, p.Partition, fp.ErrorCode)
			}
			hwm = fp.HighWatermark
			raw, n := fp.RecordBatches, 0
			for len(raw) >= 12+49 {
				var b kmsg.RecordBatch
				if err := b.ReadFrom(raw); err != nil {
					break // a partial batch at the end of the response
				}
				raw = raw[12+int(b.Length):]
				out = append(out, storedBatch{p.Partition, b})
				next = b.FirstOffset + int64(b.LastOffsetDelta) + 1
				n++
			}
			if n == 0 && next < hwm {
				t.Fatalf("fetch %s/%d at %d: no batch below the high watermark %d", topic, p.Partition, next, hwm)
			}
		}
	}
	return out
}

const attrControl = 0x20 // record batch attributes: a transaction marker

// codecOf is the compression codec in a record batch's attributes.
func codecOf(b kmsg.RecordBatch) kgo.CompressionCodecType {
	return kgo.CompressionCodecType(b.Attributes & 0x07)
}

// compressibleValue is a record value of about 600 bytes that every codec
// shrinks, alone or in a batch.
func compressibleValue(i int) []byte {
	return fmt.Appendf(nil, `{"id":%d,"status":"shipped","note":%q}`, i, strings.Repeat(fmt.Sprintf("row %d is a row like the others; ", i%10), 18))
}

// Records produced with each codec come back intact through a
// read_committed consumer, and the broker holds every data batch
// compressed with that codec (checked on the raw batches it serves, and by
// decompressing them with that codec).
func TestCompressionRoundTrip(t *testing.T) {
	k := harness.NewKafka(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		codec kgo.CompressionCodec
		want  kgo.CompressionCodecType
	}{
		{"none", kgo.NoCompression(), kgo.CodecNone},
		{"zero value", kgo.CompressionCodec{}, kgo.CodecNone},
		{"gzip", kgo.GzipCompression(), kgo.CodecGzip},
		{"snappy", kgo.SnappyCompression(), kgo.CodecSnappy},
		{"lz4", kgo.Lz4Compression(), kgo.CodecLz4},
		{"zstd", kgo.ZstdCompression(), kgo.CodecZstd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			topic := "data-" + strings.ReplaceAll(tc.name, " ", "-")
			// Linger gathers the records into few batches; every batch then
			// holds compressible upserts, so kgo never falls back to
			// sending one uncompressed.
			opts, w := settingsWriter(t, k, 3, producer.Config{Name: topic, Topic: topic, OffsetsTopic: topic + "-off",
				Compression: tc.codec, Linger: 50 * time.Millisecond})
			at := time.Date(2024, 5, 1, 12, 0, 0, 123456000, time.UTC)
			want := map[string][]byte{}
			if err := w.Begin(ctx); err != nil {
				t.Fatal(err)
			}
			const n = 600
			for i := range n {
				r := &connector.Row{ID: fmt.Sprint(i), UpdatedAt: at.Add(time.Duration(i) * time.Microsecond), Value: compressibleValue(i)}
				switch {
				case i%10 == 3:
					r.Deleted, r.Value = true, nil
				case i%97 == 5:
					r.Value = []byte{} // an empty upsert stays an upsert
				}
				want[r.ID] = r.Value
				if err := w.Publish(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Commit(ctx, &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return []byte(`{}`), nil }}); err != nil {
				t.Fatal(err)
			}

			got := 0
			err := fold.Scan(ctx, opts, topic, func(r *kgo.Record) error {
				got++
				id := string(r.Key)
				v, ok := want[id]
				if !ok {
					return fmt.Errorf("unexpected key %q", id)
				}
				if !bytes.Equal(r.Value, v) || (v == nil) != (r.Value == nil) {
					t.Errorf("key %s: value %.40q..., want %.40q...", id, r.Value, v)
				}
				var i int
				fmt.Sscan(id, &i)
				op := schemas.OpUpsert
				if v == nil {
					op = schemas.OpDelete
				}
				hdr := map[string]string{}
				for _, h := range r.Headers {
					hdr[h.Key] = string(h.Value)
				}
				if len(r.Headers) != 3 || hdr[schemas.HeaderOperation] != op || hdr[schemas.HeaderConnector] != topic ||
					hdr[schemas.HeaderUpdatedAt] != string(schemas.AppendTime(nil, at.Add(time.Duration(i)*time.Microsecond))) {
					t.Errorf("key %s: headers %v", id, hdr)
				}
				return nil
			})
			if err != nil || got != n {
				t.Fatalf("read back: %v, %d records of %d", err, got, n)
			}

			data := 0
			for _, b := range storedBatches(t, opts, topic) {
				if b.Attributes&attrControl != 0 {
					continue
				}
				if c := codecOf(b.RecordBatch); c != tc.want {
					t.Errorf("partition %d: batch at offset %d (%d records) is stored with codec %d, want %d", b.partition, b.FirstOffset, b.NumRecords, c, tc.want)
					continue
				}
				if tc.want == kgo.CodecLz4 {
					// An LZ4 frame: magic 04 22 4d 18, FLG, BD; BD's bits 6-4
					// are the block size: 4 = 64 KiB, as the Java client
					// writes (a reader allocates a block for each batch).
					// FLG as the Java client writes it too: version 01,
					// independent blocks, and neither block nor content
					// checksums (the batch's CRC-32C covers the frame; see
					// lz4Compressor).
					if r := b.Records; len(r) < 6 || r[0] != 0x04 || r[1] != 0x22 || r[2] != 0x4d || r[3] != 0x18 {
						t.Errorf("partition %d: batch at offset %d is no LZ4 frame", b.partition, b.FirstOffset)
					} else if size := r[5] >> 4 & 7; size != 4 {
						t.Errorf("partition %d: batch at offset %d has LZ4 blocks of size code %d, want 4 (64 KiB)", b.partition, b.FirstOffset, size)
					} else if flg := r[4]; flg != 0x60 {
						t.Errorf("partition %d: batch at offset %d has LZ4 frame flags %#02x, want 0x60 (version 1, independent blocks, no checksums)", b.partition, b.FirstOffset, flg)
					}
				}
				raw, err := kgo.DefaultDecompressor().Decompress(b.Records, tc.want)
				if err != nil {
					t.Fatalf("partition %d: batch at offset %d does not decompress with codec %d: %v", b.partition, b.FirstOffset, tc.want, err)
				}
				if tc.want != kgo.CodecNone && len(raw) <= len(b.Records) {
					t.Errorf("partition %d: batch at offset %d is no smaller compressed (%d bytes) than decompressed (%d)", b.partition, b.FirstOffset, len(b.Records), len(raw))
				}
				data += int(b.NumRecords)
			}
			if data != n {
				t.Errorf("the broker holds %d data records, want %d", data, n)
			}
		})
	}
}

// The settings reach the client; the zero Config keeps what New always
// did (no compression, no linger, MaxBatchBytes everywhere), and the
// offsets topic keeps MaxBatchBytes whatever the data topic's cap.
func TestProducerSettingsReachTheClient(t *testing.T) {
	k := harness.NewKafka(t)
	for _, tc := range []struct {
		name       string
		cfg        producer.Config
		codec      kgo.CompressionCodec
		linger     time.Duration
		data, offs int32
	}{
		{"zero", producer.Config{}, kgo.NoCompression(), 0, producer.MaxBatchBytes, producer.MaxBatchBytes},
		{"set", producer.Config{Compression: kgo.ZstdCompression(), Linger: 7 * time.Millisecond, BatchMaxBytes: 64 << 10},
			kgo.ZstdCompression(), 7 * time.Millisecond, 64 << 10, producer.MaxBatchBytes},
		{"above the maximum", producer.Config{Compression: kgo.Lz4Compression(), BatchMaxBytes: producer.MaxBatchBytes + 1},
			kgo.Lz4Compression(), 0, producer.MaxBatchBytes, producer.MaxBatchBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Name, cfg.Topic, cfg.OffsetsTopic = "s-"+strings.ReplaceAll(tc.name, " ", "-"), "s-data-"+strings.ReplaceAll(tc.name, " ", "-"), "s-off"
			_, w := settingsWriter(t, k, 1, cfg)
			cl := w.Client()
			if got := cl.OptValue(kgo.ProducerBatchCompression); fmt.Sprint(got) != fmt.Sprint([]kgo.CompressionCodec{tc.codec}) {
				t.Errorf("compression %v, want [%v]", got, tc.codec)
			}
			if got := cl.OptValue(kgo.ProducerLinger); got != tc.linger {
				t.Errorf("linger %v, want %v", got, tc.linger)
			}
			fn, ok := cl.OptValue(kgo.ProducerBatchMaxBytesFn).(func(string) int32)
			if !ok {
				t.Fatalf("batch max bytes: %T", cl.OptValue(kgo.ProducerBatchMaxBytesFn))
			}
			if got := fn(cfg.Topic); got != tc.data {
				t.Errorf("data topic batches up to %d bytes, want %d", got, tc.data)
			}
			if got := fn(cfg.OffsetsTopic); got != tc.offs {
				t.Errorf("offsets topic batches up to %d bytes, want %d", got, tc.offs)
			}
		})
	}
}

// BatchMaxBytes bounds the data topic's batches on the broker (counted
// before compression) and only them: a state record larger than it still
// goes to the offsets topic, while a row larger than it fails the
// transaction as a permanent error.
func TestBatchMaxBytesBoundsTheDataTopic(t *testing.T) {
	k := harness.NewKafka(t)
	ctx := context.Background()
	const limit = 16 << 10
	opts, w := settingsWriter(t, k, 1, producer.Config{Name: "b", Topic: "b-data", OffsetsTopic: "b-off",
		Linger: 50 * time.Millisecond, BatchMaxBytes: limit})
	if err := w.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 400 // about 240 KB of records
	for i := range n {
		if err := w.Publish(ctx, &connector.Row{ID: fmt.Sprint(i), UpdatedAt: time.Unix(0, 0), Value: compressibleValue(i)}); err != nil {
			t.Fatal(err)
		}
	}
	big := bytes.Repeat([]byte("s"), 3*limit)
	err := w.Commit(ctx, &connector.Commit{
		State:      []connector.StateRecord{{Key: "b#seg", Value: big}},
		Checkpoint: func([]int64) ([]byte, error) { return []byte(`{}`), nil },
	})
	if err != nil {
		t.Fatalf("commit with a %d-byte state record: %v", len(big), err)
	}
	data := 0
	for _, b := range storedBatches(t, opts, "b-data") {
		if b.Attributes&attrControl != 0 {
			continue
		}
		data += int(b.NumRecords)
		if size := 12 + int(b.Length); size > limit {
			t.Errorf("batch at offset %d: %d bytes, above BatchMaxBytes %d", b.FirstOffset, size, limit)
		}
	}
	if data != n {
		t.Errorf("the broker holds %d data records, want %d", data, n)
	}
	offs := 0
	for _, b := range storedBatches(t, opts, "b-off") {
		if b.Attributes&attrControl == 0 && int(b.Length) > len(big) {
			offs++
		}
	}
	if offs != 1 {
		t.Errorf("the offsets topic holds %d batches larger than the state record, want 1", offs)
	}

	if err := w.Begin(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Publish(ctx, &connector.Row{ID: "huge", UpdatedAt: time.Unix(0, 0), Value: big}); err != nil {
		t.Fatal(err)
	}
	err = w.Commit(ctx, &connector.Commit{Checkpoint: func([]int64) ([]byte, error) { return []byte(`{}`), nil }})
	if !errors.Is(err, connector.ErrPermanent) {
		t.Errorf("a row of %d bytes with BatchMaxBytes %d: %v, want a permanent error", len(big), limit, err)
	}
}
