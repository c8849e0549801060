// Package kfakebroker starts the in-process Kafka-protocol broker (kfake)
// that tidemark embeds and tests against, set up so that its transactions
// fence the way Apache Kafka's do.
//
// kfake with Kafka's transaction protocol version 2 (KIP-890 part 2, the
// default of a fresh Kafka 4 cluster) answers an EndTxn from a session that
// a newer one has fenced with success and the newer session's epoch, where
// Apache Kafka answers PRODUCER_FENCED. The fenced session then writes at the
// live session's producer id and epoch: it can commit, and the live session
// fails with OUT_OF_ORDER_SEQUENCE_NUMBER. With version 1 kfake answers
// PRODUCER_FENCED (docs/design.md, "One writer").
package kfakebroker

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TransactionVersion is the level of Kafka's transaction.version feature
// that New finalizes.
const TransactionVersion = 1

// New starts a kfake cluster with opts, its brokers listening through
// listen (nil: net.Listen), and finalizes transaction.version at
// TransactionVersion before any other client is served: the connections
// that clients make meanwhile wait in a gate. The level is not persisted
// with kfake.DataDir: New sets it on every start. An opts' kfake.ListenFn
// replaces the gate (the level is still set, but a client connecting at
// once may see the other one).
func New(listen func(network, address string) (net.Listener, error), opts ...kfake.Opt) (*kfake.Cluster, error) {
	if listen == nil {
		listen = net.Listen
	}
	gs := &gates{}
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.ListenFn(gs.listen(listen))}, opts...)...)
	if err != nil {
		return nil, err
	}
	if err := setTransactionVersion(c, gs); err != nil {
		c.Close()
		return nil, err
	}
	gs.release()
	return c, nil
}

func setTransactionVersion(c *kfake.Cluster, gs *gates) error {
	var d net.Dialer
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.Dialer(func(ctx context.Context, network, host string) (net.Conn, error) {
		return d.DialContext(ctx, network, gs.privateAddr(host))
	}))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := kmsg.NewPtrUpdateFeaturesRequest()
	req.TimeoutMillis = 10_000
	fu := kmsg.NewUpdateFeaturesRequestFeatureUpdate()
	fu.Feature = "transaction.version"
	fu.MaxVersionLevel = TransactionVersion
	fu.AllowDowngrade = true
	fu.UpgradeType = 2 // safe downgrade
	req.FeatureUpdates = append(req.FeatureUpdates, fu)
	resp, err := req.RequestWith(ctx, cl)
	if err == nil {
		err = kerr.ErrorForCode(resp.ErrorCode)
		for _, r := range resp.Results {
			if err == nil {
				err = kerr.ErrorForCode(r.ErrorCode)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("kfake: set transaction.version to %d: %w", TransactionVersion, err)
	}
	return nil
}
