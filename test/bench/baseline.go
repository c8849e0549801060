package main

import (
	"bytes"
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"
)

// loadResult is one initial load, baseline or tidemark.
type loadResult struct {
	kind    string // baseline, tidemark
	txn     int    // tidemark's sync.txn_max_records (0 = default)
	rows    int64
	bytes   int64 // key + value bytes that reached the topic
	wall    time.Duration
	engine  time.Duration // tidemark: the engine's own run time (completion record)
	selfCPU time.Duration // tidemark: subprocess user+system; Go pipe: the bench process (the client); kcat pipe: psql and kcat
	pgCPU   time.Duration
	brkCPU  time.Duration // the broker process (0 with KAFKA_BROKERS)
	// otherCPU is what processes outside the benchmark used meanwhile (the
	// machine's busy time minus ours): a noisy neighbour shows here.
	otherCPU time.Duration
	// maxRSSKB is tidemark's peak RSS (VmHWM, see proc.rusage).
	maxRSSKB int64
	txns     int64
	pages    int64
}

func (r loadResult) rowsPerSec() float64 { return float64(r.rows) / r.wall.Seconds() }
func (r loadResult) mbPerSec() float64   { return float64(r.bytes) / (1 << 20) / r.wall.Seconds() }

// cpuPerRow is the CPU time of everything the load used (client or
// tidemark, PostgreSQL, broker) per row.
func (r loadResult) cpuPerRow() float64 {
	return (r.selfCPU + r.pgCPU + r.brkCPU).Seconds() / float64(r.rows)
}

func (r loadResult) line() string {
	s := fmt.Sprintf("%-8s %-7s %8d rows in %6.2fs = %7.0f rows/s %6.1f MiB/s; CPU %s %5.1fs, PostgreSQL %5.1fs, other processes %5.1fs",
		r.kind, txnLabel(r), r.rows, r.wall.Seconds(), r.rowsPerSec(), r.mbPerSec(), cpuWho(r), r.selfCPU.Seconds(), r.pgCPU.Seconds(), r.otherCPU.Seconds())
	s += fmt.Sprintf(", broker %4.1fs", r.brkCPU.Seconds())
	if r.kind == "tidemark" {
		s += fmt.Sprintf("; RSS %3.0f MiB; %d txns", float64(r.maxRSSKB)/1024, r.txns)
	}
	return s
}

func txnLabel(r loadResult) string {
	switch {
	case r.kind == "baseline" || r.kind == "kcat" || r.kind == "pipe+lz4":
		return "-"
	case r.txn == 0:
		return "default"
	}
	return fmt.Sprintf("txn=%dk", r.txn/1000)
}

func cpuWho(r loadResult) string {
	switch r.kind {
	case "baseline", "pipe+lz4":
		return "client"
	case "kcat":
		return "psql+kcat"
	}
	return "tidemark"
}

// selfCPU is the bench process's own CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// baseline is the raw pipe: COPY (SELECT id, row_to_json(t) FROM t) TO
// STDOUT, streamed into a non-transactional idempotent producer (acks all,
// Java murmur2 partitioner, 5 ms linger, no compression). No order, no
// checkpoint, no guarantees: the ceiling of this machine.
func (b *bench) baseline(ctx context.Context, table string, rows int) (loadResult, error) {
	return b.goPipe(ctx, table, rows, false)
}

