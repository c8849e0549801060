package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	demoSchema = "tidemark_demo"
	demoTable  = "orders"
	// tieGroup rows of the seed share one updated_at: the timestamp-tie trap.
	tieGroup = 500
	// Ids of rows the mutator inserts: app writer and batch writer use
	// separate ranges, so each writer's sequence of operations depends on
	// the seed only, not on how the two interleave.
	appInsertBase   = 1_000_000
	batchInsertBase = 2_000_000
)

var qTable = pgx.Identifier{demoSchema, demoTable}.Sanitize()

// createTable (re)creates the demo schema and table with its (updated_at, id)
// index.
func createTable(ctx context.Context, pool *pgxpool.Pool) error {
	s := pgx.Identifier{demoSchema}.Sanitize()
	_, err := pool.Exec(ctx, `DROP SCHEMA IF EXISTS `+s+` CASCADE;
CREATE SCHEMA `+s+`;
CREATE TABLE `+qTable+` (
  id          bigint PRIMARY KEY,
  updated_at  timestamptz NOT NULL,
  deleted_at  timestamptz NULL,
  customer    text NOT NULL,
  amount      numeric(12,2) NOT NULL,
  status      text NOT NULL,
  items       jsonb NOT NULL,
  tags        text[] NOT NULL
);
CREATE INDEX orders_updated_at_id ON `+qTable+` (updated_at, id);`)
	return err
}

// row is the generated content of one order.
type row struct {
	customer string
	amount   string
	status   string
	items    string
	tags     []string
}

var (
	firstNames = []string{"Ada", "Grace", "Linus", "Barbara", "Ken", "Margaret", "Dennis", "Frances", "Edsger", "Radia", "Søren", "Zoë", "José", "Chloé"}
	lastNames  = []string{"Lovelace", "Hopper", "Torvalds", "Liskov", "Thompson", "Hamilton", "Ritchie", "Allen", "Dijkstra", "Perlman", "Kierkegaard", "Müller"}
	statuses   = []string{"new", "paid", "packed", "shipped", "delivered", "returned"}
	skus       = []string{"mug", "tee", "sticker", "hoodie", "cap", "poster", "socks", "notebook"}
	tagPool    = []string{"gift", "express", "eu", "us", "b2b", "vip", "promo", "fragile"}
)

func genRow(r *rand.Rand) row {
	var items strings.Builder
	items.WriteByte('[')
	n := 1 + r.IntN(3)
	for i := range n {
		if i > 0 {
			items.WriteByte(',')
		}
		fmt.Fprintf(&items, `{"sku":%q,"qty":%d,"price":"%d.%02d"}`, skus[r.IntN(len(skus))], 1+r.IntN(4), 1+r.IntN(90), r.IntN(100))
	}
	items.WriteByte(']')
	tags := make([]string, r.IntN(3))
	for i := range tags {
		tags[i] = tagPool[r.IntN(len(tagPool))]
	}
	return row{
		customer: firstNames[r.IntN(len(firstNames))] + " " + lastNames[r.IntN(len(lastNames))],
		amount:   fmt.Sprintf("%d.%02d", r.IntN(5000), r.IntN(100)),
		status:   statuses[r.IntN(len(statuses))],
		items:    items.String(),
		tags:     tags,
	}
}

// seed inserts n rows in groups of tieGroup that share one updated_at, all
// before base. The content depends on the seed only.
func seed(ctx context.Context, pool *pgxpool.Pool, n int, seedVal uint64, base time.Time) error {
	r := rand.New(rand.NewPCG(seedVal, 1))
	groups := (n + tieGroup - 1) / tieGroup
	rows := make([][]any, 0, n)
	for i := range n {
		g := i / tieGroup
		ts := base.Add(-time.Duration(groups-g) * time.Second)
		x := genRow(r)
		rows = append(rows, []any{int64(i + 1), ts, x.customer, x.amount, x.status, x.items, x.tags})
	}
	_, err := pool.CopyFrom(ctx, pgx.Identifier{demoSchema, demoTable},
		[]string{"id", "updated_at", "customer", "amount", "status", "items", "tags"}, pgx.CopyFromRows(rows))
	if err != nil {
		return err
	}
	_, err = pool.Exec(ctx, "ANALYZE "+qTable)
	return err
}

// stats counts what the mutator did.
type stats struct {
	inserts, updates, softDeletes, undeletes atomic.Int64
	batchTxns, batchRows, skipped, errors    atomic.Int64
}

func (s *stats) total() int64 {
	return s.inserts.Load() + s.updates.Load() + s.softDeletes.Load() + s.undeletes.Load() + s.batchRows.Load()
}

// mutator runs two writers for d, each with its own RNG derived from the
// seed:
//   - the app writer: single-row autocommit statements (inserts, updates with
//     clock_timestamp(), soft deletes and undeletes), about appRate per
//     second; it skips rows another transaction has locked, so it never
//     waits on the batch writer;
//   - the batch writer: transactions that update or insert 100..500 rows with
//     one shared now() and then keep working 50..600 ms before they commit,
//     so they commit with a timestamp older than rows the app writer has
//     committed in the meantime (the late-commit trap).
func mutator(ctx context.Context, pool *pgxpool.Pool, seedVal uint64, d time.Duration, seedRows int, st *stats) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var wg sync.WaitGroup
	var appErr, batchErr error
	wg.Add(2)
	go func() { defer wg.Done(); appErr = appWriter(ctx, pool, seedVal, seedRows, st) }()
	go func() { defer wg.Done(); batchErr = batchWriter(ctx, pool, seedVal, seedRows, st) }()
	wg.Wait()
	return errors.Join(appErr, batchErr)
}

