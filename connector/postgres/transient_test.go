package postgres

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/harness"
)

// A backend terminated under the start-up check of the page queries (an
// administrator's pg_terminate_backend, a failover) is a transient
// failure, not PostgreSQL rejecting the filter or columns: the chaos
// suite's storm saw a run exit 2, "fix the configuration", on SQLSTATE
// 57P01.
func TestPrepareOnATerminatedBackendIsTransient(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	sep := "?"
	if strings.Contains(db.URL, "?") {
		sep = "&"
	}
	cfg := Config{DSN: db.URL + sep + "pool_max_conns=1", Schema: db.Schema, Table: "t"}.withDefaults()
	pool, err := connect(ctx, cfg, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pid); err != nil {
		t.Fatal(err)
	}
	for gone := false; !gone; {
		if err := db.Pool.QueryRow(ctx, "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", pid).Scan(&gone); err != nil {
			t.Fatal(err)
		}
	}
	sh := &shape{q: queries{all: "SELECT 1", since: "SELECT 1", next: "SELECT 1", sinceBefore: "SELECT 1", nextBefore: "SELECT 1"}}
	for i := range sh.q.load {
		sh.q.load[i] = "SELECT 1"
	}
	sh.tbl = &table{ident: `"t"`}
	err = prepare(ctx, pool, sh)
	t.Logf("prepare on the terminated backend: %v", err)
	if err == nil {
		t.Fatal("the statements ran on another connection: the test did not reach the terminated backend")
	}
	if errors.Is(err, ErrBadConfig) {
		t.Errorf("a terminated backend is reported as a bad configuration: %v", err)
	}
}

// A filter PostgreSQL rejects stays a configuration error, named as one.
func TestAFilterPostgreSQLRejectsIsABadConfiguration(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	cfg := Config{DSN: db.URL, Schema: db.Schema, Table: "t", Filter: "no_such_column = 1"}
	src, err := New(context.Background(), cfg)
	if err == nil {
		src.Close()
		t.Fatal("a filter naming a missing column was accepted")
	}
	if !errors.Is(err, ErrBadConfig) || !strings.Contains(err.Error(), "no_such_column") {
		t.Errorf("got %v; want a bad configuration naming the column", err)
	}
}

// A filter that PostgreSQL accepts but that fails on a row (a cast of a
// value that does not convert, a division by zero) fails every read of
// that row the same way: a configuration error naming the filter, not a
// transient failure retried for ever (and a restart loop).
func TestAFilterThatFailsOnARowIsABadConfiguration(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	db.Exec(t, "CREATE INDEX ON t (updated_at, id)")
	db.Exec(t, "INSERT INTO t VALUES (1, now(), '1'), (2, now(), 'x')")
	for _, filter := range []string{"v::int = 1", "10 / (id - 2) > 0"} {
		src, err := New(context.Background(), Config{DSN: db.URL, Schema: db.Schema, Table: "t", Filter: filter, LoadWorkers: 1})
		if err != nil {
			t.Fatalf("filter %q: %v", filter, err)
		}
		_, err = src.Page(context.Background(), connector.PageRequest{Limit: 10})
		if !errors.Is(err, ErrBadConfig) || !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), "source.filter") {
			t.Errorf("filter %q, a page: %v; want a permanent bad configuration naming source.filter", filter, err)
		}
		_, err = src.LoadPage(context.Background(), connector.LoadRequest{Limit: 10})
		if !errors.Is(err, ErrBadConfig) || !errors.Is(err, connector.ErrPermanent) || !strings.Contains(err.Error(), "source.filter") {
			t.Errorf("filter %q, a load page: %v; want a permanent bad configuration naming source.filter", filter, err)
		}
		src.Close()
	}
}
