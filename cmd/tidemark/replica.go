package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/replica"
	replicapg "github.com/tidemark/tidemark/replica/postgres"
)

// replicaFlags are the flags of `tidemark replica`.
type replicaFlags struct {
	targetDSN     string
	targetSchema  string
	targetTable   string
	idColumn      string
	fromBeginning bool
	infer         bool
	batchRecords  int
	passwordEnv   string
	passwordFile  string
}

func (a *cli) registerReplicaFlags(fs *flag.FlagSet) {
	f := &a.replica
	fs.StringVar(&f.targetDSN, "target-dsn", "", "PostgreSQL DSN of the replica database (default: source.dsn, with source.password_env or source.password_file)")
	fs.StringVar(&f.passwordEnv, "target-password-env", "", "environment variable holding the replica database's password (keeps it off the command line)")
	fs.StringVar(&f.passwordFile, "target-password-file", "", "file holding the replica database's password; one trailing newline is trimmed")
	fs.StringVar(&f.targetSchema, "target-schema", "", "schema of the replica table and its offsets table (default: source.schema, where verify --replica-table looks; for an HTTP source the DSN's current schema)")
	fs.StringVar(&f.targetTable, "target-table", "", "replica table; created when missing (required)")
	fs.StringVar(&f.idColumn, "target-id-column", "", "replica column holding the record key (default: source.id_column, else id)")
	fs.BoolVar(&f.fromBeginning, "from-beginning", false, "rebuild from scratch: empty the table and its positions in one transaction, then consume from the start")
	fs.BoolVar(&f.infer, "infer", false, "create a missing table from the first records' JSON types instead of the source table's column types")
	fs.IntVar(&f.batchRecords, "batch-records", 5000, "records per database transaction")
	fs.BoolVar(&a.once, "once", false, "stop when caught up with the topic's end as observed at start")
}

// cmdReplica folds the data topic into a PostgreSQL table, exactly once:
// positions are stored in the target database with the rows.
func cmdReplica(ctx context.Context, a *cli) error {
	defer a.closeAll()
	f := a.replica
	if f.targetTable == "" {
		return &ConfigError{Key: "--target-table", Msg: "the replica table is required: tidemark replica --config FILE --target-table orders_replica"}
	}
	cfg := replicapg.Config{
		DSN: f.targetDSN, Schema: f.targetSchema, Table: f.targetTable, IDColumn: f.idColumn,
		Topic: a.cfg.Kafka.Topic,
	}
	dsnKey := "--target-dsn"
	if cfg.DSN == "" {
		if !a.isPostgres() {
			return &ConfigError{Key: "--target-dsn", Msg: fmt.Sprintf("required with source.kind %s: source.dsn is the changes API's URL, not a database; give the replica database, e.g. --target-dsn postgres://replica@localhost:5432/shop", a.cfg.Source.Kind)}
		}
		cfg.DSN, dsnKey = a.cfg.Source.DSN, "source.dsn"
	}
	if err := a.checkDSN(dsnKey, cfg.DSN); err != nil { // before anything connects
		return err
	}
	pw, pwFile, err := a.otherPassword("--target-password", f.passwordEnv, f.passwordFile, dsnKey, cfg.DSN)
	if err != nil {
		return err
	}
	cfg.DSN = withPassword(cfg.DSN, pw)
	cfg.PasswordFile = pwFile // read again for each new connection
	if cfg.IDColumn == "" {
		cfg.IDColumn = a.cfg.Source.IDColumn
	}
	if cfg.Schema == "" && a.isPostgres() {
		cfg.Schema = a.cfg.Source.Schema // the default of verify --replica-schema too
	}
	// Like `run --once`, replica waits at start-up for a server that does
	// not answer yet, up to sync.once_retry_timeout (startup.go).
	if !f.infer {
		if err := a.startup(ctx, "the source (for its column types)", "source", func() (err error) {
			cfg.Columns, err = a.sourceColumns(ctx)
			return waitOnlyForConnect(err)
		}); err != nil {
			return err
		}
	}
	var target *replicapg.Target
	if err := a.startup(ctx, "the replica database", "source", func() (err error) {
		target, err = replicapg.Open(ctx, cfg)
		if err == nil {
			return nil
		}
		if errors.Is(err, replicapg.ErrSchema) {
			return &ConfigError{Key: "--target-table", Msg: "the replica table " + f.targetTable + " does not fit", Err: err}
		}
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "3F000" { // invalid_schema_name
			return &ConfigError{Key: "--target-schema", Msg: fmt.Sprintf("schema %q does not exist in the replica database; create it, or name another with --target-schema", cfg.Schema)}
		}
		return waitOnlyForConnect(openError(dsnKey, cfg.DSN, "open replica target", err))
	}); err != nil {
		return err
	}
	a.closers = append(a.closers, target.Close)

	opts, err := a.kafkaOpts()
	if err != nil {
		return err
	}
	if err := a.waitForKafka(ctx, opts); err != nil {
		return err
	}
	c, err := replica.NewConsumer(replica.Config{Topic: a.cfg.Kafka.Topic, Opts: opts, BatchRecords: f.batchRecords, Logger: a.log}, target)
	if err != nil {
		return err
	}
	if f.fromBeginning {
		if err := target.Reset(ctx); err != nil {
			return fmt.Errorf("rebuild %s from the beginning: %w", target.Ident(), err)
		}
		a.log.Info("replica emptied: rebuilding from the beginning of the topic", "table", target.Ident())
	}
	mode := replica.Follow
	if a.once {
		mode = replica.Once
	}
	st, err := c.Run(ctx, mode)
	if err != nil {
		return replicaError(err, target.Ident())
	}
	fmt.Fprintf(a.stdout, "replica %s: applied %d records (%d upserts, %d tombstones) in %d transactions; lag %d; positions %s\n",
		target.Ident(), st.Records, st.Upserts, st.Tombstones, st.Batches, st.TotalLag(), positions(st.Positions))
	return nil
}

