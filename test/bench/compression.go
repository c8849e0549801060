package main

// Bytes on the wire (docs/operating.md, "Producer settings"): tidemark's
// initial load of the main table with each kafka.compression codec, in
// alternating rounds, for rows/s and the bytes the broker holds per record.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"

	"github.com/tidemark/tidemark/connector"
)

// benchCodecs are the kafka.compression values measured; none first, the
// reference the others are compared with.
var benchCodecs = []string{"none", "lz4", "zstd", "snappy"}

// codecLoad is one initial load with one codec.
type codecLoad struct {
	codec string
	round int
	load  loadResult
	// logBytes is the data topic's size on the broker after the load
	// (DescribeLogDirs, the leader's copy): every record batch as stored,
	// with its header and the transaction markers.
	logBytes int64
}

func (c codecLoad) bytesPerRecord() float64 { return float64(c.logBytes) / float64(c.load.rows) }

type compressionResult struct {
	rounds int
	runs   []codecLoad
}

// codecLoads runs rounds of initial loads of table, one per codec per
// round, each round starting one codec later so that no codec always runs
// first or right after another.
func (b *bench) codecLoads(ctx context.Context, table string, rows, rounds int) (compressionResult, error) {
	res := compressionResult{rounds: rounds}
	for round := range rounds {
		for i := range benchCodecs {
			codec := benchCodecs[(i+round)%len(benchCodecs)]
			c, err := b.codecLoad(ctx, table, rows, codec)
			if err != nil {
				return res, fmt.Errorf("kafka.compression %s: %w", codec, err)
			}
			c.round = round + 1
			fmt.Printf("      %-6s %s; %.1f bytes/record on the broker\n", codec, c.load.line(), c.bytesPerRecord())
			res.runs = append(res.runs, c)
		}
	}
	return res, nil
}

