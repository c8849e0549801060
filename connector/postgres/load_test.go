package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// loadAll reads every range of a split to its end, checks the page
// invariants of LoadPage (pages in id order within a range, never above
// the limit, End only on an empty page, Last exactly on a page with rows
// but fewer than the limit, which ends the range) and returns the ids each
// range read, in order.
func loadAll(t *testing.T, rl connector.RangeLoader, ranges []connector.KeyRange, limit int) [][]string {
	t.Helper()
	out := make([][]string, len(ranges))
	for i, r := range ranges {
		req := connector.LoadRequest{Range: r, Limit: limit}
		for n := 0; ; n++ {
			if n > 10000 {
				t.Fatalf("range %v did not end", r)
			}
			p, err := rl.LoadPage(context.Background(), req)
			if err != nil {
				t.Fatalf("range %v after %q: %v", r, req.Cursor, err)
			}
			if len(p.Rows) > limit || p.End != (len(p.Rows) == 0) || p.Last != (len(p.Rows) > 0 && len(p.Rows) < limit) {
				t.Fatalf("range %v: page of %d rows (limit %d), end %v, last %v", r, len(p.Rows), limit, p.End, p.Last)
			}
			if p.End {
				break
			}
			if p.Next == "" || p.Next == req.Cursor {
				t.Fatalf("range %v: next cursor %q does not advance from %q", r, p.Next, req.Cursor)
			}
			for _, row := range p.Rows {
				out[i] = append(out[i], row.ID)
			}
			if p.Last {
				break
			}
			req.Cursor = p.Next
		}
	}
	return out
}

// Every id type, in every collation the page tests use: a split into key
// ranges followed by a load of each range reads every row exactly once,
// each range in the database's own id order, and the ranges follow each
// other in that order. The empty text id is read once and cannot end a
// range.
func TestLoadSplitsAndReadsEveryIDType(t *testing.T) {
	db := harness.NewDB(t)
	cases := []struct {
		name, typ string
		gen       string // SQL expression over g (1..n) giving the id
	}{
		{"bigint", "bigint", "(g * 7919) % 100003 - 50000"},
		{"integer", "integer", "g * 3"},
		{"smallint", "smallint", "g - 500"},
		{"text_c", `text COLLATE "C"`, "CASE WHEN g = 1 THEN '' ELSE chr(65 + g % 50) || g::text END"},
		{"text_icu", `text COLLATE "und-x-icu"`, "CASE WHEN g = 1 THEN '' ELSE chr(65 + g % 50) || g::text END"},
		{"uuid", "uuid", "md5(g::text)::uuid"},
	}
	const rows = 3000
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			db.Exec(t, fmt.Sprintf("CREATE TABLE %s (id %s PRIMARY KEY, updated_at timestamptz NOT NULL, v text)", c.name, c.typ))
			db.Exec(t, fmt.Sprintf("INSERT INTO %s SELECT %s, now() - random() * interval '1 day', repeat('x', 200) FROM generate_series(1, %d) g", c.name, c.gen, rows))
			db.Exec(t, "ANALYZE "+c.name)
			var want []string
			r, err := db.Pool.Query(context.Background(), fmt.Sprintf("SELECT id::text AS s FROM %s ORDER BY id", c.name))
			if err != nil {
				t.Fatal(err)
			}
			for r.Next() {
				var s string
				if err := r.Scan(&s); err != nil {
					t.Fatal(err)
				}
				want = append(want, s)
			}
			src := open(t, config(db, c.name))
			for _, n := range []int{1, 4, 16} {
				ranges, err := src.SplitKeys(context.Background(), n)
				if err != nil {
					t.Fatal(err)
				}
				if len(ranges) < 1 || len(ranges) > n || ranges[0].Lo != "" || ranges[len(ranges)-1].Hi != "" {
					t.Fatalf("split into %d: %v", n, ranges)
				}
				if n == 16 && len(ranges) < 8 {
					t.Errorf("split into 16 gave only %d ranges of %d rows", len(ranges), rows)
				}
				for i := 1; i < len(ranges); i++ {
					if ranges[i].Lo != ranges[i-1].Hi || ranges[i].Lo == "" {
						t.Fatalf("ranges %d and %d do not meet: %v", i-1, i, ranges)
					}
				}
				var got []string
				for _, ids := range loadAll(t, src, ranges, 97) {
					got = append(got, ids...)
				}
				if !slices.Equal(got, want) {
					for i := range min(len(got), len(want)) {
						if got[i] != want[i] {
							t.Logf("first difference at %d: read %q, want %q", i, got[i], want[i])
							break
						}
					}
					t.Errorf("split into %d ranges %v: read %d ids, want the %d in database order", n, ranges, len(got), len(want))
				}
			}
		})
	}
}

