package postgres

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrBadConfig marks errors caused by the configuration or by a source table
// that does not meet the requirements (docs/design.md, "Source table requirements"): retrying cannot help,
// an operator must change something. cmd maps it to exit code 2.
var ErrBadConfig = errors.New("bad PostgreSQL source configuration")

// Config configures a PostgreSQL table source.
//
// Schema, Table and the column names are identifiers: they are always quoted
// (pgx.Identifier.Sanitize) and never interpreted as SQL. Filter is the only
// configuration text that is ever spliced into SQL.
type Config struct {
	// DSN is a libpq connection string, URL ("postgres://...") or keyword
	// ("host=... dbname=...") form, parsed by pgxpool.ParseConfig. Pool
	// settings such as pool_max_conns are honoured. Required.
	DSN string
	// Password, when non-empty, replaces any password in DSN. It is never
	// printed. Default: "" (use the DSN's password, PGPASSWORD or .pgpass).
	Password string
	// PasswordFile, when non-empty, holds the password (one trailing
	// newline is trimmed) and is read again for every new connection, so a
	// rotated secret (the file replaced, then the role's password changed)
	// takes effect without a restart. It replaces Password and any
	// password in DSN. Default: "".
	PasswordFile string
	// Schema of the table. Default: "public".
	Schema string
	// Table to stream. Required.
	Table string
	// IDColumn is the row id: unique, NOT NULL, of type bigint, integer,
	// smallint, text, varchar or uuid. Its text form is the Kafka record key.
	// Default: "id".
	IDColumn string
	// UpdatedAtColumn is the change timestamp: timestamptz NOT NULL, set on
	// every write. Default: "updated_at".
	UpdatedAtColumn string
	// DeletedAtColumn, when set, marks soft deletes: a row whose value in this
	// column is not NULL is published as a tombstone. Should be timestamptz.
	// Default: "" (no soft deletes).
	DeletedAtColumn string
	// Columns are the columns encoded into each record's value, in this
	// order. Default: nil, meaning every column of the table in ordinal
	// order.
	Columns []string
	// Filter is an optional SQL boolean expression over the table's columns,
	// written by the operator, spliced verbatim into every page query as
	// "AND (<Filter>)". It is the ONLY configuration text that is ever placed
	// into SQL as text: treat it like code, never fill it from untrusted
	// input. Rows it excludes are never read by a pass; a sweep tombstones
	// the ones the topic still holds (docs/deletes.md). Default: "" (all
	// rows).
	Filter string
	// LoadWorkers is the number of sessions an initial load in key order
	// reads with at once (connector.Config.LoadWorkers): the pool is sized
	// to hold them and two more. A pool_max_conns in DSN below that is
	// refused. Default: 0 (the pool's own default size).
	LoadWorkers int
	// Logger receives the source's warnings. Default: slog.Default().
	Logger *slog.Logger
	// RowSecurity lets row-level security policies that apply to the role
	// filter what it reads, as PostgreSQL does by default. A connector
	// must not: it would publish part of the table, and verify, behind the
	// same policies, could not see the rest missing; so by default the
	// sessions set row_security off and such a table is refused. The
	// reference feed (tidemark feed serve) serves what its role may see,
	// and sets it. Default: false.
	RowSecurity bool
}

func (c *Config) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// withDefaults returns c with the documented defaults filled in.
func (c Config) withDefaults() Config {
	if c.Schema == "" {
		c.Schema = "public"
	}
	if c.IDColumn == "" {
		c.IDColumn = "id"
	}
	if c.UpdatedAtColumn == "" {
		c.UpdatedAtColumn = "updated_at"
	}
	return c
}

