package main

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/connector/postgres"
)

// checkDSN checks a PostgreSQL DSN the way the driver will read it, before
// anything connects, and warns when the connection would leave the host
// without sslmode=verify-full. key names where the DSN came from
// (source.dsn, --target-dsn, --replica-dsn). The error (exit 2) names the
// part that is wrong and shows the DSN redacted; the driver's own message
// is never shown, because it can quote the password.
func (a *cli) checkDSN(key, dsn string) error {
	if w := postgresTLSWarning(dsn, a.env); w != "" {
		a.log.Warn(w, "dsn", key) // security.go
	}
	if err := postgres.CheckDSN(dsn); err != nil {
		return &ConfigError{Key: key, Origin: a.cfg.origin[key],
			Msg: fmt.Sprintf("%v (the DSN, redacted: %s)", err, RedactDSN(dsn))}
	}
	return nil
}

// openError describes a failure to open a PostgreSQL connection (what, at
// the redacted DSN). The server refusing the database, the user or the
// password is a configuration error (exit 2) that says what to fix; anything
// else (the server down, a network error) is a runtime failure (exit 1).
func openError(key, dsn, what string, err error) error {
	var pe *pgconn.PgError
	if errors.Is(err, postgres.ErrBadConfig) {
		// The source said what is wrong and what to do (a filter, row-level
		// security): its words, not a guess from the SQLSTATE.
		return fmt.Errorf("%s %s: %w", what, RedactDSN(dsn), err)
	}
	if errors.As(err, &pe) {
		fix := ""
		switch pe.Code {
		case "3D000": // invalid_catalog_name
			fix = "the database does not exist: fix dbname in " + key + ", or create the database"
		case "28P01": // invalid_password
			fix = "the server refused the password: check the password source (source.password_env or source.password_file, or the target's)"
		case "28000": // invalid_authorization_specification
			fix = "the server refused the login (no such role, or no pg_hba.conf entry for this host, user and database): fix the user in " + key + " or the server's pg_hba.conf"
		case "42501": // insufficient_privilege
			var ce *pgconn.ConnectError
			if errors.As(err, &ce) { // refused at connect: the database's CONNECT privilege
				fix = "the user may not connect to this database: GRANT CONNECT ON DATABASE to it"
			} else {
				fix = "the user lacks a privilege this needs (PostgreSQL's message names it): grant it, or connect as a role that has it"
			}
		}
		if fix != "" {
			return &ConfigError{Key: key, Msg: fmt.Sprintf("%s %s: %s (PostgreSQL %s: %s)", what, RedactDSN(dsn), fix, pe.Code, pe.Message),
				Credentials: pe.Code == "28P01" || pe.Code == "28000"}
		}
	}
	return fmt.Errorf("%s %s: %w", what, RedactDSN(dsn), err)
}