// The load honours the filter and reports soft deletes; a cursor that is
// not a load cursor is refused, naming it.
func TestLoadFilterDeletesAndBadCursor(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, deleted_at timestamptz, region text)`)
	db.Exec(t, `INSERT INTO items SELECT g, now(), CASE WHEN g % 10 = 0 THEN now() END, CASE WHEN g % 2 = 0 THEN 'eu' ELSE 'us' END FROM generate_series(1, 500) g`)
	cfg := config(db, "items")
	cfg.Filter, cfg.DeletedAtColumn = "region = 'eu'", "deleted_at"
	src := open(t, cfg)
	ranges, err := src.SplitKeys(context.Background(), 4)
	if err != nil {
		t.Fatal(err)
	}
	n, deleted := 0, 0
	for _, ids := range loadAll(t, src, ranges, 50) {
		n += len(ids)
	}
	p, err := src.LoadPage(context.Background(), connector.LoadRequest{Range: connector.KeyRange{Hi: "20"}, Limit: 100})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range p.Rows {
		if r.Deleted {
			deleted++
			if r.Value != nil {
				t.Errorf("deleted row %s carries a value", r.ID)
			}
		}
	}
	if n != 250 || len(p.Rows) != 10 || deleted != 2 {
		t.Errorf("read %d rows (want the 250 in eu), first 20 ids: %d rows (want 10), %d deleted (want 2)", n, len(p.Rows), deleted)
	}
	_, err = src.LoadPage(context.Background(), connector.LoadRequest{Cursor: "v1:123:4", Limit: 10})
	if err == nil || !strings.Contains(err.Error(), "not a PostgreSQL-source load cursor") {
		t.Errorf("a pass cursor as a load cursor: %v", err)
	}
	// A checkpoint's cursor or range that does not fit the id column (its
	// type changed while the load was open, or the checkpoint is damaged)
	// cannot be fixed by a retry: a safety stop (exit 3) each time.
	for _, req := range []connector.LoadRequest{
		{Cursor: "v1:123:4", Limit: 10},
		{Cursor: "i:abc", Limit: 10},
		{Range: connector.KeyRange{Lo: "x", Hi: "20"}, Limit: 10},
		{Range: connector.KeyRange{Hi: "1.5"}, Limit: 10},
	} {
		_, err := src.LoadPage(context.Background(), req)
		if stop := (*connector.StopError)(nil); !errors.As(err, &stop) {
			t.Errorf("load request %+v: %v (%T) is not a safety stop", req, err, err)
		}
	}
}

// Four sessions of one snapshot see the same rows: rows written after the
// view was taken are in none of them, and reading the ranges side by side
// on the sessions gives exactly the table as it was. The pool holds the
// sessions and still answers other queries.
func TestSnapshotSessionsShareOneView(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)`)
	db.Exec(t, `INSERT INTO items SELECT g, now(), 'before' FROM generate_series(1, 4000) g`)
	db.Exec(t, "ANALYZE items")
	cfg := config(db, "items")
	cfg.LoadWorkers = 4
	src := open(t, cfg)
	ctx := context.Background()
	snap, err := src.SnapshotSessions(ctx, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close(ctx)
	db.Exec(t, `UPDATE items SET v = 'after', updated_at = now() WHERE id % 3 = 0`)
	db.Exec(t, `INSERT INTO items SELECT g, now(), 'after' FROM generate_series(4001, 4100) g`)
	db.Exec(t, `DELETE FROM items WHERE id <= 100`)
	if _, err := src.Now(ctx); err != nil {
		t.Fatalf("the pool has no connection left besides the snapshot's four: %v", err)
	}
	rl := snap.(connector.RangeLoader)
	ranges, err := rl.SplitKeys(ctx, 8)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		seen = map[string]int{}
		bad  []string
		wg   sync.WaitGroup
		errs = make(chan error, len(ranges))
	)
	for _, r := range ranges {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := connector.LoadRequest{Range: r, Limit: 113}
			for {
				p, err := rl.LoadPage(ctx, req)
				if err != nil {
					errs <- err
					return
				}
				if p.End {
					return
				}
				mu.Lock()
				for _, row := range p.Rows {
					seen[row.ID]++
					if !strings.Contains(string(row.Value), `"before"`) {
						bad = append(bad, row.ID)
					}
				}
				mu.Unlock()
				req.Cursor = p.Next
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != 4000 || len(bad) > 0 {
		t.Errorf("the sessions read %d ids (want the 4000 of the view), %d with a value from after it (e.g. %v)", len(seen), len(bad), bad[:min(len(bad), 3)])
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("id %s read %d times", id, n)
		}
	}
}

