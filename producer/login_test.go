package producer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
)

// TestRefusedLoginMidRunIsTransient: a SASL login the broker refuses once
// the session runs (the user's password changed before the client's
// password file was) does not fail the transaction with
// connector.ErrPermanent: the client keeps trying to connect, so the commit
// waits until its context ends (the engine bounds every commit), and the
// engine retries. Once the client's password matches again, Recover and the
// next transaction succeed. (At start, New fails on the refusal: exit 2.)
func TestRefusedLoginMidRunIsTransient(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw"), kfake.User("SCRAM-SHA-256", "tm", "first-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	ctx := context.Background()
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(scram.Auth{User: "admin", Pass: "admin-pw"}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := producer.EnsureTopics(ctx, admin, producer.Topics{Data: "data", Partitions: 1, ReplicationFactor: -1, Offsets: "off"}); err != nil {
		t.Fatal(err)
	}
	var pw atomic.Value
	pw.Store("first-pw")
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConnIdleTimeout(100 * time.Millisecond),
		kgo.SASL(scram.Sha256(func(context.Context) (scram.Auth, error) {
			return scram.Auth{User: "tm", Pass: pw.Load().(string)}, nil
		}))}
	w, err := producer.New(ctx, producer.Config{Name: "c", Topic: "data", OffsetsTopic: "off", Opts: opts})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	txn := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		if err := w.Begin(ctx); err != nil {
			return err
		}
		if err := w.Publish(ctx, &connector.Row{ID: "k", UpdatedAt: time.Unix(0, 0), Value: []byte(`{}`)}); err != nil {
			return err
		}
		return w.Commit(ctx, &connector.Commit{})
	}
	if err := txn(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	res, err := kadm.NewClient(admin).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "tm", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "second-pw"}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the idle connections close; the next ones log in again
	err = txn(2 * time.Second)
	if err == nil {
		t.Fatal("a transaction succeeded while the broker refused the client's password")
	}
	if errors.Is(err, connector.ErrPermanent) || errors.Is(err, connector.ErrFenced) {
		t.Fatalf("a login refused mid-run: %v; want a transient failure", err)
	}
	pw.Store("second-pw") // the file caught up
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := w.Recover(rctx); err != nil {
		t.Fatalf("Recover after the password matched again: %v", err)
	}
	if err := txn(10 * time.Second); err != nil {
		t.Fatalf("a transaction after the password matched again: %v", err)
	}
}
