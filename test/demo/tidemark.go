package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ensureBinary builds the tidemark binary when it is missing.
func ensureBinary(ctx context.Context, path string) (string, error) {
	if st, err := os.Stat(path); err == nil && !st.IsDir() {
		return filepath.Abs(path)
	}
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("%s is missing and `go env GOMOD` failed: %w", path, err)
	}
	root := filepath.Dir(strings.TrimSpace(string(out)))
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	fmt.Printf("      %s is missing: go build -o %s ./cmd/tidemark\n", path, path)
	bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", "build", "-o", abs, "./cmd/tidemark")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/tidemark: %w\n%s", err, b)
	}
	return abs, nil
}

// writeConfig writes the demo's tidemark configuration: embedded Kafka
// (no kafka.brokers), JSON logs so that the demo can follow them.
func writeConfig(dir, dsn string, pageSize int, poll time.Duration) (string, error) {
	q := func(s string) string { b, _ := json.Marshal(s); return string(b) } // a JSON string is a YAML string
	cfg := fmt.Sprintf(`# written by test/demo
name: tidemark-demo
data_dir: %s
source:
  dsn: %s
  schema: %s
  table: %s
  deleted_at_column: deleted_at
sync:
  page_size: %d
  poll_interval: %s
log:
  format: json
`, q(dir), q(dsn), demoSchema, demoTable, pageSize, poll)
	p := filepath.Join(dir, "tidemark.yaml")
	return p, os.WriteFile(p, []byte(cfg), 0o600)
}

// proc is a tidemark subprocess. Its stderr (the log) goes to logFile, its
// stdout to a buffer.
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	done   chan struct{}
	err    error
}

func startTidemark(bin, logFile string, args ...string) (*proc, error) {
	lf, err := os.OpenFile(logFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = lf
	p.cmd.Env = append(os.Environ(), "KAFKA_BROKERS=", "TIDEMARK_KAFKA_BROKERS=") // always the embedded broker
	// Its own process group: a Ctrl-C in the terminal reaches the demo,
	// which stops tidemark itself. Pdeathsig: if the demo dies, so does it.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	go func() {
		p.err = p.cmd.Wait()
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM and waits up to grace; then SIGKILL. It returns the
// exit code (-1 when killed) and whether SIGKILL was needed.
func (p *proc) stop(grace time.Duration) (code int, killed bool) {
	if !p.exited() {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = p.cmd.Process.Kill()
			<-p.done
			killed = true
		}
	}
	return p.cmd.ProcessState.ExitCode(), killed
}

// wait waits up to d for the process to exit by itself.
func (p *proc) wait(ctx context.Context, d time.Duration) (int, error) {
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode(), nil
	case <-ctx.Done():
		p.stop(5 * time.Second)
		return -1, ctx.Err()
	case <-time.After(d):
		p.stop(5 * time.Second)
		return -1, fmt.Errorf("still running after %s: killed", d)
	}
}

// logLine is the part of tidemark's JSON log the demo reads.
type logLine struct {
	Time      time.Time `json:"time"`
	Level     string    `json:"level"`
	Msg       string    `json:"msg"`
	Seq       int64     `json:"seq"`
	Records   int64     `json:"records"`
	Pages     int64     `json:"pages"`
	Phase     string    `json:"phase"`
	Watermark string    `json:"watermark"`
	Err       string    `json:"err"`
}

// logSummary is what the demo learns from the log of one run.
type logSummary struct {
	lastCommit   *logLine
	commits      int
	warnings     []string
	started      time.Time
	initialDone  time.Time // first commit with phase idle: the end of the initial load
	initialRecs  int64
	initialPages int64
}

// readLog summarizes tidemark's JSON log.
func readLog(path string) logSummary {
	var s logSummary
	f, err := os.Open(path)
	if err != nil {
		return s
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		if l.Msg == "starting" && s.started.IsZero() {
			s.started = l.Time
		}
		switch {
		case l.Msg == "committed":
			s.commits++
			ll := l
			s.lastCommit = &ll
			if s.initialDone.IsZero() {
				s.initialRecs += l.Records
				s.initialPages += l.Pages
				if l.Phase == "idle" {
					s.initialDone = l.Time
				}
			}
		case l.Level == "WARN" || l.Level == "ERROR":
			if !strings.HasPrefix(l.Msg, "EMBEDDED KAFKA") {
				s.warnings = append(s.warnings, strings.TrimSpace(l.Msg+" "+l.Err))
			}
		}
	}
	return s
}
