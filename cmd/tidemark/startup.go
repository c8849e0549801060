package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
)

// startup runs one start-up step (connect to the source, preflight, the
// topics, the producer session), retrying transient failures the way the
// engine retries them once running: capped, jittered backoff, for up to
// the retry timeout (sync.retry_timeout for `run`, sync.once_retry_timeout
// otherwise; 0 = no limit), logging each attempt and what it waits for, and
// reporting each to the metrics (so /readyz says 503 while it waits).
// Permanent failures (bad configuration or credentials, a missing table, a
// topic that cannot be used) return at once with their exit codes.
func (a *cli) startup(ctx context.Context, what, reason string, fn func() error) error {
	timeout := a.cfg.Sync.RetryTimeout.Duration
	if a.once || !a.serve {
		timeout = a.cfg.Sync.OnceRetryTimeout.Duration
	}
	began := time.Now()
	for attempt := 1; ; attempt++ {
		err := fn()
		if err != nil {
			// A login or an ACL the broker refuses is a ConfigError: no
			// amount of waiting fixes it (security.go).
			err = a.explainKafkaAccess(err)
		}
		if err == nil {
			if attempt > 1 {
				a.log.Info("start-up: "+what+" answers again", "after", time.Since(began).Round(time.Millisecond), "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return &stoppedAtStartup{what}
		}
		if permanentStartup(err) {
			return err
		}
		if a.obs != nil {
			if o := a.obs.observer(); o != nil {
				o.ObserveRetry(reason)
			}
		}
		delay := connector.Backoff(attempt)
		waited := time.Since(began)
		if timeout > 0 && waited+delay > timeout {
			return fmt.Errorf("start-up: %s did not answer within %s (%d attempts): %w", what, timeout, attempt, err)
		}
		a.log.Warn("start-up: waiting for "+what, "err", err, "attempt", attempt,
			"waiting_for", waited.Round(time.Millisecond), "retry_in", delay.Round(time.Millisecond))
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return &stoppedAtStartup{what}
		case <-t.C:
		}
	}
}

// stoppedAtStartup is a signal that ended startup's wait. For `run` it is
// a clean shutdown (exit 0): nothing was written.
type stoppedAtStartup struct{ what string }

func (e *stoppedAtStartup) Error() string {
	return "stopped by a signal while waiting for " + e.what + " at start-up; nothing was written"
}

// permanentStartup reports whether a start-up failure cannot be fixed by
// waiting.
func permanentStartup(err error) bool {
	var cfgErr *ConfigError
	var wf *waitCannotFix
	return errors.As(err, &cfgErr) || errors.Is(err, postgres.ErrBadConfig) || errors.Is(err, errUsage) ||
		connector.Fatal(err) || errors.As(err, &wf)
}

// waitCannotFix marks a start-up failure that waiting cannot fix, for a
// step whose errors are not classified otherwise; its message and exit code
// are err's.
type waitCannotFix struct{ err error }

func (e *waitCannotFix) Error() string { return e.err.Error() }
func (e *waitCannotFix) Unwrap() error { return e.err }

// waitOnlyForConnect lets startup wait only when a PostgreSQL connection
// could not be made (the server down or starting); any other failure of
// the step (a missing table, a statement that failed) returns at once.
func waitOnlyForConnect(err error) error {
	var ce *pgconn.ConnectError
	if err == nil || errors.As(err, &ce) {
		return err
	}
	return &waitCannotFix{err}
}

// waitForKafka waits at start-up, as startup does, until a broker answers
// (a metadata request), for the commands that read or write the topics
// without going through the engine (status, ledger, verify, reset,
// replica): one started while Kafka is down waits for it like `run --once`.
func (a *cli) waitForKafka(ctx context.Context, opts []kgo.Opt) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	return a.startup(ctx, "Kafka", "kafka", func() error { return cl.Ping(ctx) })
}
