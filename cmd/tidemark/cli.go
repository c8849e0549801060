package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/term"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/httpsrc"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
)

// cli holds what every command shares: flags, configuration, logger, and
// the resources it opened (closed by closeAll).
type cli struct {
	stdout, stderr io.Writer
	env            func(string) string
	environ        func() []string // every variable, for warnUnknownEnv (help.go); nil: none

	configPath string
	overrides  []string
	logFormat  string
	logLevel   string
	once       bool
	progress   bool // --progress: print progress even when stderr is not a terminal
	obs        *observability
	serve      bool       // start the metrics server (run only; serve.go)
	sasl       *saslWatch // records a SASL login the broker rejected (security.go)
	jsonOut    bool
	yes        bool
	reason     string
	by         string
	toWM       string
	notifySQL  bool // check --print-notify-sql (notify.go)
	// notifyKind is check --notify-trigger: which trigger
	// --print-notify-sql prints (postgres.NotifyKinds).
	notifyKind string
	notifyTrig postgres.NotifyKind // notifyKind, parsed by parse

	replicaDSN, replicaSchema, replicaTable string
	replicaPasswordEnv, replicaPasswordFile string // verify --replica-password-*

	replica replicaFlags // tidemark replica (replica.go)

	feed feedOptions

	cfg     *Config
	log     *slog.Logger
	closers []func()

	taskFlag string     // --task (group.go)
	tasks    *taskEnv   // what this task shares with the process's other tasks; nil outside task mode
	taskName string     // the task this cli runs, with tasks
	outMu    sync.Mutex // serialises what tasks run side by side print
}

type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

type keyFlag struct {
	key string
	a   *cli
}

func (k keyFlag) String() string     { return "" }
func (k keyFlag) Set(v string) error { k.a.overrides = append(k.a.overrides, k.key+"="+v); return nil }

// boolKeyFlag is the flag of a boolean key: --source.horizon alone sets it
// to true, --source.horizon=false to false; it never takes the next
// argument as its value.
type boolKeyFlag struct{ keyFlag }

func (boolKeyFlag) IsBoolFlag() bool { return true }

// keyFlagFor returns the flag that sets key.
func (a *cli) keyFlagFor(key string) flag.Value {
	if configFields().byKey[key].isBool() {
		return boolKeyFlag{keyFlag{key, a}}
	}
	return keyFlag{key, a}
}

