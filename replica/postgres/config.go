package postgres

import (
	"errors"
	"fmt"
	"strings"
)

// Config configures a PostgreSQL target.
//
// Schema, Table, IDColumn and OffsetsTable are identifiers: always quoted,
// never interpreted as SQL.
type Config struct {
	// DSN is a libpq connection string (URL or keyword form), parsed by
	// pgxpool.ParseConfig. Required.
	DSN string
	// PasswordFile, when set, holds the password (one trailing newline
	// trimmed) and is read again for every new connection, so a rotated
	// password takes effect without a restart; it replaces the DSN's.
	// Default: none.
	PasswordFile string
	// Schema of the target table and the offsets table. Default: the
	// session's current_schema() (normally "public").
	Schema string
	// Table is the target table. Required. Created on first use when
	// missing (from Columns, or inferred from the first batch).
	Table string
	// IDColumn holds the record key; it needs a unique index (a created
	// table makes it the primary key). Default "id".
	IDColumn string
	// Topic is the data topic the positions belong to. Required.
	Topic string
	// OffsetsTable stores the positions, one row per (target table, topic,
	// partition), in Schema. Created when missing. Default
	// "tidemark_replica_offsets".
	OffsetsTable string
	// Columns describe the source table (DescribeSource). When set, a
	// missing target table is created with exactly these columns and types,
	// and an existing one is checked against them; only these columns are
	// written. When nil, a missing table is created from the first batch's
	// values (docs/replica.md: inferred types) and every column of the
	// target is written.
	Columns []Column
}

func (c Config) withDefaults() Config {
	if c.IDColumn == "" {
		c.IDColumn = "id"
	}
	if c.OffsetsTable == "" {
		c.OffsetsTable = "tidemark_replica_offsets"
	}
	return c
}

// Validate reports every problem with c at once.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if strings.TrimSpace(c.DSN) == "" {
		errs = append(errs, errors.New("target dsn is required"))
	}
	if c.Table == "" {
		errs = append(errs, errors.New("target table is required"))
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("topic is required"))
	}
	seen := map[string]bool{}
	for i, col := range c.Columns {
		if col.Name == "" || col.Type == "" {
			errs = append(errs, fmt.Errorf("column %d: name and type are required", i))
		}
		if seen[col.Name] {
			errs = append(errs, fmt.Errorf("column %q listed twice", col.Name))
		}
		seen[col.Name] = true
	}
	return errors.Join(errs...)
}