const appRate = 600 // single-row statements per second

func appWriter(ctx context.Context, pool *pgxpool.Pool, seedVal uint64, seedRows int, st *stats) error {
	r := rand.New(rand.NewPCG(seedVal, 2))
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	nextID := int64(appInsertBase)
	pick := func() int64 {
		// Mostly seeded rows, sometimes one the app inserted itself.
		if nextID > appInsertBase && r.IntN(4) == 0 {
			return appInsertBase + 1 + r.Int64N(nextID-appInsertBase)
		}
		return 1 + r.Int64N(int64(seedRows))
	}
	// Lock with SKIP LOCKED: a row the batch writer holds is left alone.
	const lockOne = `(SELECT id FROM ` + demoSchema + `.` + demoTable + ` WHERE id = $1 FOR UPDATE SKIP LOCKED)`
	tick := time.NewTicker(time.Second / 100)
	defer tick.Stop()
	perTick := appRate / 100
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
		for range perTick {
			var (
				tag   pgconn.CommandTag
				err   error
				count *atomic.Int64
			)
			x := genRow(r)
			switch p := r.IntN(100); {
			case p < 30:
				nextID++
				tag, err = conn.Exec(ctx, `INSERT INTO `+qTable+` (id, updated_at, customer, amount, status, items, tags)
VALUES ($1, clock_timestamp(), $2, $3, $4, $5, $6)`, nextID, x.customer, x.amount, x.status, x.items, x.tags)
				count = &st.inserts
			case p < 85:
				tag, err = conn.Exec(ctx, `UPDATE `+qTable+` SET updated_at = clock_timestamp(), amount = $2, status = $3, items = $4
WHERE id = `+lockOne, pick(), x.amount, x.status, x.items)
				count = &st.updates
			case p < 95:
				tag, err = conn.Exec(ctx, `UPDATE `+qTable+` SET deleted_at = now(), updated_at = now()
WHERE deleted_at IS NULL AND id = `+lockOne, pick())
				count = &st.softDeletes
			default:
				tag, err = conn.Exec(ctx, `UPDATE `+qTable+` SET deleted_at = NULL, updated_at = clock_timestamp(), status = 'restored'
WHERE deleted_at IS NOT NULL AND id = `+lockOne, pick())
				count = &st.undeletes
			}
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				st.errors.Add(1)
				return fmt.Errorf("app writer: %w", err)
			}
			if tag.RowsAffected() == 0 {
				st.skipped.Add(1)
			} else {
				count.Add(tag.RowsAffected())
			}
		}
	}
}

func batchWriter(ctx context.Context, pool *pgxpool.Pool, seedVal uint64, seedRows int, st *stats) error {
	r := rand.New(rand.NewPCG(seedVal, 3))
	nextID := int64(batchInsertBase)
	for {
		pause := time.Duration(100+r.IntN(400)) * time.Millisecond
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		n := 100 + r.IntN(401)
		hold := time.Duration(50+r.IntN(551)) * time.Millisecond
		insert := r.IntN(3) == 0
		x := genRow(r)
		ids := make([]int64, n)
		if insert {
			for i := range ids {
				nextID++
				ids[i] = nextID
			}
		} else {
			start := 1 + r.Int64N(int64(seedRows-n))
			for i := range ids {
				ids[i] = start + int64(i)
			}
		}
		// The batch runs to completion even when the mutator's time is up,
		// so that its count is exact; it is bounded by its own timeout.
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		var affected int64
		err := pgx.BeginFunc(bctx, pool, func(tx pgx.Tx) error {
			var tag pgconn.CommandTag
			var err error
			if insert {
				tag, err = tx.Exec(bctx, `INSERT INTO `+qTable+` (id, updated_at, customer, amount, status, items, tags)
SELECT i, now(), $2, $3, 'imported', $4, $5 FROM unnest($1::bigint[]) AS i`, ids, x.customer, x.amount, x.items, x.tags)
			} else {
				tag, err = tx.Exec(bctx, `UPDATE `+qTable+` SET updated_at = now(), status = 'repriced', amount = amount + 1
WHERE id = ANY($1)`, ids)
			}
			if err != nil {
				return err
			}
			// Keep the transaction open: its rows carry now(), the
			// transaction's start, but become visible only at commit.
			if _, err := tx.Exec(bctx, `SELECT pg_sleep($1)`, hold.Seconds()); err != nil {
				return err
			}
			affected = tag.RowsAffected()
			return nil
		})
		cancel()
		if err != nil {
			st.errors.Add(1)
			return fmt.Errorf("batch writer: %w", err)
		}
		st.batchTxns.Add(1)
		st.batchRows.Add(affected)
	}
}
