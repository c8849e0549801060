package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
)

type profileResult struct {
	summary  string
	cpuFile  string
	memFile  string
	cpuTop   string // go tool pprof -top, broker frames ignored
	cumTop   string
	allocTop string
}

// ignoreBroker drops any samples of a kfake broker in this process (the
// bench's broker runs in a process of its own, so there should be none);
// what remains is tidemark (engine, source, pgx, producer, kgo) and the Go
// runtime serving it.
const ignoreBroker = "kfake"

// profileLoad runs one initial load in this process, wired as `tidemark
// run --once` wires it (postgres.New, producer.New, the fail-closed offsets
// store, the CLI's defaults: margin 10s, dedupe 20000, txn 10000), under a
// CPU profile, and writes an allocation profile after it.
func (b *bench) profileLoad(ctx context.Context, table string, rows int) (profileResult, error) {
	var res profileResult
	name := b.next("profile")
	topic, offTopic, ledTopic := name, name+"-offsets", name+"-ledger"
	defer b.k.drop(context.WithoutCancel(ctx), topic, offTopic, ledTopic)
	opts := []kgo.Opt{kgo.SeedBrokers(b.k.addrs...), kgo.ClientID("tidemark-" + name)}
	logger := slog.New(slog.NewJSONHandler(io.Discard, nil))

	src, err := postgres.New(ctx, postgres.Config{DSN: b.url, Table: table})
	if err != nil {
		return res, err
	}
	defer src.Close()
	if _, err := src.Check(ctx); err != nil {
		return res, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return res, err
	}
	_, err = producer.EnsureTopics(ctx, cl, producer.Topics{Data: topic, Partitions: 6, ReplicationFactor: -1,
		Offsets: offTopic, Ledger: ledTopic, LedgerRetention: 7 * 24 * time.Hour})
	cl.Close()
	if err != nil {
		return res, err
	}
	w, err := producer.New(ctx, producer.Config{Name: name, Topic: topic, OffsetsTopic: offTopic, LedgerTopic: ledTopic,
		TransactionTimeout: time.Minute, Opts: opts, Logger: logger})
	if err != nil {
		return res, err
	}
	defer w.Close()
	store := offsets.NewStore(opts, offTopic, name).FailClosed(offsets.NewLedger(opts, ledTopic, name), topic)
	e, err := connector.New(connector.Config{
		Name: name, PageSize: 1000, Margin: 10 * time.Second, PollInterval: time.Second, PollJitter: 0.2,
		TxnMaxRecords: 10000, TxnMaxBytes: 16 << 20, TxnMaxDuration: 5 * time.Second,
		Fingerprint: "bench", FingerprintFields: map[string]string{"name": name}, Logger: logger,
	}, src, w, store)
	if err != nil {
		return res, err
	}

	res.cpuFile = filepath.Join(b.work, "cpu.pprof")
	res.memFile = filepath.Join(b.work, "allocs.pprof")
	memBase := filepath.Join(b.work, "allocs-before.pprof")
	f, err := os.Create(res.cpuFile)
	if err != nil {
		return res, err
	}
	runtime.GC()
	if err := writeProfile("allocs", memBase); err != nil {
		f.Close()
		return res, err
	}
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return res, err
	}
	start := time.Now()
	cpu0 := selfCPU()
	c, err := e.Run(ctx, connector.Once)
	el := time.Since(start)
	cpu := selfCPU() - cpu0
	pprof.StopCPUProfile()
	f.Close()
	runtime.ReadMemStats(&ms1)
	if err != nil {
		return res, err
	}
	if c.Published != int64(rows) {
		return res, fmt.Errorf("profiled load published %d rows, want %d: %w", c.Published, rows, errMismatch)
	}
	if err := writeProfile("allocs", res.memFile); err != nil {
		return res, err
	}
	res.summary = fmt.Sprintf("%d rows in %.2fs in-process (%.0f rows/s, the engine in the bench process, %.1f CPU-s by rusage); %.0f bytes and %.1f allocations per row (whole process)",
		rows, el.Seconds(), float64(rows)/el.Seconds(), cpu.Seconds(),
		float64(ms1.TotalAlloc-ms0.TotalAlloc)/float64(rows), float64(ms1.Mallocs-ms0.Mallocs)/float64(rows))
	res.cpuTop = pprofTop(ctx, res.cpuFile, "-top")
	res.cumTop = pprofTop(ctx, res.cpuFile, "-top", "-cum")
	res.allocTop = pprofTop(ctx, res.memFile, "-top", "-sample_index=alloc_space", "-base="+memBase)
	return res, nil
}

func writeProfile(name, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup(name).WriteTo(f, 0)
}

// pprofTop runs `go tool pprof` on a profile with the broker's frames
// ignored and returns the header and the top 25 lines.
func pprofTop(ctx context.Context, file string, args ...string) string {
	cctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	args = append([]string{"tool", "pprof", "-nodecount=25", "-ignore=" + ignoreBroker}, args...)
	out, err := exec.CommandContext(cctx, "go", append(args, file)...).Output()
	if err != nil {
		return fmt.Sprintf("(go tool pprof failed: %v)", err)
	}
	var keep []string
	for _, l := range strings.Split(strings.TrimRight(string(out), "\n"), "\n") {
		if strings.HasPrefix(l, "File:") || strings.HasPrefix(l, "Build ID:") || strings.HasPrefix(l, "Type:") || strings.HasPrefix(l, "Time:") {
			continue
		}
		keep = append(keep, l)
	}
	return strings.Join(keep, "\n")
}
