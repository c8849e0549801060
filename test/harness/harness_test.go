package harness_test

import (
	"context"
	"testing"

	"github.com/tidemark/tidemark/test/harness"
)

func TestMain(m *testing.M) { harness.Main(m) }

func TestPostgresStarts(t *testing.T) {
	db := harness.NewDB(t)
	var one int
	if err := db.Pool.QueryRow(context.Background(), "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("select 1: %v %d", err, one)
	}
	db.Exec(t, "CREATE TABLE x (id bigint primary key)")
	var schema string
	if err := db.Pool.QueryRow(context.Background(), "SELECT current_schema()").Scan(&schema); err != nil || schema != db.Schema {
		t.Fatalf("schema %q want %q: %v", schema, db.Schema, err)
	}
}