// codecLoad is one `tidemark run --once --json --kafka.compression codec`
// of a fresh connector (tidemark's defaults otherwise, as tidemarkLoad),
// checked to leave exactly one committed record per row, and the data
// topic's log size before it is dropped.
func (b *bench) codecLoad(ctx context.Context, table string, rows int, codec string) (codecLoad, error) {
	r, err := b.newRun(table, 0)
	if err != nil {
		return codecLoad{}, err
	}
	defer b.k.drop(context.WithoutCancel(ctx), r.topic, r.offsets, r.ledger)
	pg0, _ := b.pgCP.sample()
	brk0, self0, busy0 := b.k.cpu(), selfCPU(), machineBusy()
	p, err := b.start(r, "run", "--once", "--json", "--kafka.compression", codec)
	if err != nil {
		return codecLoad{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	werr := p.wait(wctx)
	brk, self, busy := b.k.cpu()-brk0, selfCPU()-self0, machineBusy()-busy0
	pg1, _ := b.pgCP.sample()
	if werr != nil {
		return codecLoad{}, fmt.Errorf("tidemark run --once: %v (log: %s)\n%s", werr, r.log, tail(r.log, 20))
	}
	var c connector.Completion
	if err := json.Unmarshal(p.stdout.Bytes(), &c); err != nil {
		return codecLoad{}, fmt.Errorf("completion record: %w: %q", err, p.stdout.String())
	}
	n, nbytes, err := b.k.countCommitted(ctx, r.topic, int64(rows))
	if err != nil {
		return codecLoad{}, fmt.Errorf("read back %s: %w", r.topic, err)
	}
	if c.Published != int64(rows) || n != int64(rows) {
		return codecLoad{}, fmt.Errorf("published %d, topic %s holds %d committed records, want %d: %w", c.Published, r.topic, n, rows, errMismatch)
	}
	size, err := b.k.logSize(ctx, r.topic)
	if err != nil {
		return codecLoad{}, fmt.Errorf("log size of %s: %w", r.topic, err)
	}
	cpu, rss := p.rusage()
	return codecLoad{codec: codec, logBytes: size, load: loadResult{
		kind: "tidemark", rows: n, bytes: nbytes, wall: p.wall, engine: time.Duration(c.Seconds * float64(time.Second)),
		selfCPU: cpu, pgCPU: pg1 - pg0, brkCPU: brk, otherCPU: max(busy-cpu-brk-self-(pg1-pg0), 0), maxRSSKB: rss, txns: c.Transactions, pages: c.Pages,
	}}, nil
}

// logSize is the size of topic's log on the broker: per partition the
// largest of its replicas' sizes, summed.
func (k *broker) logSize(ctx context.Context, topic string) (int64, error) {
	details, err := k.adm.ListTopics(ctx, topic)
	if err != nil {
		return 0, err
	}
	set := kadm.TopicsSet{}
	for _, p := range details[topic].Partitions {
		set.Add(topic, p.Partition) // a topic without partitions is described as nothing
	}
	dirs, err := k.adm.DescribeAllLogDirs(ctx, set)
	if err != nil {
		return 0, err
	}
	parts := map[int32]int64{}
	var ferr error
	dirs.Each(func(d kadm.DescribedLogDir) {
		if d.Err != nil && ferr == nil {
			ferr = d.Err
		}
		for p, dp := range d.Topics[topic] {
			parts[p] = max(parts[p], dp.Size)
		}
	})
	var sum int64
	for _, s := range parts {
		sum += s
	}
	return sum, ferr
}

// codecSummary is one codec's medians over the rounds.
type codecSummary struct {
	codec                          string
	rowsPerSec, bytesPerRec, cpuUs float64
}

func (r compressionResult) summary() []codecSummary {
	var out []codecSummary
	for _, codec := range benchCodecs {
		var rps, bpr, cpu []float64
		for _, c := range r.runs {
			if c.codec == codec {
				rps = append(rps, c.load.rowsPerSec())
				bpr = append(bpr, c.bytesPerRecord())
				cpu = append(cpu, c.load.selfCPU.Seconds()*1e6/float64(c.load.rows))
			}
		}
		if len(rps) > 0 {
			out = append(out, codecSummary{codec, median(rps), median(bpr), median(cpu)})
		}
	}
	return out
}

// compressionSummary writes the summary row of the codec loads.
func (r *results) compressionSummary(b *strings.Builder) {
	s := r.compression.summary()
	if len(s) == 0 {
		return
	}
	var parts []string
	for _, c := range s {
		parts = append(parts, fmt.Sprintf("%s %.0f rows/s, %.0f B/record (%.2f)", c.codec, c.rowsPerSec, c.bytesPerRec, c.bytesPerRec/s[0].bytesPerRec))
	}
	fmt.Fprintf(b, "| initial load by kafka.compression, median of %d rounds: rows/s, bytes per record on the broker (vs none) | %s | | |\n", r.compression.rounds, strings.Join(parts, "; "))
}

// renderCompression writes the section of the codec loads.
func (r *results) renderCompression(b *strings.Builder) {
	if len(r.compression.runs) == 0 {
		return
	}
	fmt.Fprintf(b, "## Bytes on the wire: kafka.compression\n\n")
	fmt.Fprintf(b, "tidemark's initial load of the %d-row table with each codec (`run --once --kafka.compression C`, default settings otherwise), %d rounds, the codecs in a rotating order. Bytes per record = the data topic's log size on the broker (DescribeLogDirs: every record batch as stored, with its 61-byte header, and the transaction markers) / records. CPU µs/row is tidemark's own (it compresses). The kfake broker stores batches as they come and does not decompress them; Apache Kafka decompresses a compressed batch to validate it, which costs broker CPU not counted here. On loopback no network is saved: this measures the CPU side of compression and the bytes a broker and a real network would carry.\n\n",
		r.table.rows, r.compression.rounds)
	fmt.Fprintf(b, "| codec | rows/s (median) | bytes/record (median) | vs none | tidemark CPU µs/row (median) | rows/s by round |\n|---|---:|---:|---:|---:|---|\n")
	s := r.compression.summary()
	for _, c := range s {
		var rounds []string
		for _, run := range r.compression.runs {
			if run.codec == c.codec {
				rounds = append(rounds, fmt.Sprintf("%.0f", run.load.rowsPerSec()))
			}
		}
		fmt.Fprintf(b, "| %s | %.0f | %.1f | %.2f | %.1f | %s |\n", c.codec, c.rowsPerSec, c.bytesPerRec, c.bytesPerRec/s[0].bytesPerRec, c.cpuUs, strings.Join(rounds, ", "))
	}
	fmt.Fprintf(b, "\n")
}
