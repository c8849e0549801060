package main

// The issue's literal raw pipe, `psql -c "COPY (SELECT …) TO STDOUT" | kcat
// -P`: two processes of their own (psql, and kcat on librdkafka with an
// idempotent producer), next to the Go pipe of baseline.go (a client in the bench process), so
// that the ratio does not rest on one client alone. Skipped when psql or
// kcat is not installed (apt package kcat).

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// kcatPath returns the paths of psql and kcat, or "" when either is
// missing.
func kcatPath() (psql, kcat string) {
	p, err := exec.LookPath("psql")
	if err != nil {
		return "", ""
	}
	k, err := exec.LookPath("kcat")
	if err != nil {
		return "", ""
	}
	return p, k
}

// kcatBaseline runs `psql -c "COPY (SELECT id, row_to_json(t) FROM t) TO
// STDOUT" | kcat -P -K <TAB>` into a fresh topic: idempotent producer, acks
// all, 5 ms linger, no compression, as the Go pipe. CPU: psql and kcat from
// their rusage, PostgreSQL and the broker process as elsewhere.
func (b *bench) kcatBaseline(ctx context.Context, table string, rows int) (loadResult, error) {
	psql, kcat := kcatPath()
	if kcat == "" {
		return loadResult{}, fmt.Errorf("psql or kcat not on PATH")
	}
	topic := b.next("kcat")
	if err := b.k.createTopic(ctx, topic, 6); err != nil {
		return loadResult{}, err
	}
	defer b.k.drop(context.WithoutCancel(ctx), topic)
	sql := "COPY (SELECT id, row_to_json(t) FROM " + pgx.Identifier{table}.Sanitize() + " t) TO STDOUT"
	pc := exec.CommandContext(ctx, psql, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", b.url, "-c", sql)
	kc := exec.CommandContext(ctx, kcat, "-P", "-b", strings.Join(b.k.addrs, ","), "-t", topic, "-K", "\t", "-z", "none",
		"-X", "enable.idempotence=true", "-X", "acks=all", "-X", "linger.ms=5", "-X", "partitioner=murmur2_random",
		"-X", "queue.buffering.max.messages=100000")
	out, err := pc.StdoutPipe()
	if err != nil {
		return loadResult{}, err
	}
	kc.Stdin = out
	var perr, kerr strings.Builder
	pc.Stderr, kc.Stderr = &perr, &kerr
	kc.Stdout = io.Discard

	pg0, _ := b.pgCP.sample()
	brk0, self0 := b.k.cpu(), selfCPU()
	busy0 := machineBusy()
	start := time.Now()
	if err := kc.Start(); err != nil {
		return loadResult{}, fmt.Errorf("start kcat: %w", err)
	}
	if err := pc.Start(); err != nil {
		_ = kc.Process.Kill()
		_ = kc.Wait()
		return loadResult{}, fmt.Errorf("start psql: %w", err)
	}
	if err := pc.Wait(); err != nil {
		_ = kc.Process.Kill()
		_ = kc.Wait()
		return loadResult{}, fmt.Errorf("psql: %w: %s", err, tailOf(perr.String()))
	}
	if err := kc.Wait(); err != nil {
		return loadResult{}, fmt.Errorf("kcat: %w: %s", err, tailOf(kerr.String()))
	}
	wall := time.Since(start)
	brk, self := b.k.cpu()-brk0, selfCPU()-self0
	pg1, _ := b.pgCP.sample()
	client := childCPU(pc) + childCPU(kc)
	other := machineBusy() - busy0 - brk - self - client - (pg1 - pg0)
	n, bytes, err := b.k.countCommitted(ctx, topic, int64(rows))
	if err != nil {
		return loadResult{}, err
	}
	if n != int64(rows) {
		return loadResult{}, fmt.Errorf("psql | kcat: the topic holds %d records, want %d (kcat said: %s): %w", n, rows, tailOf(kerr.String()), errMismatch)
	}
	return loadResult{kind: "kcat", rows: n, bytes: bytes, wall: wall, selfCPU: client, pgCPU: pg1 - pg0, brkCPU: brk, otherCPU: max(other, 0)}, nil
}

// childCPU is an exited command's user+system time.
func childCPU(c *exec.Cmd) time.Duration {
	if c.ProcessState == nil {
		return 0
	}
	return c.ProcessState.UserTime() + c.ProcessState.SystemTime()
}

func tailOf(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 300 {
		s = "..." + s[len(s)-300:]
	}
	return s
}
