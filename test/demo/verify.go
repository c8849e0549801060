package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/internal/kfakebroker"
)

// truth reads the table through tidemark's own PostgreSQL source, under one
// REPEATABLE READ snapshot, from scratch: live ids and their values in
// tidemark's encoding, which is what the topic must hold.
func truth(ctx context.Context, dsn string) (live map[string][]byte, deleted int, err error) {
	src, err := postgres.New(ctx, postgres.Config{
		DSN: dsn, Schema: demoSchema, Table: demoTable, DeletedAtColumn: "deleted_at",
	})
	if err != nil {
		return nil, 0, err
	}
	defer src.Close()
	snap, err := src.Snapshot(ctx)
	if err != nil {
		return nil, 0, err
	}
	defer snap.Close(context.WithoutCancel(ctx))
	live = map[string][]byte{}
	cursor := ""
	for {
		p, err := snap.Page(ctx, connector.PageRequest{Cursor: cursor, Limit: 5000})
		if err != nil {
			return nil, 0, err
		}
		for _, r := range p.Rows {
			if _, dup := live[r.ID]; dup {
				return nil, 0, fmt.Errorf("id %s read twice in one snapshot walk", r.ID)
			}
			if r.Deleted {
				deleted++
			} else {
				live[r.ID] = r.Value
			}
		}
		if p.End {
			return live, deleted, nil
		}
		cursor = p.Next
	}
}

// foldTopic opens the embedded broker's persisted data (tidemark has
// exited, so nobody else serves it), folds topic read_committed with
// fold.Map, and counts duplicate publications: records whose key, value and
// updated_at header were all published before (a tombstone is republished,
// legitimately, when a soft-deleted row changes again).
func foldTopic(ctx context.Context, dataDir, topic string) (*fold.State, int64, error) {
	dir := filepath.Join(dataDir, "kafka")
	lock, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, 0, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return nil, 0, fmt.Errorf("the embedded broker in %s is still held by a tidemark process: %w", dir, err)
	}
	c, err := kfakebroker.New(nil,
		kfake.NumBrokers(1),
		kfake.DataDir(filepath.Join(dir, "data")),
		kfake.ClusterID("tidemark-embedded"),
	)
	if err != nil {
		return nil, 0, fmt.Errorf("open the persisted broker in %s: %w", dir, err)
	}
	defer c.Close()
	opts := []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...)}
	st, err := fold.Map(ctx, opts, topic)
	if err != nil {
		return nil, 0, err
	}
	seen := map[string]struct{}{}
	var dups int64
	err = fold.Scan(ctx, opts, topic, func(r *kgo.Record) error {
		ua := ""
		for _, h := range r.Headers {
			if h.Key == "updated_at" {
				ua = string(h.Value)
			}
		}
		k := string(r.Key) + "\x00" + ua + "\x00" + string(r.Value)
		if r.Value == nil {
			k += "\x00tombstone"
		}
		if _, ok := seen[k]; ok {
			dups++
		} else {
			seen[k] = struct{}{}
		}
		return nil
	})
	return st, dups, err
}

// diff is a comparison of a replica with the table.
type diff struct {
	source, replica          int
	missing, stale, extra    int
	dups                     int64
	missingIDs, staleIDs     []string
	extraIDs                 []string
	records, tombstones, raw int64
}

func (d diff) ok() bool { return d.missing == 0 && d.stale == 0 && d.extra == 0 }

func compare(src, replica map[string][]byte) diff {
	d := diff{source: len(src), replica: len(replica)}
	for id, v := range src {
		rv, ok := replica[id]
		switch {
		case !ok:
			d.missing++
			d.missingIDs = append(d.missingIDs, id)
		case !bytes.Equal(v, rv):
			d.stale++
			d.staleIDs = append(d.staleIDs, id)
		}
	}
	for id := range replica {
		if _, ok := src[id]; !ok {
			d.extra++
			d.extraIDs = append(d.extraIDs, id)
		}
	}
	for _, s := range [][]string{d.missingIDs, d.staleIDs, d.extraIDs} {
		sort.Slice(s, func(i, j int) bool { return numLess(s[i], s[j]) })
	}
	return d
}

func numLess(a, b string) bool {
	x, e1 := strconv.ParseInt(a, 10, 64)
	y, e2 := strconv.ParseInt(b, 10, 64)
	if e1 != nil || e2 != nil {
		return a < b
	}
	return x < y
}

// verifyTidemark compares the folded topic with the table.
func verifyTidemark(ctx context.Context, dsn, dataDir string) (diff, error) {
	src, _, err := truth(ctx, dsn)
	if err != nil {
		return diff{}, fmt.Errorf("read the table: %w", err)
	}
	st, dups, err := foldTopic(ctx, dataDir, demoTable)
	if err != nil {
		if errors.Is(err, fold.ErrNoTopic) {
			return diff{}, fmt.Errorf("the data topic %q does not exist: %w", demoTable, err)
		}
		return diff{}, fmt.Errorf("fold the topic: %w", err)
	}
	replica := make(map[string][]byte, len(st.Live))
	for k, e := range st.Live {
		replica[k] = e.Value
	}
	d := compare(src, replica)
	d.dups = dups
	d.records, d.tombstones = int64(st.Records), int64(st.Tombstones)
	return d, nil
}

// verifyNaive compares a naive reader's fold with the table read the same
// way (to_jsonb of each live row).
func verifyNaive(ctx context.Context, pool *pgxpool.Pool, n *naiveReader) (diff, error) {
	rows, err := pool.Query(ctx, `SELECT id::text, to_jsonb(t)::text FROM `+qTable+` t WHERE deleted_at IS NULL`)
	if err != nil {
		return diff{}, err
	}
	src := map[string][]byte{}
	for rows.Next() {
		var id, v string
		if err := rows.Scan(&id, &v); err != nil {
			rows.Close()
			return diff{}, err
		}
		src[id] = []byte(v)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return diff{}, err
	}
	replica := make(map[string][]byte, len(n.state))
	for id, v := range n.state {
		replica[strconv.FormatInt(id, 10)] = []byte(v)
	}
	d := compare(src, replica)
	d.dups = n.dups
	d.raw = n.reads.Load()
	return d, nil
}
