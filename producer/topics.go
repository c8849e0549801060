package producer

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
)

// Topics says which topics to create or check.
type Topics struct {
	// Data is the data topic; created compacted with Partitions and
	// ReplicationFactor (-1 = broker default) when missing.
	Data              string
	Partitions        int32
	ReplicationFactor int16
	// AllowNonCompacted accepts an existing data topic whose cleanup.policy
	// lacks compact (a consumer of such a topic cannot rebuild state).
	AllowNonCompacted bool
	// Offsets is the offsets topic: compacted, exactly one partition.
	Offsets string
	// Ledger ("" = none) is the ledger topic: one partition, time-based
	// retention of LedgerRetention (default 7 days).
	Ledger          string
	LedgerRetention time.Duration
}

// ErrTopicConfig marks a topic (or topic setting) the broker or tidemark
// refuses, which only a change of configuration or of the topic fixes. It
// is permanent: retrying gives the same answer.
var ErrTopicConfig = errors.New("topic refused")

// errTopicConfig wraps both ErrTopicConfig and connector.ErrPermanent.
var errTopicConfig = fmt.Errorf("%w (%w)", ErrTopicConfig, connector.ErrPermanent)

// compactOnly reports whether a cleanup.policy compacts and deletes nothing
// by time or size ("compact,delete" also expires records).
func compactOnly(policy string) bool {
	compact := false
	for p := range strings.SplitSeq(policy, ",") {
		switch strings.TrimSpace(p) {
		case "compact":
			compact = true
		case "":
		default:
			return false
		}
	}
	return compact
}

// EnsureTopics creates missing topics and checks existing ones against
// docs/design.md, "Records". It returns one human line per topic saying what it found or
// did. A refused topic is a permanent error naming the fix.
func EnsureTopics(ctx context.Context, cl *kgo.Client, t Topics) ([]string, error) {
	adm := kadm.NewClient(cl)
	var report []string
	line, err := ensure(ctx, adm, t.Data, t.Partitions, t.ReplicationFactor, map[string]*string{
		"cleanup.policy": kadm.StringPtr("compact"),
	}, func(cfg map[string]string, parts int) error {
		if !compactOnly(cfg["cleanup.policy"]) && !t.AllowNonCompacted {
			return fmt.Errorf("data topic %q has cleanup.policy=%s: a consumer cannot rebuild state from a non-compacted topic once old records expire; "+
				"run `kafka-configs --alter --entity-type topics --entity-name %s --add-config cleanup.policy=compact`, or set kafka.allow_non_compacted: true to accept it: %w",
				t.Data, cfg["cleanup.policy"], t.Data, errTopicConfig)
		}
		return nil
	})
	if err != nil {
		return report, err
	}
	report = append(report, line)
	line, err = ensure(ctx, adm, t.Offsets, 1, t.ReplicationFactor, map[string]*string{
		"cleanup.policy":    kadm.StringPtr("compact"),
		"max.message.bytes": kadm.StringPtr(strconv.Itoa(1 << 20)), // above MaxBatchBytes
	}, func(cfg map[string]string, parts int) error {
		if parts != 1 {
			return fmt.Errorf("offsets topic %q has %d partitions; it must have exactly 1 so that one read finds a connector's latest checkpoint; use another kafka.offsets_topic: %w", t.Offsets, parts, errTopicConfig)
		}
		if !compactOnly(cfg["cleanup.policy"]) {
			return fmt.Errorf("offsets topic %q has cleanup.policy=%s; checkpoints would expire and the connector would have to stop; make it compact or use another kafka.offsets_topic: %w", t.Offsets, cfg["cleanup.policy"], errTopicConfig)
		}
		if v, ok := cfg["max.message.bytes"]; ok && v != "" {
			if n, err := strconv.Atoi(v); err == nil && n < MaxBatchBytes {
				return fmt.Errorf("offsets topic %q has max.message.bytes=%d; tidemark writes batches of up to %d bytes there (dedupe-set segments and checkpoints), so every commit would fail: "+
					"run `kafka-configs --alter --entity-type topics --entity-name %s --add-config max.message.bytes=%d` (or more), or use another kafka.offsets_topic: %w",
					t.Offsets, n, MaxBatchBytes, t.Offsets, MaxBatchBytes, errTopicConfig)
			}
		}
		return nil
	})
	if err != nil {
		return report, err
	}
	report = append(report, line)
	if t.Ledger == "" {
		return report, nil
	}
	ret := t.LedgerRetention
	if ret <= 0 {
		ret = 7 * 24 * time.Hour
	}
	line, err = ensure(ctx, adm, t.Ledger, 1, t.ReplicationFactor, map[string]*string{
		"cleanup.policy": kadm.StringPtr("delete"),
		"retention.ms":   kadm.StringPtr(strconv.FormatInt(ret.Milliseconds(), 10)),
	}, func(cfg map[string]string, parts int) error {
		if parts != 1 {
			return fmt.Errorf("ledger topic %q has %d partitions; it must have exactly 1 so entries stay in commit order; use another kafka.ledger_topic: %w", t.Ledger, parts, errTopicConfig)
		}
		return nil
	})
	if err != nil {
		return report, err
	}
	return append(report, line), nil
}

