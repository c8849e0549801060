package chaos

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/harness"
)

// dbScenario runs the in-process engine continuously under the mutating
// workload while inject hurts the database; inject returns the number of
// faults. Then the workload and the engine stop (the engine must not have
// given up), a fresh engine runs once, and the six counts must be 0.
func dbScenario(t *testing.T, w *world, inject func(ctx context.Context, settle func()) int) {
	t.Helper()
	brokerScenario(t, w, nil, inject)
}

func TestDatabaseFaults(t *testing.T) {
	t.Run("backend terminated mid-page", func(t *testing.T) {
		w := newWorld(t, nil)
		n := 15
		if soak() {
			n = 150
		}
		var midQuery, idle int
		dbScenario(t, w, func(ctx context.Context, settle func()) int {
			for midQuery+idle < n && ctx.Err() == nil {
				// Catch a backend of the connector running a query (a page
				// read) when we can; otherwise cut its idle connections.
				deadline := time.Now().Add(300 * time.Millisecond)
				killed := 0
				for killed == 0 && time.Now().Before(deadline) && ctx.Err() == nil {
					killed = terminate(ctx, t, w, true)
					if killed == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				if killed > 0 {
					midQuery++
				} else if terminate(ctx, t, w, false) > 0 {
					idle++
				}
				settle()
			}
			return midQuery + idle
		})
		t.Logf("backends terminated: %d while running a query, %d idle", midQuery, idle)
		if midQuery == 0 {
			t.Errorf("no backend was terminated while running a query")
		}
	})

	// Many transient failures inside one long pass, each
	// after progress (commits) since the previous one: the engine must keep
	// going, since every retry resumed from a newer checkpoint.
	t.Run("backend terminated repeatedly in one long pass", func(t *testing.T) {
		w := newWorld(t, nil)
		// Rows 10ms apart keep the dedupe set (rows within the 1s margin)
		// and so every checkpoint small.
		const rows = 40000
		w.db.Exec(t, `INSERT INTO items (id, updated_at, v)
			SELECT g, $1::timestamptz + g * interval '10 milliseconds', 'bulk-' || g FROM generate_series(1, $2::int) AS g`,
			time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), rows)
		w.ensureTopics(w.opts)
		w.tune = func(c *connector.Config) { c.TxnMaxRecords = 200 }
		var obs counter
		e := w.engine(nil, &obs)
		done := make(chan error, 1)
		go func() {
			_, err := e.Run(context.Background(), connector.Once)
			done <- err
		}()
		const want = 12
		kills := 0
		var err error
	loop:
		for kills < want {
			from := obs.commits.Load()
			waitUntil(context.Background(), 10*time.Second, func() bool { return obs.commits.Load() >= from+2 })
			select {
			case err = <-done:
				break loop
			default:
			}
			deadline := time.Now().Add(300 * time.Millisecond)
			for n := 0; n == 0 && time.Now().Before(deadline); {
				if n = terminate(context.Background(), t, w, true); n == 0 {
					time.Sleep(time.Millisecond)
				} else {
					kills++
				}
			}
		}
		if kills == want {
			select {
			case err = <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("the engine did not finish the pass")
			}
		}
		if err != nil {
			t.Fatalf("after %d terminations, each following progress, the engine stopped: %v (%s)", kills, err, &obs)
		}
		if kills < want {
			t.Fatalf("the pass ended after %d terminations; the table is too small to prove anything", kills)
		}
		w.check(t.Name())
		t.Logf("%d backends terminated mid-page during one pass , the pass finished; engine: %s", kills, &obs)
	})

	t.Run("PostgreSQL restarted mid-run", func(t *testing.T) {
		p := harness.StartPostgres(t)
		w := newWorld(t, p)
		n := 2
		if soak() {
			n = 10
		}
		dbScenario(t, w, func(ctx context.Context, settle func()) int {
			restarts := 0
			for range n {
				if ctx.Err() != nil {
					break
				}
				restartPG(ctx, t, p, w)
				restarts++
				settle()
			}
			return restarts
		})
	})
}

// restartPG restarts PostgreSQL and waits until it answers again.
//
// harness.Postgres.Restart returns once `pg_ctl restart -w` has seen the
// new server up, so it runs on the test's goroutine: run in a goroutine
// of its own (as when it did not return), a test that ended as soon as the
// server answered could stop the server in its cleanup while pg_ctl still
// waited for it, and pg_ctl then failed the test with "could not start
// server". The pool's view of pg_postmaster_start_time() then says the
// test's own connections reach the new server.
func restartPG(ctx context.Context, t *testing.T, p *harness.Postgres, w *world) {
	t.Helper()
	startedAt := func() (time.Time, error) {
		var at time.Time
		err := w.db.Pool.QueryRow(ctx, `SELECT pg_postmaster_start_time()`).Scan(&at)
		return at, err
	}
	before, err := startedAt()
	if err != nil {
		t.Fatalf("postmaster start time: %v", err)
	}
	p.Restart(t)
	waitFor(t, 60*time.Second, "PostgreSQL to come back after a restart", func() bool {
		at, err := startedAt()
		return err == nil && at.After(before)
	})
}

// terminate ends the connector's backends (only those running a query when
// active) and returns how many it ended.
func terminate(ctx context.Context, t *testing.T, w *world, active bool) int {
	t.Helper()
	q := `SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
		WHERE application_name = $1 AND pid <> pg_backend_pid() AND ($2 = false OR state = 'active')) AS x`
	var n int
	if err := w.db.Pool.QueryRow(ctx, q, w.app, active).Scan(&n); err != nil {
		if ctx.Err() == nil {
			t.Logf("pg_terminate_backend: %v", err)
		}
		return 0
	}
	return n
}