// sourceColumns describes the source table for creating or checking the
// replica table; nil (infer from records) when the source is not
// PostgreSQL.
func (a *cli) sourceColumns(ctx context.Context) ([]replicapg.Column, error) {
	if k := a.cfg.Source.Kind; k != "" && k != "postgres" {
		return nil, nil
	}
	pc, err := a.pgConfig()
	if err != nil {
		return nil, err
	}
	if err := a.checkDSN("source.dsn", pc.DSN); err != nil {
		return nil, err
	}
	poolCfg, err := pgxpool.ParseConfig(pc.DSN)
	if err != nil {
		return nil, &ConfigError{Key: "source.dsn", Msg: "the PostgreSQL driver cannot use it"} // never its text: see dsn.go
	}
	postgres.SetCredentials(poolCfg, pc)
	pool, err := pgxpool.NewWithConfig(ctx, poolCfg)
	if err == nil {
		err = pool.Ping(ctx)
		if err != nil {
			pool.Close()
		}
	}
	if err != nil {
		return nil, openError("source.dsn", pc.DSN, "connect to the source to read its column types:", err)
	}
	defer pool.Close()
	cols, err := replicapg.DescribeSource(ctx, pool, pc.Schema, pc.Table, pc.Columns)
	if err != nil {
		return nil, fmt.Errorf("read the source's column types (or use --infer): %w", err)
	}
	return cols, nil
}

// replicaError maps the replica's stops to the exit codes.
func replicaError(err error, table string) error {
	var ve *replicapg.ValueError
	switch {
	case errors.As(err, &ve):
		return &connector.StopError{Reason: "a record does not fit the replica table; nothing of its batch was applied", Err: err,
			Hint: fmt.Sprintf("change the column's type in %s (ALTER TABLE) or rebuild it, then run again: it resumes at this batch", table)}
	case errors.Is(err, replicapg.ErrConstraint):
		return &connector.StopError{Reason: "a batch of records violates a constraint of " + table + "; nothing of it was applied", Err: err,
			Hint: "drop or change the constraint (or rebuild the table without it), then run again: it resumes at this batch"}
	case errors.Is(err, replica.ErrPosition):
		return &connector.StopError{Reason: "the stored replica position does not fit the topic", Err: err,
			Hint: "rebuild the replica: tidemark replica --from-beginning"}
	case errors.Is(err, replicapg.ErrConflict):
		return &connector.StopError{Reason: "another replica process writes " + table + ", or rebuilt it", Err: err,
			Hint: "run one replica process per target table; after another process's --from-beginning, run again: it resumes from the rebuilt positions"}
	}
	return err
}

// otherPassword is the password for a second database (replica --target-*,
// verify --replica-*): from the variable named by passwordEnv or the file
// passwordFile (flag is the flags' common prefix), else, when the DSN is
// source.dsn's, source.password_env or source.password_file. "" means the
// DSN (or ~/.pgpass) carries it. file is the file it came from, if any, to
// read again for each new connection (postgres.Config.PasswordFile); never
// source.password_file for another DSN.
func (a *cli) otherPassword(flag, passwordEnv, passwordFile, dsnKey, dsn string) (pw, file string, err error) {
	switch {
	case passwordEnv != "" && passwordFile != "":
		return "", "", &ConfigError{Key: flag + "-file", Msg: flag + "-env and " + flag + "-file are both set; keep one"}
	case (passwordEnv != "" || passwordFile != "") && dsnHasPassword(dsn):
		return "", "", &ConfigError{Key: flag + "-env", Msg: "the DSN holds a password too; keep one (remove it from " + dsnKey + ")"}
	case passwordEnv != "":
		v := a.env(passwordEnv)
		if v == "" {
			return "", "", &ConfigError{Key: flag + "-env", Msg: fmt.Sprintf("environment variable %s is not set or empty; export it, or use %s-file", passwordEnv, flag)}
		}
		return v, "", nil
	case passwordFile != "":
		v, err := readSecretFile(passwordFile)
		if err != nil {
			return "", "", &ConfigError{Key: flag + "-file", Msg: err.Error()}
		}
		return v, passwordFile, nil
	case dsnKey == "source.dsn":
		v, err := a.cfg.Password(a.env)
		return v, a.cfg.Source.PasswordFile, err
	}
	return "", "", nil
}

// withPassword adds a password to a PostgreSQL DSN for drivers that take a
// DSN only: a quoted password keyword, or a percent-encoded password query
// parameter. The result is as secret as the password (print it with
// RedactDSN).
func withPassword(dsn, pw string) string {
	if pw == "" {
		return dsn
	}
	if urlFormRE.MatchString(dsn) {
		var b strings.Builder
		for i := 0; i < len(pw); i++ {
			c := pw[i]
			if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("-._~", c) >= 0 {
				b.WriteByte(c)
			} else {
				fmt.Fprintf(&b, "%%%02X", c)
			}
		}
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		return dsn + sep + "password=" + b.String()
	}
	esc := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
	return dsn + " password='" + esc + "'"
}

// positions prints the next offset per partition, in partition order:
// "0=12 1=7".
func positions(m map[int32]int64) string {
	parts := slices.Sorted(maps.Keys(m))
	out := make([]string, len(parts))
	for i, p := range parts {
		out[i] = fmt.Sprintf("%d=%d", p, m[p])
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, " ")
}