func ensure(ctx context.Context, adm *kadm.Client, topic string, parts int32, rf int16, configs map[string]*string, check func(map[string]string, int) error) (string, error) {
	return ensureTry(ctx, adm, topic, parts, rf, configs, check, 0)
}

// ensureTries bounds how often ensure goes round between a topic it cannot
// describe and a create the broker refuses because the topic exists: the
// client's metadata lags a topic created meanwhile by up to several
// seconds, and a topic being deleted stays so. 300 times 100 ms is 30 s.
const ensureTries = 300

func ensureTry(ctx context.Context, adm *kadm.Client, topic string, parts int32, rf int16, configs map[string]*string, check func(map[string]string, int) error, try int) (string, error) {
	details, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return "", fmt.Errorf("describe topic %q: %w", topic, classify(err))
	}
	d, ok := details[topic]
	if ok && d.Err == nil {
		rcs, err := adm.DescribeTopicConfigs(ctx, topic)
		if err != nil {
			return "", fmt.Errorf("describe configs of %q: %w", topic, classify(err))
		}
		cfg := map[string]string{}
		for _, rc := range rcs {
			if rc.Err != nil {
				return "", fmt.Errorf("describe configs of %q: %w", topic, classify(rc.Err))
			}
			for _, c := range rc.Configs {
				cfg[c.Key] = c.MaybeValue()
			}
		}
		if err := check(cfg, len(d.Partitions)); err != nil {
			return "", err
		}
		return fmt.Sprintf("topic %s: exists, %d partitions, cleanup.policy=%s", topic, len(d.Partitions), cfg["cleanup.policy"]), nil
	}
	if ok && d.Err != nil && !errors.Is(d.Err, kerr.UnknownTopicOrPartition) {
		return "", fmt.Errorf("describe topic %q: %w", topic, classify(d.Err))
	}
	resp, err := adm.CreateTopic(ctx, parts, rf, configs, topic)
	if err == nil {
		err = resp.Err
	}
	if errors.Is(err, kerr.TopicAlreadyExists) {
		// Created meanwhile by another process: describe it again. A topic
		// that stays unknown yet exists (being deleted) is not waited on
		// for ever: the caller's retry takes over, with its backoff.
		if try+1 >= ensureTries {
			return "", fmt.Errorf("topic %q exists but cannot be described (is it being deleted?): %w", topic, err)
		}
		t := time.NewTimer(100 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-t.C:
		}
		return ensureTry(ctx, adm, topic, parts, rf, configs, check, try+1)
	}
	if errors.Is(err, kerr.InvalidReplicationFactor) || errors.Is(err, kerr.InvalidPartitions) || errors.Is(err, kerr.PolicyViolation) || errors.Is(err, kerr.InvalidConfig) {
		// The broker will refuse it again: a setting to change.
		return "", fmt.Errorf("create topic %q with %d partitions and replication factor %d: %w; change kafka.partitions or kafka.replication_factor (-1 is the broker's default), or create the topic yourself: %w",
			topic, parts, rf, err, errTopicConfig)
	}
	if err != nil {
		return "", fmt.Errorf("create topic %q: %w", topic, classify(err))
	}
	return fmt.Sprintf("topic %s: created, %d partitions, cleanup.policy=%s", topic, parts, *configs["cleanup.policy"]), nil
}
