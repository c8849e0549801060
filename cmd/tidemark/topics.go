package main

import (
	"context"
	"regexp"
	"strings"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

var policyRE = regexp.MustCompile(`cleanup\.policy=\S*`)

// realPolicy rewrites the cleanup.policy of a line of producer.EnsureTopics
// ("topic NAME: created, N partitions, cleanup.policy=X") with the policy
// the broker reports: EnsureTopics says compact for every topic it creates,
// the delete-policy ledger too. The line is unchanged when the broker does
// not answer.
func realPolicy(ctx context.Context, cl *kgo.Client, line string) string {
	rest, ok := strings.CutPrefix(line, "topic ")
	if !ok {
		return line
	}
	topic, _, ok := strings.Cut(rest, ": ")
	if !ok {
		return line
	}
	rcs, err := kadm.NewClient(cl).DescribeTopicConfigs(ctx, topic)
	if err != nil {
		return line
	}
	for _, rc := range rcs {
		for _, c := range rc.Configs {
			if c.Key == "cleanup.policy" && rc.Err == nil {
				return policyRE.ReplaceAllLiteralString(line, "cleanup.policy="+c.MaybeValue())
			}
		}
	}
	return line
}
