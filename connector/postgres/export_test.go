package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TimesQuery is the statement of the preflight's timestamp check
// (checkTimes) for cfg's table, for tests that look at its plan.
func TimesQuery(ctx context.Context, pool *pgxpool.Pool, cfg Config) (string, error) {
	t, rep, err := inspect(ctx, pool, cfg.withDefaults())
	if err == nil {
		err = rep.Err()
	}
	if err != nil {
		return "", err
	}
	return timesQuery(cfg, t), nil
}

// SetSessionWait sets how long SnapshotSessions waits for each session
// after its first, and returns a func that restores it.
func SetSessionWait(d time.Duration) (restore func()) {
	old := sessionWait
	sessionWait = d
	return func() { sessionWait = old }
}

// SetMaxViewAge sets how long a pass reads in one snapshot, and returns a
// func that restores it.
func SetMaxViewAge(d time.Duration) (restore func()) {
	old := maxViewAge
	maxViewAge = d
	return func() { maxViewAge = old }
}