// Validate reports every problem with c at once. Defaults are applied
// first, so empty optional fields are fine. The returned error wraps
// ErrBadConfig.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if strings.TrimSpace(c.DSN) == "" {
		errs = append(errs, errors.New("dsn is required"))
	}
	if c.Table == "" {
		errs = append(errs, errors.New("table is required"))
	}
	if c.IDColumn == c.UpdatedAtColumn {
		errs = append(errs, fmt.Errorf("id column and updated_at column are both %q; they must differ", c.IDColumn))
	}
	if c.DeletedAtColumn != "" && (c.DeletedAtColumn == c.IDColumn || c.DeletedAtColumn == c.UpdatedAtColumn) {
		errs = append(errs, fmt.Errorf("deleted_at column %q must differ from the id and updated_at columns", c.DeletedAtColumn))
	}
	if err := checkFilter(c.Filter); err != nil {
		errs = append(errs, fmt.Errorf("filter: %w", err))
	}
	seen := make(map[string]bool, len(c.Columns))
	for _, col := range c.Columns {
		if col == "" {
			errs = append(errs, errors.New("columns: empty column name"))
			continue
		}
		if seen[col] {
			errs = append(errs, fmt.Errorf("columns: %q listed twice", col))
		}
		seen[col] = true
	}
	for _, f := range [...]struct{ name, v string }{
		{"schema", c.Schema}, {"table", c.Table}, {"id column", c.IDColumn},
		{"updated_at column", c.UpdatedAtColumn}, {"deleted_at column", c.DeletedAtColumn},
	} {
		if strings.IndexByte(f.v, 0) >= 0 {
			errs = append(errs, fmt.Errorf("%s contains a NUL byte", f.name))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %w", ErrBadConfig, errors.Join(errs...))
}

// String describes c for logs and errors: Password is never printed, and a
// password inside DSN is replaced by REDACTED.
func (c Config) String() string {
	pw := ""
	if c.Password != "" {
		pw = "REDACTED"
	}
	return fmt.Sprintf("postgres.Config{DSN:%q Password:%q Schema:%q Table:%q IDColumn:%q UpdatedAtColumn:%q DeletedAtColumn:%q Columns:%q Filter:%q}",
		redactDSN(c.DSN), pw, c.Schema, c.Table, c.IDColumn, c.UpdatedAtColumn, c.DeletedAtColumn, c.Columns, c.Filter)
}

// GoString makes %#v as safe as %v.
func (c Config) GoString() string { return c.String() }

var (
	urlPassword     = regexp.MustCompile(`^([a-zA-Z][a-zA-Z0-9+.-]*://[^/@?#]*?:)[^@/?#]*@`)
	keywordPassword = regexp.MustCompile(`(password\s*=\s*)('(?:[^'\\]|\\.)*'|(?:[^\s\\]|\\.)*\\?)`) // an unquoted value may escape a space as "\ "
	queryPassword   = regexp.MustCompile(`([?&]password=)[^&#]*`)
)

// redactDSN hides the password in a URL or keyword/value DSN.
func redactDSN(dsn string) string {
	dsn = urlPassword.ReplaceAllString(dsn, "${1}REDACTED@")
	dsn = queryPassword.ReplaceAllString(dsn, "${1}REDACTED")
	if !strings.Contains(dsn, "://") {
		dsn = keywordPassword.ReplaceAllString(dsn, "${1}REDACTED")
	}
	return dsn
}

// ReadPasswordFile reads a password file: one line, one trailing newline
// trimmed. Errors name the file, never its content.
func ReadPasswordFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		var pe *os.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is already in the message
		}
		return "", fmt.Errorf("read password file %s: %v", path, err)
	}
	v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	if v == "" {
		return "", fmt.Errorf("password file %s is empty; write the password into it", path)
	}
	return v, nil
}

// passwordFromFile sets cc's password from the password file at path,
// read now, unless path is "" (before each new connection: see
// Config.PasswordFile).
func passwordFromFile(path string, cc *pgconn.Config) error {
	if path == "" {
		return nil
	}
	pw, err := ReadPasswordFile(path)
	if err != nil {
		return err
	}
	cc.Password = pw
	return nil
}

