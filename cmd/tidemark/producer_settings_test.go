package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/test/harness"
)

// badProducerSettings are values of the producer keys that are refused,
// with what the message must say besides the key.
var badProducerSettings = []struct {
	set  string
	want []string
}{
	{"kafka.compression=brotli", []string{`"brotli" is not a codec`, "none, gzip, snappy, lz4 or zstd"}},
	{"kafka.compression=LZ4", []string{`"LZ4" is not a codec`}},
	{"kafka.linger=-1ms", []string{"-1ms is out of range", "0s..1s", "linger.ms"}},
	{"kafka.linger=5s", []string{"5s is out of range", "0s..1s"}},
	{"kafka.linger=often", []string{`"often" is not a duration`}},
	{"kafka.batch_max_bytes=2MiB", []string{"2097152 is more than 1000012 bytes", "max.message.bytes", "use 1000012 or less"}},
	{"kafka.batch_max_bytes=1000013", []string{"1000013 is more than 1000012 bytes"}},
	{"kafka.batch_max_bytes=1KiB", []string{"1024 is less than 16384 bytes", "cannot be produced", "16384..1000012"}},
	{"kafka.batch_max_bytes=0", []string{"0 is less than 16384 bytes"}},
	{"kafka.batch_max_bytes=lots", []string{`"lots" is not a size`}},
}

// Invalid producer settings are refused by the configuration, naming the
// key, where the value came from and what to use.
func TestProducerSettingsValidation(t *testing.T) {
	path := writeConfig(t, minimal)
	for _, tc := range badProducerSettings {
		t.Run(tc.set, func(t *testing.T) {
			key, _, _ := strings.Cut(tc.set, "=")
			got := loadErr(t, path, nil, tc.set)
			wantContains(t, got, append([]string{originCommandLine + ": " + key + ": "}, tc.want...)...)
		})
	}
	for _, ok := range []string{"kafka.compression=none", "kafka.compression=gzip", "kafka.compression=snappy", "kafka.compression=zstd",
		"kafka.linger=0s", "kafka.linger=1s", "kafka.batch_max_bytes=16KiB", "kafka.batch_max_bytes=1000012"} {
		mustLoad(t, path, nil, ok)
	}
}

// Through the CLI, each of them exits 2 before anything is contacted, and
// stderr names the key.
func TestCLIProducerSettingsExit2(t *testing.T) {
	cfg := writeEdgeConfig(t, t.TempDir(), "tidemark.yaml", "postgres://u@127.0.0.1:1/db", "")
	for _, tc := range badProducerSettings {
		t.Run(tc.set, func(t *testing.T) {
			key, _, _ := strings.Cut(tc.set, "=")
			// Were the value let through, the run would fail on the
			// unreachable database after 1s instead, with exit 1.
			code, out, errOut := edgeCLI(t, nil, "run", "--once", "--config", cfg, "--set", "sync.once_retry_timeout=1s", "--set", tc.set)
			if code != exitConfig {
				t.Fatalf("exit %d, want %d\n%s\n%s", code, exitConfig, out, errOut)
			}
			for _, s := range append([]string{key}, tc.want...) {
				if !strings.Contains(errOut, s) {
					t.Errorf("stderr does not say %q:\n%s", s, errOut)
				}
			}
		})
	}
}

// The configured compression, linger and batch size reach the producer's
// client; the defaults are lz4, 0s and 1000012 bytes, and the offsets topic
// keeps 1000012 whatever kafka.batch_max_bytes says.
func TestCLIProducerSettingsReachTheClient(t *testing.T) {
	k := harness.NewKafka(t)
	for _, tc := range []struct {
		name   string
		sets   []string
		codec  kgo.CompressionCodec
		linger time.Duration
		data   int32
	}{
		{"defaults", nil, kgo.Lz4Compression(), 0, producer.MaxBatchBytes},
		{"none", []string{"kafka.compression=none"}, kgo.NoCompression(), 0, producer.MaxBatchBytes},
		{"gzip", []string{"kafka.compression=gzip"}, kgo.GzipCompression(), 0, producer.MaxBatchBytes},
		{"snappy", []string{"kafka.compression=snappy"}, kgo.SnappyCompression(), 0, producer.MaxBatchBytes},
		{"zstd, linger, batch size", []string{"kafka.compression=zstd", "kafka.linger=7ms", "kafka.batch_max_bytes=64KiB"},
			kgo.ZstdCompression(), 7 * time.Millisecond, 64 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			text := fmt.Sprintf("name: settings\nsource:\n  dsn: postgres://u@127.0.0.1:1/db\n  table: items\nkafka:\n  brokers: [%s]\n", strings.Join(k.Brokers, ", "))
			args := []string{"--config", writeConfig(t, text)}
			for _, s := range tc.sets {
				args = append(args, "--set", s)
			}
			a := &cli{stdout: io.Discard, stderr: io.Discard, env: func(string) string { return "" }}
			if err := a.parse("run", args); err != nil {
				t.Fatal(err)
			}
			defer a.closeAll()
			w, err := a.writer(context.Background(), []kgo.Opt{kgo.SeedBrokers(k.Brokers...)})
			if err != nil {
				t.Fatal(err)
			}
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
			if got := fn("items"); got != tc.data {
				t.Errorf("data topic batches up to %d bytes, want %d", got, tc.data)
			}
			if got := fn("tidemark-offsets"); got != producer.MaxBatchBytes {
				t.Errorf("offsets topic batches up to %d bytes, want %d", got, producer.MaxBatchBytes)
			}
		})
	}
}
