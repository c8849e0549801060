package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// broker is the Kafka cluster of the run: KAFKA_BROKERS, or a kfake broker
// on loopback in a process of its own (this program, re-run with
// -serve-broker). Both the baseline and tidemark use it. In its own
// process the broker's CPU is measured apart from the Go pipe's client and
// from the bench's read-back of every run's topic, whose garbage had been
// collected at random inside timed runs while the broker shared this
// process.
type broker struct {
	addrs []string
	proc  *exec.Cmd // the broker process; nil with KAFKA_BROKERS
	stdin io.Closer // the broker process's standard input: closing it stops the broker
	adm   *kadm.Client
	cl    *kgo.Client
}

func newBroker() (*broker, error) {
	k := &broker{}
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		k.addrs = strings.Split(v, ",")
	} else if err := k.spawn(); err != nil {
		return nil, err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addrs...))
	if err != nil {
		k.close()
		return nil, err
	}
	k.cl, k.adm = cl, kadm.NewClient(cl)
	return k, nil
}

// spawn starts the broker process and reads its address. It stops when its
// standard input closes (close), or with this process (Pdeathsig).
func (k *broker) spawn() error {
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("the bench's own executable, to run the broker: %w", err)
	}
	cmd := exec.Command(exe, "-serve-broker")
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the broker process: %w", err)
	}
	k.proc, k.stdin = cmd, stdin
	// A broker that does not say its address within a minute is killed,
	// which ends the read below.
	t := time.AfterFunc(time.Minute, func() { _ = cmd.Process.Kill() })
	line, err := bufio.NewReader(stdout).ReadString('\n')
	t.Stop()
	if err != nil {
		k.close()
		return fmt.Errorf("the broker process did not say its address: %w", err)
	}
	k.addrs = []string{strings.TrimSpace(line)}
	return nil
}

// serveBroker is the broker process (-serve-broker): one kfake broker on a
// free loopback port, its address on standard output, until standard input
// closes. It ignores SIGINT and SIGTERM: a Ctrl-C reaches the whole process
// group, and the bench, stopping, still drops its topics and waits for the
// tidemark it runs to abort its transaction, through this broker.
func serveBroker() int {
	signal.Ignore(os.Interrupt, syscall.SIGTERM)
	// kfake's defaults, as on a fresh Kafka 4 cluster: transaction protocol
	// version 2, one epoch bump per commit and no AddPartitionsToTxn round
	// trip. tidemark's own brokers run version 1 for kfake's fencing
	// (internal/kfakebroker); the bench runs one writer, which never meets
	// that.
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		log.Printf("kfake: %v", err)
		return 1
	}
	defer c.Close()
	fmt.Println(c.ListenAddrs()[0])
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// cpu is the broker process's CPU time so far (user+system of all its
// threads, 10 ms resolution); 0 with KAFKA_BROKERS, whose CPU is not seen.
func (k *broker) cpu() time.Duration {
	if k.proc == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", k.proc.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name (which may hold spaces) in parentheses:
	// state is field 3, utime 14, stime 15, in clock ticks of 1/100 s.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100)
}

func (k *broker) describe() string {
	if k.proc != nil {
		return "kfake (1 broker, in a process of its own) at " + k.addrs[0]
	}
	return "KAFKA_BROKERS=" + strings.Join(k.addrs, ",")
}

func (k *broker) close() {
	if k.cl != nil {
		k.cl.Close()
	}
	if k.proc != nil {
		_ = k.stdin.Close()
		done := make(chan struct{})
		go func() { _ = k.proc.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = k.proc.Process.Kill()
			<-done
		}
	}
}

// createTopic creates a plain topic with the data topic's partition count.
func (k *broker) createTopic(ctx context.Context, topic string, partitions int32) error {
	resp, err := k.adm.CreateTopic(ctx, partitions, -1, nil, topic)
	if err == nil {
		err = resp.Err
	}
	return err
}

// drop deletes the topics of a finished run so the broker does not keep
// every run's records in memory.
func (k *broker) drop(ctx context.Context, topics ...string) {
	_, _ = k.adm.DeleteTopics(ctx, topics...)
}

// endOffsets sums the end offsets of a topic's partitions.
func (k *broker) endOffsets(ctx context.Context, topic string) (int64, error) {
	lo, err := k.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return 0, err
	}
	var n int64
	var ferr error
	lo.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			ferr = o.Err
		}
		n += o.Offset
	})
	return n, ferr
}

// countCommitted reads a topic read_committed from the start until want
// records arrived (or nothing new came for 5 s) and returns the number of
// records and their key+value bytes.
func (k *broker) countCommitted(ctx context.Context, topic string, want int64) (n, bytes int64, err error) {
	n, bytes, err = k.readCommitted(ctx, topic, want)
	if err != nil || n >= want {
		return n, bytes, err
	}
	// A short read: say where the topic's offsets stand (a transaction
	// left open holds the last stable offset back), then read it all again
	// once. The count that is returned is always a full read.
	fmt.Printf("      read back %s: %d of %d records within 5 s of the last one; %s; reading it again\n", topic, n, want, k.offsets(ctx, topic))
	return k.readCommitted(ctx, topic, want)
}

// offsets describes topic's partitions: end offset and last stable offset.
func (k *broker) offsets(ctx context.Context, topic string) string {
	end, err := k.adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return "end offsets: " + err.Error()
	}
	stable, err := k.adm.ListCommittedOffsets(ctx, topic)
	if err != nil {
		return "last stable offsets: " + err.Error()
	}
	var parts []string
	end.Each(func(o kadm.ListedOffset) {
		s, _ := stable.Lookup(o.Topic, o.Partition)
		parts = append(parts, fmt.Sprintf("p%d end %d stable %d", o.Partition, o.Offset, s.Offset))
	})
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// readCommitted is one read of countCommitted.
func (k *broker) readCommitted(ctx context.Context, topic string, want int64) (n, bytes int64, err error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addrs...), kgo.ConsumeTopics(topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxBytes(64<<20), kgo.FetchMaxPartitionBytes(16<<20))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	last := time.Now()
	for n < want && time.Since(last) < 5*time.Second {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		pcancel()
		if ctx.Err() != nil {
			return n, bytes, ctx.Err()
		}
		fs.EachError(func(_ string, _ int32, e error) {
			if e != context.DeadlineExceeded && e != context.Canceled && err == nil {
				err = e
			}
		})
		if err != nil {
			return n, bytes, err
		}
		fs.EachRecord(func(r *kgo.Record) {
			n++
			bytes += int64(len(r.Key) + len(r.Value))
			last = time.Now()
		})
	}
	return n, bytes, nil
}
