package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestHorizon: an open transaction on another connection that has written
// (so holds an xid) is the oldest writer until it commits; one that has
// only read is not a writer.
func TestHorizon(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	src := open(t, config(db, "t"))
	ctx := context.Background()

	h, err := src.Horizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !h.OldestWriter.IsZero() {
		t.Fatalf("oldest writer %s with no open transaction", h.OldestWriter)
	}
	if d := time.Since(h.Now); d < -time.Minute || d > time.Minute || h.Now.Location() != time.UTC {
		t.Fatalf("now %s", h.Now)
	}

	// Any open transaction counts, not only one that has written: now() is
	// its start, so it can still write an old updated_at and commit late.
	reader, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Rollback(ctx)
	var readerStart time.Time
	if err := reader.QueryRow(ctx, "SELECT now() FROM (SELECT count(*) FROM t) c").Scan(&readerStart); err != nil {
		t.Fatal(err)
	}
	writer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	var start time.Time
	if err := writer.QueryRow(ctx, "SELECT now()").Scan(&start); err != nil {
		t.Fatal(err)
	}
	h, err = src.Horizon(ctx)
	if err != nil || !h.OldestWriter.Equal(readerStart) {
		t.Fatalf("two open transactions: %+v %v; want the older one's start %s", h, err, readerStart)
	}
	if err := reader.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	h, err = src.Horizon(ctx)
	if err != nil || !h.OldestWriter.Equal(start) {
		t.Fatalf("before the write: %+v %v; want the open transaction's start %s", h, err, start)
	}
	if _, err := writer.Exec(ctx, "INSERT INTO t VALUES (1, now())"); err != nil {
		t.Fatal(err)
	}
	h, err = src.Horizon(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !h.OldestWriter.Equal(start) || h.OldestWriter.Location() != time.UTC {
		t.Fatalf("oldest writer %s, want the writer's start %s", h.OldestWriter, start)
	}
	if !h.Now.After(h.OldestWriter) {
		t.Fatalf("now %s not after oldest writer %s", h.Now, h.OldestWriter)
	}
	if err := writer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	h, err = src.Horizon(ctx)
	if err != nil || !h.OldestWriter.IsZero() {
		t.Fatalf("after commit: %+v %v", h, err)
	}
}

// TestCheckHorizon: a role without pg_read_all_stats gets a warning naming
// the GRANT; a superuser and a pg_monitor member do not.
func TestCheckHorizon(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	ctx := context.Background()

	fs, err := open(t, config(db, "t")).CheckHorizon(ctx)
	if err != nil || len(fs) != 1 || fs[0].Severity != postgres.OK {
		t.Fatalf("superuser: %v %v", fs, err)
	}

	ident, dsn := loginRole(t, db, "reader")
	db.Exec(t, fmt.Sprintf("GRANT SELECT ON t TO %s", ident))
	cfg := config(db, "t")
	cfg.DSN = dsn
	src := open(t, cfg)

	fs, err = src.CheckHorizon(ctx)
	if err != nil || len(fs) != 1 || fs[0].Severity != postgres.Warn || !strings.Contains(fs[0].Message, "GRANT pg_read_all_stats TO "+ident) {
		t.Fatalf("unprivileged role: %v %v", fs, err)
	}
	// And indeed it cannot see another role's writer.
	writer, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer writer.Rollback(ctx)
	if _, err := writer.Exec(ctx, "INSERT INTO t VALUES (1, now())"); err != nil {
		t.Fatal(err)
	}
	if h, err := src.Horizon(ctx); err != nil || !h.OldestWriter.IsZero() {
		t.Fatalf("unprivileged horizon: %+v %v", h, err)
	}

	db.Exec(t, fmt.Sprintf("GRANT pg_monitor TO %s", ident))
	fs, err = src.CheckHorizon(ctx)
	if err != nil || len(fs) != 1 || fs[0].Severity != postgres.OK {
		t.Fatalf("pg_monitor member: %v %v", fs, err)
	}

	// A role whose sessions do not report activity is invisible: check
	// says so, naming it.
	db.Exec(t, fmt.Sprintf("ALTER ROLE %s SET track_activities = off", ident))
	fs, err = src.CheckHorizon(ctx)
	if err != nil || len(fs) != 2 || fs[1].Severity != postgres.Warn || !strings.Contains(fs[1].Message, "track_activities is set off for role "+db.Schema+"_reader") {
		t.Fatalf("role with track_activities off: %v %v", fs, err)
	}
	if h, err := src.Horizon(ctx); err != nil || h.OldestWriter.IsZero() {
		t.Fatalf("pg_monitor horizon: %+v %v", h, err)
	}
}

// TestSnapshot: pages inside the snapshot do not see rows committed after it
// began; the live source does; Start is the transaction start.
func TestSnapshot(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)")
	for id := 1; id <= 3; id++ {
		db.Exec(t, "INSERT INTO t VALUES ($1, $2)", id, t0)
	}
	src := open(t, config(db, "t"))
	ctx := context.Background()

	before := time.Now()
	snap, err := src.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st := snap.Start(); st.Location() != time.UTC || st.Before(before.Add(-time.Minute)) || st.After(time.Now().Add(time.Minute)) {
		t.Fatalf("start %s", st)
	}
	db.Exec(t, "INSERT INTO t VALUES (4, $1)", t0)
	db.Exec(t, "UPDATE t SET updated_at = $1 WHERE id = 1", t0.Add(time.Hour))
	db.Exec(t, "DELETE FROM t WHERE id = 2")

	if got := ids(walk(t, snap, time.Time{}, 1)); got != "1,2,3" {
		t.Errorf("snapshot sees %q, want 1,2,3", got)
	}
	if got := ids(walk(t, src, time.Time{}, 1)); got != "3,4,1" {
		t.Errorf("live source sees %q, want 3,4,1", got)
	}
	// A second view of the same snapshot is still the old one.
	if got := ids(walk(t, snap, time.Time{}, 1000)); got != "1,2,3" {
		t.Errorf("snapshot second walk %q", got)
	}
	if err := snap.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := snap.Close(ctx); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := snap.Page(ctx, connector.PageRequest{Limit: 1}); err == nil {
		t.Fatal("page after close")
	}
	// The connection went back to the pool in a clean state.
	if got := ids(walk(t, src, time.Time{}, 1000)); got != "3,4,1" {
		t.Errorf("after close %q", got)
	}
}