// renewTLS gives cc, about to open a new connection, the TLS settings of
// its connection string parsed again now. pgx reads the files a DSN names
// (sslrootcert, sslcert, sslkey; or PGSSLROOTCERT and the like) when it
// parses the DSN, once; parsed again for every connection, as libpq does
// and as a password file is read, files renewed in place (cert-manager, a
// Kubernetes secret) are used by the next connection without a restart.
// A DSN whose sslmode is disable is not parsed again; every other one is
// (prefer, the default, included), since its files may be defaults. Files
// caught half way fail that connection only; the retry tries again. Only
// the TLS settings are taken: hosts, ports or TLS verification that differ
// from the first parse (a service file changed) fail the connection
// instead.
func renewTLS(cc *pgx.ConnConfig) error {
	tlsOn := cc.TLSConfig != nil
	for _, fb := range cc.Fallbacks {
		tlsOn = tlsOn || fb.TLSConfig != nil
	}
	if !tlsOn {
		return nil
	}
	fresh, err := pgconn.ParseConfig(cc.ConnString())
	if err != nil {
		// Only the cause: a parse error can quote the DSN, and with it
		// a password.
		var pe *pgconn.ParseConfigError
		if errors.As(err, &pe) && pe.Unwrap() != nil {
			err = pe.Unwrap()
		} else {
			err = errors.New("the DSN no longer parses")
		}
		return fmt.Errorf("read the TLS files of the DSN to %s again for a new connection%s: %w", cc.Host, tlsFiles(cc.ConnString()), err)
	}
	same := len(fresh.Fallbacks) == len(cc.Fallbacks) && sameTarget(fresh.Host, fresh.Port, fresh.TLSConfig, cc.Host, cc.Port, cc.TLSConfig)
	for i := 0; same && i < len(cc.Fallbacks); i++ {
		f, c := fresh.Fallbacks[i], cc.Fallbacks[i]
		same = sameTarget(f.Host, f.Port, f.TLSConfig, c.Host, c.Port, c.TLSConfig)
	}
	if !same {
		return fmt.Errorf("the DSN to %s, parsed again for a new connection, now gives other hosts, ports or TLS verification (a service file changed, or a default root certificate is gone?): restart tidemark to use them", cc.Host)
	}
	cc.TLSConfig = fresh.TLSConfig
	for i, fb := range cc.Fallbacks {
		fb.TLSConfig = fresh.Fallbacks[i].TLSConfig
	}
	return nil
}

// sameTarget reports whether two parses give one connection attempt the
// same host, port and TLS mode: with TLS or without, and with it, the same
// verification (pgx: require skips it, verify-ca checks the chain in
// VerifyPeerCertificate, verify-full lets crypto/tls check chain and name).
func sameTarget(host string, port uint16, tc *tls.Config, host2 string, port2 uint16, tc2 *tls.Config) bool {
	if host != host2 || port != port2 || (tc == nil) != (tc2 == nil) {
		return false
	}
	return tc == nil || tc.InsecureSkipVerify == tc2.InsecureSkipVerify &&
		(tc.VerifyPeerCertificate == nil) == (tc2.VerifyPeerCertificate == nil) && tc.ServerName == tc2.ServerName
}

// tlsFiles names the TLS files a DSN sets, for an error: " (sslrootcert
// /path, sslcert /path)", or "" when it sets none (defaults or PGSSL*
// variables). Paths are not secret.
func tlsFiles(dsn string) string {
	settings, err := dsnSettings(dsn)
	if err != nil {
		return ""
	}
	var named []string
	for _, k := range []string{"sslrootcert", "sslcert", "sslkey"} {
		if v := settings[k]; v != "" {
			named = append(named, k+" "+v)
		}
	}
	if len(named) == 0 {
		return ""
	}
	return " (" + strings.Join(named, ", ") + ")"
}