func (a *cli) parse(cmd string, args []string) error {
	fs := flag.NewFlagSet("tidemark "+cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // one line and a hint on a bad flag, per-command help on --help (help.go)
	fs.Usage = func() {}
	fs.StringVar(&a.configPath, "config", "", "configuration file (YAML); see tidemark.example.yaml")
	var sets multiFlag
	fs.Var(&sets, "set", "override a configuration key: --set source.table=orders (repeatable)")
	fs.StringVar(&a.logFormat, "log-format", "", "log format: auto, text or json (overrides log.format)")
	fs.StringVar(&a.logLevel, "log-level", "", "log level: debug, info, warn, error (overrides log.level)")
	switch cmd {
	case "run":
		fs.BoolVar(&a.once, "once", false, "stop when caught up and print the completion record")
		fs.BoolVar(&a.jsonOut, "json", false, "print the completion record as JSON only")
		fs.BoolVar(&a.progress, "progress", false, "print progress lines (rows/s, rows to go) even when stderr is not a terminal")
		fs.StringVar(&a.taskFlag, "task", "", "with a tables: list and --once, only this task (default: every task)")
	case "status", "check", "ledger", "sweep":
		fs.BoolVar(&a.jsonOut, "json", false, "print JSON")
		fs.StringVar(&a.taskFlag, "task", "", "with a tables: list, only this task (default: every task)")
		if cmd == "check" {
			fs.BoolVar(&a.notifySQL, "print-notify-sql", false, "print the trigger that makes the table notify source.notify, for the table's owner to run (tidemark never creates it), and connect to nothing")
			fs.StringVar(&a.notifyKind, "notify-trigger", "statement", "with --print-notify-sql: statement (every writing transaction notifies) or deferred (at commit, one notifying commit at a time, for thousands of commits a second; DDL on the table after a write in the same transaction then fails: see docs/operating.md)")
		}
	case "verify":
		fs.BoolVar(&a.jsonOut, "json", false, "print the report as JSON")
		fs.StringVar(&a.taskFlag, "task", "", "with a tables: list, only this task (default: every task)")
		fs.StringVar(&a.replicaTable, "replica-table", "", "compare with this replica table instead of the topic")
		fs.StringVar(&a.replicaSchema, "replica-schema", "", "schema of the replica table (default: source.schema)")
		fs.StringVar(&a.replicaDSN, "replica-dsn", "", "DSN of the replica database (default: source.dsn, with source.password_env or source.password_file)")
		fs.StringVar(&a.replicaPasswordEnv, "replica-password-env", "", "environment variable holding the replica database's password")
		fs.StringVar(&a.replicaPasswordFile, "replica-password-file", "", "file holding the replica database's password")
	case "replica":
		a.registerReplicaFlags(fs)
		fs.StringVar(&a.taskFlag, "task", "", "with a tables: list, the task whose topic to fold (required there)")
	case "feed":
		var err error
		if args, err = a.feedArgs(fs, args); err != nil {
			return err
		}
	case "reset":
		fs.StringVar(&a.taskFlag, "task", "", "with a tables: list, the task to reset (required there)")
		fs.BoolVar(&a.yes, "yes", false, "do not ask for confirmation")
		fs.StringVar(&a.reason, "reason", "", "why (recorded with the reset)")
		fs.StringVar(&a.by, "by", "", "who (recorded; default: OS user@host)")
		fs.StringVar(&a.toWM, "to-watermark", "", "restart from this watermark (RFC 3339) instead of from scratch")
	}
	for _, k := range ConfigKeys() {
		fs.Var(a.keyFlagFor(k), k, "configuration key "+k+" (env "+EnvName(k)+")")
	}
	if err := fs.Parse(args); err != nil {
		if isHelp(err) {
			commandHelp(a.stdout, cmd, fs)
			return err
		}
		return flagError(cmd, fs, err)
	}
	if fs.NArg() > 0 {
		return usageErrorf("unexpected argument %q; flags go before or after, values need a flag (see --help)", fs.Arg(0))
	}
	if cmd == "check" {
		kindSet := false
		fs.Visit(func(f *flag.Flag) { kindSet = kindSet || f.Name == "notify-trigger" })
		var err error
		if a.notifyTrig, err = postgres.ParseNotifyKind(a.notifyKind); err != nil {
			return usageErrorf("--notify-trigger %q: want one of %s", a.notifyKind, strings.Join(postgres.NotifyKinds, ", "))
		}
		if kindSet && !a.notifySQL {
			return usageErrorf("--notify-trigger chooses the trigger that --print-notify-sql prints: add --print-notify-sql")
		}
	}
	a.overrides = append(a.overrides, sets...)
	if a.logFormat != "" {
		a.overrides = append(a.overrides, "log.format="+a.logFormat)
	}
	if a.logLevel != "" {
		a.overrides = append(a.overrides, "log.level="+a.logLevel)
	}
	var uses []string // every key
	if cmd == "broker" {
		uses = brokerKeys // config.go
	}
	cfg, err := loadConfig(a.configPath, a.env, a.overrides, uses)
	if err != nil {
		return a.withUnknownEnv(err) // help.go
	}
	a.cfg = cfg
	a.log = newLogger(a.stderr, cfg.Log.Level, cfg.Log.Format)
	a.warnUnknownEnv() // help.go
	for _, w := range cfg.Warnings() {
		a.log.Warn(w)
	}
	if cfg.Sync.DedupeMaxEntries != 0 {
		a.log.Warn("sync.dedupe_max_entries is no longer used and is ignored: the dedupe set has no bound and lives in segments of the offsets topic (docs/design.md); remove the key")
	}
	return nil
}

func newLogger(w io.Writer, level, format string) *slog.Logger {
	var lv slog.Level
	_ = lv.UnmarshalText([]byte(level))
	opts := &slog.HandlerOptions{Level: lv, ReplaceAttr: durationAsText}
	if format == "json" || format != "text" && !isTerminal(w) {
		return slog.New(redactHandler{slog.NewJSONHandler(w, opts)}) // redact.go
	}
	return slog.New(redactHandler{slog.NewTextHandler(w, opts)})
}

// durationAsText writes a duration as a Go duration string ("1.5s"), not
// as slog's JSON nanoseconds.
func durationAsText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// isTerminal reports whether w is a terminal (a tty), as the terminal
// itself answers: /dev/null is a character device but no terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

func (a *cli) closeAll() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

// kafkaOpts returns the connection options, starting the embedded broker
// when no brokers are configured.
func (a *cli) kafkaOpts() ([]kgo.Opt, error) {
	if a.tasks != nil {
		return a.tasks.opts, nil // one embedded broker for every task (group.go)
	}
	brokers := a.cfg.Kafka.Brokers
	if len(brokers) == 0 {
		emb, addrs, err := startEmbedded(a.cfg.DataDir, a.cfg.Embedded.Listen, a.log)
		if err != nil {
			return nil, err
		}
		a.closers = append(a.closers, emb.Close)
		brokers = addrs
	} else if a.serve { // `run` only: see tuneGC
		tuneGC()
	}
	sec, err := a.securityOpts() // kafka.tls.*, kafka.sasl.* (security.go)
	if err != nil {
		return nil, err
	}
	return append([]kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ClientID("tidemark-" + a.cfg.Name)}, sec...), nil
}

