package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tidemark/tidemark/connector"
)

// ensureBinary builds the tidemark binary when it is missing.
func ensureBinary(ctx context.Context, path string) (string, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	if st, err := os.Stat(abs); err == nil && !st.IsDir() {
		return abs, nil
	}
	fmt.Printf("%s is missing: go build -o %s ./cmd/tidemark\n", path, path)
	bctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	if b, err := exec.CommandContext(bctx, "go", "build", "-o", abs, "./cmd/tidemark").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/tidemark: %w\n%s", err, b)
	}
	return abs, nil
}

// tmRun is one tidemark connector: its own name and topics, so that runs
// never dedupe against each other.
type tmRun struct {
	name, topic, offsets, ledger string
	config                       string
	log                          string
}

// newRun writes the configuration of a fresh connector reading table:
// tidemark's defaults except for what the bench sets (brokers, topics,
// poll interval, and txn_max_records when txn > 0).
func (b *bench) newRun(table string, txn int) (*tmRun, error) {
	name := b.next("tm")
	r := &tmRun{name: name, topic: name, offsets: name + "-offsets", ledger: name + "-ledger",
		config: filepath.Join(b.work, name+".yaml"), log: filepath.Join(b.work, name+".log")}
	q := func(s string) string { j, _ := json.Marshal(s); return string(j) } // a JSON string is a YAML string
	var brokers []string
	for _, a := range b.k.addrs {
		brokers = append(brokers, q(a))
	}
	cfg := fmt.Sprintf(`# written by test/bench
name: %s
data_dir: %s
source:
  dsn: %s
  table: %s
kafka:
  brokers: [%s]
  topic: %s
  offsets_topic: %s
  ledger_topic: %s
sync:
  poll_interval: 1s
`, q(name), q(filepath.Join(b.work, name+"-data")), q(b.url), q(table), strings.Join(brokers, ", "), q(r.topic), q(r.offsets), q(r.ledger))
	if txn > 0 {
		cfg += fmt.Sprintf("  txn_max_records: %d\n", txn)
	}
	cfg += "log:\n  format: json\n"
	return r, os.WriteFile(r.config, []byte(cfg), 0o600)
}

// proc is a tidemark subprocess.
type proc struct {
	cmd    *exec.Cmd
	stdout bytes.Buffer
	start  time.Time
	done   chan struct{}
	err    error
	wall   time.Duration
	hwmKB  atomic.Int64 // peak RSS (VmHWM) seen so far
}

func (b *bench) start(r *tmRun, args ...string) (*proc, error) {
	lf, err := os.OpenFile(r.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(b.bin, append(args, "--config", r.config)...)
	p.cmd.Stdout = &p.stdout
	p.cmd.Stderr = lf
	// The configuration file says everything: no TIDEMARK_* overrides, and
	// KAFKA_BROKERS (which outranks the file) names the same brokers.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TIDEMARK_") && !strings.HasPrefix(kv, "KAFKA_BROKERS=") {
			env = append(env, kv)
		}
	}
	p.cmd.Env = append(env, "KAFKA_BROKERS="+strings.Join(b.k.addrs, ","))
	// BENCH_PROFILE_DIR=DIR: each run writes a CPU profile named after its
	// log (for performance work, with -keep).
	if dir := os.Getenv("BENCH_PROFILE_DIR"); dir != "" {
		p.cmd.Env = append(p.cmd.Env, "TIDEMARK_CPUPROFILE="+filepath.Join(dir, strings.TrimSuffix(filepath.Base(r.log), ".log")+".pprof"))
	}
	// Pdeathsig: if the bench dies, so does tidemark.
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.start = time.Now()
	if err := p.cmd.Start(); err != nil {
		lf.Close()
		return nil, err
	}
	go p.watchRSS()
	go func() {
		p.err = p.cmd.Wait()
		p.wall = time.Since(p.start)
		lf.Close()
		close(p.done)
	}()
	return p, nil
}

