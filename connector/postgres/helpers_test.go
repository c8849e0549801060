package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

// loginRole creates a login role (named after the test's schema, roles
// being the cluster's) with USAGE on the schema, dropped at cleanup, and
// returns its quoted name and a URL that connects as it.
func loginRole(t *testing.T, db *harness.DB, suffix string) (ident, dsn string) {
	t.Helper()
	ident = pgx.Identifier{db.Schema + "_" + suffix}.Sanitize()
	db.Exec(t, fmt.Sprintf("CREATE ROLE %s LOGIN", ident))
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), fmt.Sprintf("DROP OWNED BY %s; DROP ROLE %s", ident, ident))
	})
	db.Exec(t, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{db.Schema}.Sanitize(), ident))
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(db.Schema + "_" + suffix)
	return ident, u.String()
}

// config returns a Config for table in the test's schema.
func config(db *harness.DB, table string) postgres.Config {
	return postgres.Config{DSN: db.URL, Schema: db.Schema, Table: table}
}

// open is postgres.New that fails the test on error and closes at cleanup.
func open(t testing.TB, cfg postgres.Config) *postgres.Source {
	t.Helper()
	src, err := postgres.New(context.Background(), cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(src.Close)
	return src
}

// walk reads one whole pass and checks the page invariants: no page is
// larger than the limit, End comes only with an empty page, and the walk
// terminates.
func walk(t *testing.T, src connector.Source, since time.Time, limit int) []connector.Row {
	t.Helper()
	return walkRequest(t, src, connector.PageRequest{Since: since, Limit: limit})
}

// walkRequest is walk from req (its cursor advanced page by page).
func walkRequest(t *testing.T, src connector.Source, req connector.PageRequest) []connector.Row {
	t.Helper()
	var all []connector.Row
	limit := req.Limit
	for i := 0; ; i++ {
		if i > 10000 {
			t.Fatalf("walk did not end after %d pages", i)
		}
		p, err := src.Page(context.Background(), req)
		if err != nil {
			t.Fatalf("page %d (cursor %q): %v", i, req.Cursor, err)
		}
		if len(p.Rows) > limit {
			t.Fatalf("page %d has %d rows, limit %d", i, len(p.Rows), limit)
		}
		if p.End {
			if len(p.Rows) != 0 {
				t.Fatalf("page %d: End with %d rows", i, len(p.Rows))
			}
			return all
		}
		if len(p.Rows) == 0 {
			t.Fatalf("page %d: no rows but not End", i)
		}
		if p.Next == "" || p.Next == req.Cursor {
			t.Fatalf("page %d: Next %q does not advance from %q", i, p.Next, req.Cursor)
		}
		all = append(all, p.Rows...)
		req.Cursor = p.Next
	}
}

func ids(rows []connector.Row) string {
	s := make([]string, len(rows))
	for i, r := range rows {
		s[i] = r.ID
	}
	return strings.Join(s, ",")
}

// dbOrder returns the ids in the database's own ORDER BY updated_at, id.
func dbOrder(t *testing.T, db *harness.DB, table string) string {
	t.Helper()
	rows, err := db.Pool.Query(context.Background(), fmt.Sprintf("SELECT id::text AS s FROM %s ORDER BY updated_at, id", table))
	if err != nil {
		t.Fatal(err)
	}
	var s []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		s = append(s, id)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return strings.Join(s, ",")
}