// goPipe is baseline, with lz4 compression (tidemark's default) when lz4 is
// set: the pipe then pays for compression as tidemark does, and its broker
// stores as few bytes.
func (b *bench) goPipe(ctx context.Context, table string, rows int, lz4 bool) (loadResult, error) {
	kind, codec := "baseline", kgo.NoCompression()
	if lz4 {
		kind, codec = "pipe+lz4", kgo.Lz4Compression()
	}
	topic := b.next("baseline")
	if err := b.k.createTopic(ctx, topic, 6); err != nil {
		return loadResult{}, err
	}
	defer b.k.drop(context.WithoutCancel(ctx), topic)
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.k.addrs...), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerLinger(5*time.Millisecond),
		kgo.ProducerBatchCompression(codec),
		kgo.MaxBufferedRecords(100_000))
	if err != nil {
		return loadResult{}, err
	}
	defer cl.Close()
	// Connect and find the partition leaders before the clock starts, as
	// tidemark's producer has done before its first page.
	if err := cl.Ping(ctx); err != nil {
		return loadResult{}, err
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		return loadResult{}, err
	}
	defer conn.Release()

	pg0, _ := b.pgCP.sample()
	cpu0, brk0 := selfCPU(), b.k.cpu()
	busy0 := machineBusy()
	start := time.Now()
	var failed atomic.Pointer[error]
	w := &copyProducer{ctx: ctx, cl: cl, promise: func(_ *kgo.Record, err error) {
		if err != nil {
			failed.CompareAndSwap(nil, &err)
		}
	}}
	sql := "COPY (SELECT id, row_to_json(t) FROM " + pgx.Identifier{table}.Sanitize() + " t) TO STDOUT"
	if _, err := conn.Conn().PgConn().CopyTo(ctx, w, sql); err != nil {
		return loadResult{}, fmt.Errorf("copy: %w", err)
	}
	if err := w.finish(); err != nil {
		return loadResult{}, err
	}
	if err := cl.Flush(ctx); err != nil {
		return loadResult{}, err
	}
	wall := time.Since(start)
	cpu, brk := selfCPU()-cpu0, b.k.cpu()-brk0
	pg1, _ := b.pgCP.sample()
	other := machineBusy() - busy0 - cpu - brk - (pg1 - pg0)
	if p := failed.Load(); p != nil {
		return loadResult{}, fmt.Errorf("produce: %w", *p)
	}
	if w.rows != int64(rows) {
		return loadResult{}, fmt.Errorf("COPY streamed %d rows, want %d: %w", w.rows, rows, errMismatch)
	}
	n, err := b.k.endOffsets(ctx, topic)
	if err != nil {
		return loadResult{}, err
	}
	if n != int64(rows) {
		return loadResult{}, fmt.Errorf("topic holds %d records, want %d: %w", n, rows, errMismatch)
	}
	return loadResult{kind: kind, rows: w.rows, bytes: w.bytes, wall: wall, selfCPU: cpu, pgCPU: pg1 - pg0, brkCPU: brk, otherCPU: max(other, 0)}, nil
}

// copyProducer turns COPY text-format lines "id<TAB>json" into records.
// Record memory is carved from 1 MiB slabs (pgconn reuses its buffer, and
// the producer holds records until they are acknowledged).
type copyProducer struct {
	ctx     context.Context
	cl      *kgo.Client
	promise func(*kgo.Record, error)
	partial []byte
	slab    []byte
	rows    int64
	bytes   int64
}

func (w *copyProducer) Write(p []byte) (int, error) {
	n := len(p)
	if len(w.partial) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			return n, nil
		}
		w.partial = append(w.partial, p[:i]...)
		if err := w.line(w.partial); err != nil {
			return 0, err
		}
		w.partial = w.partial[:0]
		p = p[i+1:]
	}
	for {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			w.partial = append(w.partial, p...)
			return n, nil
		}
		if err := w.line(p[:i]); err != nil {
			return 0, err
		}
		p = p[i+1:]
	}
}

func (w *copyProducer) finish() error {
	if len(w.partial) > 0 {
		return fmt.Errorf("COPY output ends without a newline")
	}
	return nil
}

func (w *copyProducer) alloc(n int) []byte {
	if len(w.slab) < n {
		w.slab = make([]byte, max(n, 1<<20))
	}
	b := w.slab[:0:n]
	w.slab = w.slab[n:]
	return b
}

func (w *copyProducer) line(l []byte) error {
	tab := bytes.IndexByte(l, '\t')
	if tab < 0 {
		return fmt.Errorf("COPY line without a tab: %.80q", l)
	}
	buf := w.alloc(len(l))
	buf = append(buf, l[:tab]...)
	key := buf[:tab:tab]
	val := unescapeCopy(buf[tab:tab], l[tab+1:])
	w.rows++
	w.bytes += int64(len(key) + len(val))
	w.cl.Produce(w.ctx, &kgo.Record{Key: key, Value: val}, w.promise)
	return nil
}

// unescapeCopy decodes COPY text-format backslash escapes.
func unescapeCopy(dst, s []byte) []byte {
	if bytes.IndexByte(s, '\\') < 0 {
		return append(dst, s...)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 == len(s) {
			dst = append(dst, c)
			continue
		}
		i++
		switch s[i] {
		case 'n':
			dst = append(dst, '\n')
		case 't':
			dst = append(dst, '\t')
		case 'r':
			dst = append(dst, '\r')
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'v':
			dst = append(dst, '\v')
		default:
			dst = append(dst, s[i])
		}
	}
	return dst
}