func (a *cli) topics() producer.Topics {
	return producer.Topics{
		Data:              a.cfg.Kafka.Topic,
		Partitions:        a.cfg.Kafka.Partitions,
		ReplicationFactor: a.cfg.Kafka.ReplicationFactor,
		AllowNonCompacted: a.cfg.Kafka.AllowNonCompacted,
		Offsets:           a.cfg.Kafka.OffsetsTopic,
		Ledger:            a.ledgerTopic(),
		LedgerRetention:   a.ledgerRetention(),
	}
}

func (a *cli) pgConfig() (postgres.Config, error) {
	pw, err := a.cfg.Password(a.env)
	if err != nil {
		return postgres.Config{}, err
	}
	s := a.cfg.Source
	return postgres.Config{
		DSN: s.DSN, Password: pw, PasswordFile: s.PasswordFile, Schema: s.Schema, Table: s.Table,
		IDColumn: s.IDColumn, UpdatedAtColumn: s.UpdatedAtColumn, DeletedAtColumn: s.DeletedAtColumn,
		Columns: s.Columns, Filter: s.Filter, LoadWorkers: a.cfg.Sync.LoadWorkers,
	}, nil
}

// source opens the configured source.
func (a *cli) source(ctx context.Context) (connector.Source, error) {
	switch a.cfg.Source.Kind {
	case "postgres", "":
		pc, err := a.pgConfig()
		if err != nil {
			return nil, err
		}
		if err := a.checkDSN("source.dsn", pc.DSN); err != nil { // dsn.go
			return nil, err
		}
		if a.tasks != nil { // one pool per DSN for every task (group.go)
			pool, err := a.tasks.pool(ctx, pc)
			if err != nil {
				return nil, openError("source.dsn", pc.DSN, "open PostgreSQL source", err)
			}
			src, err := postgres.NewOnPool(ctx, pc, pool)
			if err != nil {
				return nil, openError("source.dsn", pc.DSN, "open PostgreSQL source", err)
			}
			return src, nil
		}
		src, err := postgres.New(ctx, pc)
		if err != nil {
			return nil, openError("source.dsn", pc.DSN, "open PostgreSQL source", err)
		}
		a.closers = append(a.closers, src.Close)
		return src, nil
	case "http":
		hc, err := a.httpConfig()
		if err != nil {
			return nil, err
		}
		src, err := httpsrc.New(hc)
		if err != nil {
			return nil, &ConfigError{Key: "source.http", Err: err}
		}
		return src, nil
	}
	return nil, &ConfigError{Key: "source.kind", Msg: fmt.Sprintf("source kind %q is not supported by this build; use postgres or http", a.cfg.Source.Kind)}
}

// store reads the checkpoint, failing closed: a missing checkpoint with
// evidence of earlier runs (ledger entries, records in the data topic) is a
// safety stop.
func (a *cli) store(opts []kgo.Opt) *offsets.Store {
	return offsets.NewStore(opts, a.cfg.Kafka.OffsetsTopic, a.cfg.Name).
		FailClosed(a.ledger(opts), a.cfg.Kafka.Topic)
}

func (a *cli) ledger(opts []kgo.Opt) *offsets.Ledger {
	return offsets.NewLedger(opts, a.ledgerTopic(), a.cfg.Name)
}

func (a *cli) writer(ctx context.Context, opts []kgo.Opt) (*producer.Writer, error) {
	w, err := producer.New(ctx, producer.Config{
		Name: a.cfg.Name, Topic: a.cfg.Kafka.Topic, OffsetsTopic: a.cfg.Kafka.OffsetsTopic, LedgerTopic: a.ledgerTopic(),
		TransactionTimeout: a.cfg.Kafka.TransactionTimeout.Duration, Opts: opts, Logger: a.log,
		Compression: compressionCodec(a.cfg.Kafka.Compression), Linger: a.cfg.Kafka.Linger.Duration,
		BatchMaxBytes: int32(min(a.cfg.Kafka.BatchMaxBytes, producer.MaxBatchBytes)),
	})
	if err != nil {
		return nil, err
	}
	a.closers = append(a.closers, w.Close)
	return w, nil
}

// compressionCodec is the client's codec for a kafka.compression value
// (Validate has checked it; "" is none).
func compressionCodec(name string) kgo.CompressionCodec {
	switch name {
	case "gzip":
		return kgo.GzipCompression()
	case "snappy":
		return kgo.SnappyCompression()
	case "lz4":
		return kgo.Lz4Compression()
	case "zstd":
		return kgo.ZstdCompression()
	}
	return kgo.NoCompression()
}

