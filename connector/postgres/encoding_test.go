package postgres_test

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestCheckWarnsOfSQLASCII: a SQL_ASCII database stores text bytes
// unchecked and converts nothing, so a text value may not be UTF-8; the
// JSON value then holds U+FFFD where such a byte was, and two different
// values can publish (and verify) as one. check warns, naming the
// database's encoding; a UTF8 database gets no such warning.
func TestCheckWarnsOfSQLASCII(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	name := db.Schema + "_ascii"
	db.Exec(t, fmt.Sprintf("CREATE DATABASE %s ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0", pgx.Identifier{name}.Sanitize()))
	t.Cleanup(func() {
		_, _ = db.Pool.Exec(context.Background(), fmt.Sprintf("DROP DATABASE %s WITH (FORCE)", pgx.Identifier{name}.Sanitize()))
	})
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/" + name
	ascii, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ascii.Close()
	for _, sql := range []string{
		"CREATE TABLE public.t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)",
		"CREATE INDEX ON public.t (updated_at, id)",
		`INSERT INTO public.t VALUES (1, now(), E'caf\xe9')`,
	} {
		if _, err := ascii.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}

	warned := func(cfg postgres.Config) string {
		rep, err := postgres.Check(ctx, cfg)
		if err != nil {
			t.Fatalf("check: %v", err)
		}
		for _, f := range rep.Findings {
			if f.Check == "encoding" {
				return f.Message
			}
		}
		return ""
	}
	if msg := warned(postgres.Config{DSN: u.String(), Schema: "public", Table: "t"}); !strings.Contains(msg, "SQL_ASCII") || !strings.Contains(msg, "U+FFFD") {
		t.Errorf("check on a SQL_ASCII database: encoding finding %q; want a warning naming SQL_ASCII and U+FFFD", msg)
	}
	db.Exec(t, "CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text)")
	if msg := warned(config(db, "t")); msg != "" {
		t.Errorf("check on a UTF8 database warns: %q", msg)
	}
}
