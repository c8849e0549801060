package producer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/producer"
)

// TestRefusedLoginMidRunIsTransient: a SASL login the broker refuses once
// the session runs (the user's password changed before the client's
// password file was) does not fail the transaction with
// connector.ErrPermanent, whether the broker closes the connection (kfake)
// or answers SASL_AUTHENTICATION_FAILED (Apache Kafka): the engine retries
// (bounding every commit), and once the client's password matches again,
// Recover and the next transaction succeed. (At start, New fails on the
// refusal: exit 2.)
func TestRefusedLoginMidRunIsTransient(t *testing.T) {
	for _, answered := range []bool{false, true} {
		t.Run(map[bool]string{false: "connection closed", true: "answered"}[answered], func(t *testing.T) {
			c, admin := saslCluster(t, "first-pw")
			ctx := context.Background()
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
			var refusing atomic.Bool
			if answered {
				// The broker answers the refusal, as Apache Kafka does.
				refuseLogins(c, &refusing)
				refusing.Store(true)
			} else {
				res, err := kadm.NewClient(admin).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: "tm", Mechanism: kadm.ScramSha256, Iterations: 4096, Password: "second-pw"}})
				if err == nil {
					err = res.Error()
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(500 * time.Millisecond) // the idle connections close; the next ones log in again
			err = txn(2 * time.Second)
			if err == nil {
				t.Fatal("a transaction succeeded while the broker refused the client's login")
			}
			if errors.Is(err, connector.ErrPermanent) || errors.Is(err, connector.ErrFenced) {
				t.Fatalf("a login refused mid-run: %v; want a transient failure", err)
			}
			t.Logf("refused mid-run: %v", err)
			if answered {
				refusing.Store(false)
			} else {
				pw.Store("second-pw") // the file caught up
			}
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := w.Recover(rctx); err != nil {
				t.Fatalf("Recover after the login was accepted again: %v", err)
			}
			if err := txn(10 * time.Second); err != nil {
				t.Fatalf("a transaction after the login was accepted again: %v", err)
			}
		})
	}
}

// TestRefusedLoginAtTheEndOfATransactionStopsTheSession: the records of
// the transaction are written, then the broker starts refusing logins
// (Apache Kafka answers SASL_AUTHENTICATION_FAILED) and the idle
// connections close, so the commit's EndTxn needs a new connection. kgo
// does not retry a refused login there, as it does for produce requests,
// and keeps the error for the session for good: retrying in the process
// would never end. The commit fails with connector.ErrPermanent (the run
// stops with exit 2, a task starts again), and a new session, as a
// restart opens, commits once logins are accepted again.
func TestRefusedLoginAtTheEndOfATransactionStopsTheSession(t *testing.T) {
	c, _ := saslCluster(t, "tm-pw")
	ctx := context.Background()
	cfg := producer.Config{Name: "c", Topic: "data", OffsetsTopic: "off", Opts: []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConnIdleTimeout(100 * time.Millisecond), kgo.SASL(scram.Auth{User: "tm", Pass: "tm-pw"}.AsSha256Mechanism())}}
	w, err := producer.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	var refusing atomic.Bool
	refuseLogins(c, &refusing)
	tctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	txn := func(w *producer.Writer, between func()) error {
		if err := w.Begin(tctx); err != nil {
			return err
		}
		if err := w.Publish(tctx, &connector.Row{ID: "k", UpdatedAt: time.Unix(0, 0), Value: []byte(`{}`)}); err != nil {
			return err
		}
		if err := w.Client().Flush(tctx); err != nil { // the records are written
			return err
		}
		between()
		return w.Commit(tctx, &connector.Commit{})
	}
	err = txn(w, func() {
		refusing.Store(true)
		time.Sleep(500 * time.Millisecond) // the idle connections close
	})
	if !errors.Is(err, connector.ErrPermanent) || !errors.Is(err, kerr.SaslAuthenticationFailed) {
		t.Fatalf("a login refused at the end of a transaction: %v; want ErrPermanent (the session cannot go on)", err)
	}
	refusing.Store(false)
	w2, err := producer.New(ctx, cfg)
	if err != nil {
		t.Fatalf("a new session once logins are accepted again: %v", err)
	}
	t.Cleanup(w2.Close)
	if err := txn(w2, func() {}); err != nil {
		t.Fatalf("a transaction of the new session: %v", err)
	}
}

// saslCluster is a kfake cluster with SASL (SCRAM-SHA-256): a superuser
// admin, whose client it returns, and the user tm with password pw; the
// topics data and off exist.
func saslCluster(t *testing.T, pw string) (*kfake.Cluster, *kgo.Client) {
	t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(),
		kfake.Superuser("SCRAM-SHA-256", "admin", "admin-pw"), kfake.User("SCRAM-SHA-256", "tm", pw))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	admin, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.SASL(scram.Auth{User: "admin", Pass: "admin-pw"}.AsSha256Mechanism()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	if _, err := producer.EnsureTopics(context.Background(), admin, producer.Topics{Data: "data", Partitions: 1, ReplicationFactor: -1, Offsets: "off"}); err != nil {
		t.Fatal(err)
	}
	return c, admin
}

// refuseLogins makes c answer every SASLAuthenticate with
// SASL_AUTHENTICATION_FAILED, as Apache Kafka answers a wrong password,
// while refusing is set.
func refuseLogins(c *kfake.Cluster, refusing *atomic.Bool) {
	c.ControlKey(int16(kmsg.SASLAuthenticate), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		if !refusing.Load() {
			return nil, nil, false
		}
		c.KeepControl()
		resp := kreq.(*kmsg.SASLAuthenticateRequest).ResponseKind().(*kmsg.SASLAuthenticateResponse)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		resp.ErrorMessage = kmsg.StringPtr("Authentication failed during authentication due to invalid credentials with SASL mechanism SCRAM-SHA-256")
		return resp, nil, true
	})
}
