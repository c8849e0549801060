package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// broker is the Kafka cluster of the run: KAFKA_BROKERS, or an in-process
// kfake broker on loopback. Both the baseline and tidemark use it.
type broker struct {
	addrs   []string
	cluster *kfake.Cluster
	adm     *kadm.Client
	cl      *kgo.Client
}

func newBroker() (*broker, error) {
	k := &broker{}
	if v := os.Getenv("KAFKA_BROKERS"); v != "" {
		k.addrs = strings.Split(v, ",")
	} else {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			return nil, fmt.Errorf("kfake: %w", err)
		}
		k.cluster = c
		k.addrs = c.ListenAddrs()
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(k.addrs...))
	if err != nil {
		k.close()
		return nil, err
	}
	k.cl, k.adm = cl, kadm.NewClient(cl)
	return k, nil
}

func (k *broker) describe() string {
	if k.cluster != nil {
		return "in-process kfake (1 broker, in the bench process) at " + k.addrs[0]
	}
	return "KAFKA_BROKERS=" + strings.Join(k.addrs, ",")
}

func (k *broker) close() {
	if k.cl != nil {
		k.cl.Close()
	}
	if k.cluster != nil {
		k.cluster.Close()
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

// drop deletes the topics of a finished run so an in-process broker does
// not keep every run's records in memory.
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