func (a *cli) engineConfig() connector.Config {
	sum, fields := a.cfg.Fingerprint()
	s := a.cfg.Sync
	margin := s.Margin.Duration
	if margin == 0 {
		margin = -1 // 0s in the file means no margin
	}
	lookback := a.cfg.Source.NotifyLookback.Duration
	if lookback == 0 {
		lookback = -1 // 0s in the file means none
	}
	retry := s.RetryTimeout.Duration
	if a.once || !a.serve { // serve: `run` (continuous or --once)
		retry = s.OnceRetryTimeout.Duration
	}
	return connector.Config{
		Name:                    a.cfg.Name,
		PageSize:                s.PageSize,
		Margin:                  margin,
		PollInterval:            s.PollInterval.Duration,
		PollJitter:              s.PollJitter,
		HeadLookback:            lookback,
		TxnMaxRecords:           s.TxnMaxRecords,
		TxnMaxBytes:             s.TxnMaxBytes,
		TxnMaxDuration:          s.TxnMaxDuration.Duration,
		TxnTimeout:              a.cfg.Kafka.TransactionTimeout.Duration,
		RetryTimeout:            retry,
		Horizon:                 a.cfg.Source.Horizon,
		SweepInterval:           a.cfg.Sweep.Interval.Duration,
		SweepMaxKeys:            a.sweepMaxKeys(),
		SweepMemory:             gcLimit.sweep,
		Consistent:              a.cfg.Source.InitialLoad == "consistent",
		LoadWorkers:             s.LoadWorkers,
		RepublishOnSchemaChange: a.cfg.Source.OnSchemaChange == "republish",
		Fingerprint:             sum,
		FingerprintFields:       fields,
		Logger:                  a.log,
	}
}

// sweepMaxKeys is sweep.max_keys_in_memory for connector.Compare, where 0
// means the default and a negative value always by buckets.
func (a *cli) sweepMaxKeys() int {
	if n := a.cfg.Sweep.MaxKeysInMemory; n > 0 {
		return n
	}
	return -1
}

// tuneGC lets the heap of `run` grow to 4x its live size between
// collections (GOGC=300) unless GOGC is set: the live heap of a connector is
// small (a transaction's records and the dedupe set; about 30 MiB in make
// bench), and collecting at 2x cost a quarter of an initial load's CPU. A
// soft limit of 256 MiB (unless GOMEMLIMIT is set), at most 80% of the
// container's, keeps that growth in bounds; while a sweep runs, gcLimit
// raises it by the sweep's key set. Not with the embedded broker, whose
// heap holds the whole topic.
func tuneGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(300)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		gcLimit.start(256<<20, containerMemory())
	}
}

// gcLimit is run's soft memory limit.
var gcLimit = &memLimit{set: func(n int64) { debug.SetMemoryLimit(n) }}

// memLimit is a soft memory limit that makes room for the key set of each
// sweep while it runs: a limit of 256 MiB in all sat just above the
// default sweep budget's 212 MiB, so a sweep that filled it kept the
// collector running. Only a limit tidemark set (start) is moved.
type memLimit struct {
	set func(int64)

	mu                sync.Mutex
	on                bool
	base, cap, sweeps int64
}

func (m *memLimit) start(base, container int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.on, m.base, m.cap = true, base, 0
	if container > 0 {
		m.cap = container / 5 * 4 // collecting more often beats being killed
	}
	m.apply()
}

func (m *memLimit) apply() {
	lim := m.base + m.sweeps
	if m.cap > 0 {
		lim = min(lim, m.cap)
	}
	m.set(lim)
}

// sweep makes room for a sweep of up to keys live keys (about 56 bytes
// each, docs/deletes.md "Memory limits"; 64 counted) until the func it
// returns is called (connector.Config.SweepMemory).
func (m *memLimit) sweep(keys int) (release func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.on {
		return func() {}
	}
	add := min(int64(keys), 1<<34) * 64
	m.sweeps += add
	m.apply()
	return func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.sweeps -= add
		m.apply()
	}
}

// containerMemory is the memory limit of the process's cgroup (v2
// memory.max, else v1 memory.limit_in_bytes), or 0 when there is none or it
// cannot be read.
func containerMemory() int64 {
	for _, f := range []string{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || n <= 0 || n >= 1<<62 { // "max", or v1's page-rounded "unlimited"
			return 0
		}
		return n
	}
	return 0
}

func (a *cli) ledgerTopic() string { return a.cfg.Kafka.LedgerTopic }

func (a *cli) ledgerRetention() time.Duration { return a.cfg.Kafka.LedgerRetention.Duration }
