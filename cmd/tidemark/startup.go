package main

import (
	"context"
	"errors"
	"fmt"
	"time"

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
		if permanentStartup(err) || ctx.Err() != nil {
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
			return ctx.Err()
		case <-t.C:
		}
	}
}

// permanentStartup reports whether a start-up failure cannot be fixed by
// waiting.
func permanentStartup(err error) bool {
	var cfgErr *ConfigError
	return errors.As(err, &cfgErr) || errors.Is(err, postgres.ErrBadConfig) || errors.Is(err, errUsage) ||
		connector.Fatal(err)
}