// stop sends SIGTERM and waits up to grace, then SIGKILL.
func (p *proc) stop(grace time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// wait waits for the process, killing it when ctx ends.
func (p *proc) wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.err
	case <-ctx.Done():
		p.stop(10 * time.Second)
		return ctx.Err()
	}
}

// rusage returns the CPU time of the exited process (rusage) and its peak
// RSS. The peak is VmHWM from /proc/<pid>/status, sampled every 20 ms
// while it runs: ru_maxrss of a child of a Go process is useless here,
// because Go starts children with vfork (CLONE_VM), and exec records the
// parent's RSS high-water mark (this process reads every run's topic back)
// into the child's maxrss.
func (p *proc) rusage() (cpu time.Duration, maxRSSKB int64) {
	st := p.cmd.ProcessState
	if st == nil {
		return 0, 0
	}
	return st.UserTime() + st.SystemTime(), p.hwmKB.Load()
}

func (p *proc) watchRSS() {
	path := filepath.Join("/proc", strconv.Itoa(p.cmd.Process.Pid), "status")
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if b, err := os.ReadFile(path); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
					if kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64); err == nil && kb > p.hwmKB.Load() {
						p.hwmKB.Store(kb)
					}
				}
			}
		}
		select {
		case <-p.done:
			return
		case <-t.C:
		}
	}
}

// tidemarkLoad runs `tidemark run --once --json` on a fresh connector and
// checks that the topic holds exactly one committed record per row.
func (b *bench) tidemarkLoad(ctx context.Context, table string, rows, txn int) (loadResult, error) {
	return b.tidemarkLoadWith(ctx, table, rows, txn)
}

// tidemarkLoadWith is tidemarkLoad with extra command-line settings.
func (b *bench) tidemarkLoadWith(ctx context.Context, table string, rows, txn int, extra ...string) (loadResult, error) {
	r, err := b.newRun(table, txn)
	if err != nil {
		return loadResult{}, err
	}
	defer b.k.drop(context.WithoutCancel(ctx), r.topic, r.offsets, r.ledger)
	pg0, _ := b.pgCP.sample()
	brk0, self0 := b.k.cpu(), selfCPU()
	busy0 := machineBusy()
	p, err := b.start(r, append([]string{"run", "--once", "--json"}, extra...)...)
	if err != nil {
		return loadResult{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	werr := p.wait(wctx)
	brk, self := b.k.cpu()-brk0, selfCPU()-self0
	pg1, _ := b.pgCP.sample()
	busy := machineBusy() - busy0
	if werr != nil {
		return loadResult{}, fmt.Errorf("tidemark run --once: %v (log: %s)\n%s", werr, r.log, tail(r.log, 20))
	}
	var c connector.Completion
	if err := json.Unmarshal(p.stdout.Bytes(), &c); err != nil {
		return loadResult{}, fmt.Errorf("completion record: %w: %q", err, p.stdout.String())
	}
	if c.Published != int64(rows) || c.Raw != int64(rows) {
		return loadResult{}, fmt.Errorf("tidemark read %d and published %d rows, want %d: %w", c.Raw, c.Published, rows, errMismatch)
	}
	n, nbytes, err := b.k.countCommitted(ctx, r.topic, int64(rows))
	if err != nil {
		return loadResult{}, fmt.Errorf("read back %s: %w", r.topic, err)
	}
	if n != int64(rows) {
		return loadResult{}, fmt.Errorf("topic %s holds %d committed records, want %d: %w", r.topic, n, rows, errMismatch)
	}
	cpu, rss := p.rusage()
	other := busy - cpu - brk - self - (pg1 - pg0) // the bench process itself is not "other"
	return loadResult{otherCPU: max(other, 0),
		kind: "tidemark", txn: txn, rows: n, bytes: nbytes, wall: p.wall,
		engine:  time.Duration(c.Seconds * float64(time.Second)),
		selfCPU: cpu, pgCPU: pg1 - pg0, brkCPU: brk, maxRSSKB: rss, txns: c.Transactions, pages: c.Pages,
	}, nil
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