// A pool_max_conns in the DSN below what the load holds is refused,
// naming both keys.
func TestLoadWorkersNeedThePool(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	cfg := config(db, "items")
	cfg.DSN += "&pool_max_conns=3"
	cfg.LoadWorkers = 4
	_, err := postgres.New(context.Background(), cfg)
	if err == nil || !strings.Contains(err.Error(), "pool_max_conns") || !strings.Contains(err.Error(), "sync.load_workers") {
		t.Fatalf("got %v", err)
	}
}

// TestSnapshotSessionsDoNotHoldAndWait: tasks that share one pool (one
// DSN with pool_max_conns) each take the sessions of a consistent load's
// snapshot one at a time. Two of them that both hold some and wait for
// more wait for ever. A snapshot that cannot get its next session within
// the wait gives back the ones it holds and fails (the engine retries
// the pass), naming the pool; it got all of them once the others were
// free.
func TestSnapshotSessionsDoNotHoldAndWait(t *testing.T) {
	defer postgres.SetSessionWait(300 * time.Millisecond)()
	ctx := context.Background()
	// Another task's snapshot, part way: three of the five sessions.
	pool, src, held := sharedPool(t, 3, nil)
	done := make(chan error, 1)
	go func() {
		snap, err := src.SnapshotSessions(ctx, 3)
		if err == nil {
			snap.Close(ctx)
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "pool_max_conns") {
			t.Errorf("three sessions from a pool with two free: %v; want an error naming pool_max_conns", err)
		}
	case <-time.After(10 * time.Second):
		for _, c := range held {
			c.Release()
		}
		<-done
		t.Fatal("SnapshotSessions still waited, holding the sessions it took, 10s on (until the other task's were given back)")
	}
	if n := pool.Stat().AcquiredConns(); n != 3 {
		t.Errorf("%d connections acquired after the failed snapshot, want the other task's 3 (it gave its own back)", n)
	}
	for _, c := range held {
		c.Release()
	}
	snap, err := src.SnapshotSessions(ctx, 3)
	if err != nil {
		t.Fatalf("three sessions from a free pool: %v", err)
	}
	snap.Close(ctx)
}

// A server's idle_in_transaction_session_timeout shorter than the wait for
// a pool connection: the sessions a shared snapshot already holds sit idle
// in their transactions while the next one waits. Each is kept from the
// timeout as soon as it holds the snapshot, so the exporting session
// survives the wait and the last session can still import the snapshot.
func TestSnapshotSessionsOutwaitTheIdleTimeout(t *testing.T) {
	ctx := context.Background()
	// Another task holds three of the five connections, and gives one
	// back 800 ms on: the third session waits that long.
	_, src, held := sharedPool(t, 0, map[string]string{"idle_in_transaction_session_timeout": "200"})
	defer func() {
		for _, c := range held {
			c.Release()
		}
	}()
	first := held[0]
	held = held[1:]
	time.AfterFunc(800*time.Millisecond, first.Release)
	snap, err := src.SnapshotSessions(ctx, 3)
	if err != nil {
		t.Fatalf("a snapshot on three sessions, the third after an 800 ms wait with a 200 ms idle timeout: %v", err)
	}
	defer snap.Close(ctx)
	time.Sleep(400 * time.Millisecond)
	ranges := []connector.KeyRange{{Hi: "33"}, {Lo: "33", Hi: "66"}, {Lo: "66"}}
	var got []string
	for _, ids := range loadAll(t, snap.(connector.RangeLoader), ranges, 50) {
		got = append(got, ids...)
	}
	if len(got) != 100 {
		t.Errorf("read %d rows through the snapshot's sessions, want 100", len(got))
	}
}

// sharedPool is a pool of five connections (with the runtime parameters
// params) shared with another task, which holds three of them (held, for
// the caller to give back), and a source with loadWorkers on it, on a
// table of 100 rows; the pool closes at cleanup.
func sharedPool(t *testing.T, loadWorkers int, params map[string]string) (*pgxpool.Pool, *postgres.Source, []*pgxpool.Conn) {
	t.Helper()
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	db.Exec(t, `INSERT INTO items SELECT g, now() FROM generate_series(1, 100) g`)
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 5
	for k, v := range params {
		pc.ConnConfig.RuntimeParams[k] = v
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	cfg := config(db, "items")
	cfg.LoadWorkers = loadWorkers
	src, err := postgres.NewOnPool(ctx, cfg, pool)
	if err != nil {
		t.Fatal(err)
	}
	var held []*pgxpool.Conn
	for range 3 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	return pool, src, held
}
