package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tidemark/tidemark/connector/httpsrc"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/producer"
)

// Config is tidemark's configuration. It comes from a YAML file, then
// TIDEMARK_* environment variables, then command-line overrides, in that
// order of precedence (see LoadConfig). Every key, its unit and its default is
// documented in tidemark.example.yaml.
type Config struct {
	// Name is the connector's name. It derives the Kafka transactional id,
	// keys the checkpoint in the offsets topic and is sent in the connector
	// header of every record. Required; [a-zA-Z0-9._-]{1,200}.
	Name string `yaml:"name"`
	// DataDir is where the embedded in-process broker keeps its data when
	// kafka.brokers is empty. Default "./tidemark-data".
	DataDir string       `yaml:"data_dir"`
	Source  SourceConfig `yaml:"source"`
	Kafka   KafkaConfig  `yaml:"kafka"`
	Sync    SyncConfig   `yaml:"sync"`
	Sweep   SweepConfig  `yaml:"sweep"`
	Log     LogConfig    `yaml:"log"`
	// Metrics configures the HTTP server for /metrics, /healthz and
	// /readyz (serve.go).
	Metrics MetricsConfig `yaml:"metrics"`
	// Embedded configures the embedded broker (embedded.go).
	Embedded EmbeddedConfig `yaml:"embedded"`
	// Group configures the consumer group that the processes of a
	// configuration with tables form (tasks.go).
	Group GroupConfig `yaml:"group"`

	// Tasks are the tables of a `tables:` list, sorted by task name, each
	// with its whole configuration (tasks.go). Empty for a single-table
	// configuration.
	Tasks []Task `yaml:"-"`

	// origin maps each dotted key set explicitly (by the file, the
	// environment or an override) to where it was set: "tidemark.yaml:12",
	// "env TIDEMARK_SOURCE_TABLE", "command line". ApplyDefaults leaves an
	// explicit zero alone (margin: 0s means no margin), and errors name the
	// origin.
	origin map[string]string
}

// SourceConfig describes the upstream delta feed.
type SourceConfig struct {
	// Kind is "postgres" (default): a PostgreSQL table read with pgx; or
	// "http": a cursor-paginated HTTP changes API whose URL is DSN.
	Kind string `yaml:"kind"`
	// DSN is the PostgreSQL connection string, URL form
	// (postgres://user@host:5432/db?sslmode=require) or keyword form
	// (host=... dbname=...), or for kind http the changes API URL. It may hold
	// ${VARS}. It is a secret: it is never printed unredacted (RedactDSN).
	// Required.
	DSN string `yaml:"dsn" tidemark:"secret"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `yaml:"password_env"`
	// PasswordFile is a file holding the password; one trailing newline is
	// trimmed.
	PasswordFile string `yaml:"password_file"`
	// Schema is the table's schema. Default "public". Postgres only.
	Schema string `yaml:"schema"`
	// Table is the table to stream. Required for postgres.
	Table string `yaml:"table"`
	// IDColumn is the row id column: unique, NOT NULL, bigint, integer,
	// smallint, text, varchar or uuid. Default "id". Postgres only.
	IDColumn string `yaml:"id_column"`
	// UpdatedAtColumn is a timestamptz NOT NULL column changed on every
	// write. Default "updated_at". Postgres only.
	UpdatedAtColumn string `yaml:"updated_at_column"`
	// DeletedAtColumn, when set, is a nullable timestamptz column; a row with
	// it set is published as a tombstone (soft delete). Default none.
	DeletedAtColumn string `yaml:"deleted_at_column"`
	// Columns limits the columns published in the record value, in this
	// order. Default: all columns of the table.
	Columns []string `yaml:"columns"`
	// Filter is an SQL boolean expression ANDed into every read, spliced into
	// the query verbatim. It is the one documented exception to "no
	// configuration value is ever spliced into SQL". Default none.
	Filter string `yaml:"filter"`
	// Horizon enables horizon mode: the watermark never passes the start of
	// the oldest transaction still open in the database. Needs the
	// pg_read_all_stats role. Default false. Postgres only.
	Horizon bool `yaml:"horizon"`
	// InitialLoad is "moving" (default: the first pass walks the live table)
	// or "consistent" (the first pass runs in one REPEATABLE READ READ ONLY
	// transaction). Consistent is postgres only.
	InitialLoad string `yaml:"initial_load"`
	// OnSchemaChange says what a change of the table's columns does besides
	// being logged and counted: "continue" (default: records from the next
	// pass on carry the new shape) or "republish" (also republish, once,
	// every row whose record now differs, through the sweep).
	// docs/schema-changes.md. Postgres only.
	OnSchemaChange string `yaml:"on_schema_change"`
	// Notify is the channel `tidemark run` LISTENs on for change
	// notifications: one starts a pass at once instead of waiting for the
	// poll, which stays as the safety net. The trigger that sends them is
	// printed by `tidemark check --print-notify-sql` for the operator to
	// install (notify.go; docs/operating.md, "Change notifications").
	// Default "" (off). Postgres only.
	Notify string `yaml:"notify"`
	// NotifyMinGap is the least time between the start of a pass and the
	// start of a pass a notification starts: under a steady stream of
	// writes, passes come at most this often, and back to back when they
	// take longer. Default 20ms. Postgres only.
	NotifyMinGap Duration `yaml:"notify_min_gap"`
	// NotifyLookback is how far below the watermark a pass started by a
	// notification (a head pass) reads, so that a row whose transaction
	// commits at most this long after its updated_at is published by the
	// next such pass even when rows dated after it were published first,
	// instead of waiting for the next full pass (docs/design.md, "Head
	// passes"). Default 100ms; 0s means none; at most sync.margin.
	// Postgres only.
	NotifyLookback Duration `yaml:"notify_lookback"`
	// HTTP configures kind http; the endpoint URL is DSN. HTTP only.
	HTTP HTTPSourceConfig `yaml:"http,omitempty"`
}

// HTTPSourceConfig describes a cursor-paginated HTTP changes API (kind
// http). Empty values take the defaults of connector/httpsrc.Config, where
// each key is documented; JSON paths are dot-separated object keys.
type HTTPSourceConfig struct {
	// SinceParam, CursorParam, LimitParam name the query parameters.
	// Defaults since, cursor, limit.
	SinceParam  string `yaml:"since_param"`
	CursorParam string `yaml:"cursor_param"`
	LimitParam  string `yaml:"limit_param"`
	// MaxLimit caps the limit sent (sync.page_size otherwise). Default 0:
	// no cap. The reference feed allows at most 500.
	MaxLimit int `yaml:"max_limit"`
	// ItemsPath, IDPath, UpdatedAtPath [fingerprint]: the items array and,
	// in each item, the id and the RFC 3339 change time. Defaults items,
	// id, updated_at.
	ItemsPath     string `yaml:"items_path"`
	IDPath        string `yaml:"id_path"`
	UpdatedAtPath string `yaml:"updated_at_path"`
	// DeletedPath (a boolean) and DeletedAtPath (a timestamp or null) mark
	// deletions [fingerprint]. Default none.
	DeletedPath   string `yaml:"deleted_path"`
	DeletedAtPath string `yaml:"deleted_at_path"`
	// ValuePath is the part of the item published as the value
	// [fingerprint]. Default "": the whole item.
	ValuePath string `yaml:"value_path"`
	// Pagination is cursor (default: next cursor in the body) or link (RFC
	// 8288 Link rel="next").
	Pagination string `yaml:"pagination"`
	// NextCursorPath and HasMorePath locate next_cursor (default
	// next_cursor) and has_more (default none) in the body.
	NextCursorPath string `yaml:"next_cursor_path"`
	HasMorePath    string `yaml:"has_more_path"`
	// AuthHeader names a header sent with every request (e.g.
	// Authorization); its value comes from AuthValueEnv or AuthValueFile
	// and is never printed.
	AuthHeader    string `yaml:"auth_header"`
	AuthValueEnv  string `yaml:"auth_value_env"`
	AuthValueFile string `yaml:"auth_value_file"`
	// RejectStatuses and RejectCodes recognise a rejected cursor (a safety
	// stop, exit 3); ErrorCodePath locates the error code. Defaults 400,410;
	// the reference feed's cursor codes; error.code.
	RejectStatuses []string `yaml:"reject_statuses"`
	RejectCodes    []string `yaml:"reject_codes"`
	ErrorCodePath  string   `yaml:"error_code_path"`
	// RequestTimeout bounds one request. Default 30s.
	RequestTimeout Duration `yaml:"request_timeout"`
	// MaxRetries is how often one page is retried (429, 5xx, connection
	// errors) before the run's own retry takes over. Default 8.
	MaxRetries int `yaml:"max_retries"`
	// MaxRetryAfter caps an honoured Retry-After. Default 5m.
	MaxRetryAfter Duration `yaml:"max_retry_after"`
	// MaxEmptyPages is how many pages in a row without items but with more
	// to come are waited out (with backoff) before a safety stop: the
	// server makes no progress. Default 20.
	MaxEmptyPages int `yaml:"max_empty_pages"`
}

// KafkaConfig describes the destination cluster and topics.
type KafkaConfig struct {
	// Brokers are host:port seed brokers. Empty (default) runs an embedded
	// in-process broker under data_dir. The environment variable
	// KAFKA_BROKERS (comma-separated) also sets it, below
	// TIDEMARK_KAFKA_BROKERS in precedence.
	Brokers []string `yaml:"brokers"`
	// Topic is the compacted data topic. Default source.table.
	Topic string `yaml:"topic"`
	// TopicPrefix starts the topic name of each table of a `tables:` list:
	// <topic_prefix><schema>.<table>, as Kafka Connect and Debezium name
	// them. Default "". Only with tables.
	TopicPrefix string `yaml:"topic_prefix"`
	// OffsetsTopic is the compacted, single-partition topic holding
	// checkpoints. Default "tidemark-offsets".
	OffsetsTopic string `yaml:"offsets_topic"`
	// LedgerTopic is the audit ledger: one entry per run start, committed
	// transaction and operator reset, written in the same transactions as
	// the data; one partition, time-based retention. It lets tidemark detect
	// a lost or inconsistent checkpoint. Default "tidemark-ledger".
	LedgerTopic string `yaml:"ledger_topic"`
	// LedgerRetention is how long ledger entries are kept (retention.ms of
	// the ledger topic when tidemark creates it). Default 168h (7 days).
	LedgerRetention Duration `yaml:"ledger_retention"`
	// Partitions of the data topic when tidemark creates it. Default 6.
	Partitions int32 `yaml:"partitions"`
	// ReplicationFactor of topics tidemark creates; -1 (default) means the
	// broker's default.
	ReplicationFactor int16 `yaml:"replication_factor"`
	// AllowNonCompacted permits an existing data topic whose cleanup.policy
	// is not compact. Default false.
	AllowNonCompacted bool `yaml:"allow_non_compacted"`
	// TransactionTimeout is the Kafka transaction timeout; the broker aborts
	// a transaction open longer than this. Must exceed sync.txn_max_duration
	// and not exceed the broker's transaction.max.timeout.ms (15m by
	// default). Default 60s.
	TransactionTimeout Duration `yaml:"transaction_timeout"`
	// Compression is the codec of the record batches tidemark produces:
	// none, gzip, snappy, lz4 or zstd (the Java client's compression.type).
	// A batch that the codec would not make smaller goes uncompressed.
	// Default lz4 (docs/operating.md, "Producer settings").
	Compression string `yaml:"compression"`
	// Linger is how long a partition's batch waits for more records before
	// it is sent (the Java client's linger.ms); a commit sends what waits at
	// once. Default 0s, 0s..1s.
	Linger Duration `yaml:"linger"`
	// BatchMaxBytes caps one record batch of the data topic, counted before
	// compression; a record larger than it cannot be produced. Default and
	// maximum producer.MaxBatchBytes (1000012, Kafka's default
	// max.message.bytes); the offsets and ledger topics always use that
	// maximum. The Java mapping (batch.size, max.request.size) is in
	// docs/operating.md, "Producer settings".
	BatchMaxBytes int64 `yaml:"batch_max_bytes" tidemark:"bytes"`
	// TLS and SASL secure the broker connections (security.go).
	TLS  KafkaTLSConfig  `yaml:"tls"`
	SASL KafkaSASLConfig `yaml:"sasl"`
}

// SyncConfig tunes the walk. None of it is part of the fingerprint.
type SyncConfig struct {
	// PageSize is the number of rows per page (LIMIT). Default 1000,
	// 1..100000.
	PageSize int `yaml:"page_size"`
	// Margin is the safety margin M: a pass starts at watermark - M. Default
	// 10s, >= 0.
	Margin Duration `yaml:"margin"`
	// PollInterval is, once the end is reached, the time from the start of
	// one pass to the start of the next (with source.notify, the pause
	// after a pass before the next full pass). Default 1s.
	PollInterval Duration `yaml:"poll_interval"`
	// PollJitter is the random fraction (0..1) by which each poll interval
	// is shortened, never lengthened. Default 0.2.
	PollJitter float64 `yaml:"poll_jitter"`
	// TxnMaxRecords bounds the records of one Kafka transaction; a
	// transaction holds at least one page. Default 10000.
	TxnMaxRecords int `yaml:"txn_max_records"`
	// TxnMaxBytes bounds the record bytes of one transaction. Accepts a
	// number of bytes or a size such as "16MiB" or "500kB". Default 16MiB.
	TxnMaxBytes int64 `yaml:"txn_max_bytes" tidemark:"bytes"`
	// TxnMaxDuration bounds how long one transaction collects pages before it
	// commits. Default 5s.
	TxnMaxDuration Duration `yaml:"txn_max_duration"`
	// RetryTimeout is how long `tidemark run` retries transient failures
	// (the database, the broker, the HTTP feed not answering) in a row,
	// with no commit between them, before it gives up with exit 1; at
	// start-up too. 0s (the default) retries without limit: the outage
	// shows on /readyz and in the retry metrics and alerts.
	RetryTimeout Duration `yaml:"retry_timeout"`
	// OnceRetryTimeout is the same bound for `run --once` and the other
	// commands that run once (sweep, ...). Default 5m; 0s is no limit.
	OnceRetryTimeout Duration `yaml:"once_retry_timeout"`
	// LoadWorkers, when positive, reads the initial load in id order
	// instead of (updated_at, id) order, split into id ranges that this
	// many database sessions read side by side (docs/design.md, "The
	// initial load in key order"); with source.initial_load consistent
	// they share one exported snapshot. The pool holds them and two more
	// connections. 0 (default) loads as a pass from minus infinity.
	// PostgreSQL only; 0..64.
	LoadWorkers int `yaml:"load_workers"`
	// DedupeMaxEntries is no longer used: the dedupe set has no bound
	// (docs/design.md, "The dedupe set"). It is still accepted so that
	// older files load, with a warning when set.
	DedupeMaxEntries int `yaml:"dedupe_max_entries"`
}

// SweepConfig schedules the reconciliation sweep that publishes tombstones
// for hard-deleted rows and repairs keys the topic lacks or holds stale.
type SweepConfig struct {
	// Interval runs a sweep between passes of `tidemark run` whenever this
	// much time has passed since the last one. 0s (default) = only on
	// demand with `tidemark sweep`. A table without a soft-delete column
	// needs it to propagate deletes.
	Interval Duration `yaml:"interval"`
	// MaxKeysInMemory is the memory budget of a sweep and of verify, in
	// live topic keys held at once (some 56 bytes each: the default
	// 4000000 is about 212 MiB). A topic that may hold more (its record
	// count exceeds it) is compared by buckets: per-bucket digests first,
	// then key by key only where they differ, at the cost of extra reads of
	// the topic and the table. 0 = always by buckets.
	MaxKeysInMemory int `yaml:"max_keys_in_memory"`
}

// LogConfig configures logging.
type LogConfig struct {
	// Level is debug, info (default), warn or error.
	Level string `yaml:"level"`
	// Format is auto (default: text on a terminal, JSON otherwise), text or
	// json.
	Format string `yaml:"format"`
}

// Duration is a time.Duration written as a Go duration string: "10s",
// "500ms", "1m30s".
type Duration struct{ time.Duration }

// UnmarshalText parses a Go duration string.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("%q is not a duration; write a number with a unit, e.g. 10s, 500ms, 2m", string(b))
	}
	d.Duration = v
	return nil
}

// MarshalText formats d as a Go duration string.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.String()), nil }

// ConfigError is a problem with the configuration or the command line. The
// CLI exits with code 2 on it. Its message never contains a secret.
type ConfigError struct {
	// Key is the dotted key ("sync.page_size"), or "" when the problem is not
	// about one key.
	Key string
	// Origin says where the value came from: "tidemark.yaml:12",
	// "env TIDEMARK_SYNC_PAGE_SIZE", "command line"; "" for a default.
	Origin string
	// Msg says what is wrong and how to fix it.
	Msg string
	// Err is the underlying cause, if any.
	Err error
	// Credentials marks a refused login or a secret that cannot be read:
	// what a rotation changes under a running process, unlike the rest of
	// the configuration (a lacking grant or ACL is not one of them).
	Credentials bool
}

// credentialsError reports whether err is a ConfigError about credentials.
func credentialsError(err error) bool {
	var ce *ConfigError
	return errors.As(err, &ce) && ce.Credentials
}

func (e *ConfigError) Error() string {
	var b strings.Builder
	if e.Origin != "" {
		b.WriteString(e.Origin)
		b.WriteString(": ")
	}
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Err != nil {
		if e.Msg != "" {
			b.WriteString(": ")
		}
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

func (e *ConfigError) Unwrap() error { return e.Err }

// originCommandLine is the origin of values given as overrides.
const originCommandLine = "command line"

// defaults holds the default of every key that has one, in the syntax of the
// file. kafka.topic defaults to source.table (see ApplyDefaults).
var defaults = map[string]string{
	"data_dir":                  "./tidemark-data",
	"source.kind":               "postgres",
	"source.schema":             "public",
	"source.id_column":          "id",
	"source.updated_at_column":  "updated_at",
	"source.initial_load":       "moving",
	"source.on_schema_change":   "continue",
	"source.notify_min_gap":     "20ms",
	"source.notify_lookback":    "100ms",
	"kafka.offsets_topic":       "tidemark-offsets",
	"group.session_timeout":     "45s",
	"group.rebalance_timeout":   "60s",
	"kafka.ledger_topic":        "tidemark-ledger",
	"kafka.ledger_retention":    "168h",
	"kafka.partitions":          "6",
	"kafka.replication_factor":  "-1",
	"kafka.transaction_timeout": "60s",
	"kafka.compression":         "lz4",
	"kafka.linger":              "0s",
	"kafka.batch_max_bytes":     "1000012",
	"sync.page_size":            "1000",
	"sync.margin":               "10s",
	"sync.poll_interval":        "1s",
	"sync.poll_jitter":          "0.2",
	"sync.txn_max_records":      "10000",
	"sync.load_workers":         "0",
	"sync.txn_max_bytes":        "16MiB",
	"sync.txn_max_duration":     "5s",
	"sync.retry_timeout":        "0s",
	"sync.once_retry_timeout":   "5m",
	"sweep.interval":            "0s",
	"sweep.max_keys_in_memory":  "4000000",
	"log.level":                 "info",
	"log.format":                "auto",
}

// postgresOnly are the keys that only a postgres source uses. Their defaults
// apply only to kind postgres, and setting them with kind http is an error.
var postgresOnly = []string{
	"source.password_env", "source.password_file", "source.schema", "source.table",
	"source.id_column", "source.updated_at_column", "source.deleted_at_column",
	"source.columns", "source.filter", "source.horizon",
	"source.notify", "source.notify_min_gap", "source.notify_lookback",
}

// ConfigDefault returns the default of a dotted key as it would be written in
// the file, and whether the key has a fixed default.
func ConfigDefault(key string) (string, bool) {
	v, ok := defaults[key]
	return v, ok
}

// ConfigKeys lists every dotted configuration key ("source.table",
// "sync.page_size", ...) in file order, so the CLI can register a flag for
// each.
func ConfigKeys() []string {
	fs := configFields()
	keys := make([]string, len(fs.leaves))
	for i, f := range fs.leaves {
		keys[i] = f.key
	}
	return keys
}

// EnvName returns the environment variable that overrides a dotted key:
// "TIDEMARK_" + the key uppercased with dots turned into underscores
// (source.table -> TIDEMARK_SOURCE_TABLE).
func EnvName(key string) string {
	return "TIDEMARK_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}

// LoadConfig builds the configuration, each layer overriding the one before:
//
//  1. the YAML file at path ("" = no file). Keys are strict: an unknown key
//     is an error naming its line and the closest known key. ${VAR} and
//     ${VAR:-default} in values are expanded from env (default used when VAR
//     is unset or empty; an unset VAR without default is an error; $${ is a
//     literal ${);
//  2. KAFKA_BROKERS (comma-separated), then TIDEMARK_<KEY> for every key
//     (EnvName; lists comma-separated; empty variables are ignored);
//  3. overrides, each "dotted.key=value" (lists comma-separated).
//
// It then applies defaults and validates. env nil means os.Getenv. Every
// error is a *ConfigError, joined with errors.Join when there are several.
func LoadConfig(path string, env func(string) string, overrides []string) (*Config, error) {
	return loadConfig(path, env, overrides, nil)
}

// brokerKeys are the keys `tidemark broker` uses: it serves the embedded
// broker's data, and needs no name, source or topic.
var brokerKeys = []string{"data_dir", "embedded.listen", "kafka.brokers", "log.level", "log.format"}

// loadConfig is LoadConfig, validating only the keys in uses when uses is
// not nil (and then not building the tasks of a tables: list). What the
// file, the environment and the overrides set is still checked as always:
// unknown keys, values that do not parse.
func loadConfig(path string, env func(string) string, overrides []string, uses []string) (*Config, error) {
	if env == nil {
		env = os.Getenv
	}
	l := &loader{c: &Config{origin: map[string]string{}}, env: env, file: path}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, &ConfigError{Msg: "read config file", Err: err}
		}
		l.loadYAML(b)
		if l.unreadable {
			// Every key the file sets would be reported missing too: say
			// only what is wrong with the file.
			return nil, errors.Join(l.errs...)
		}
	}
	if v := env("KAFKA_BROKERS"); v != "" {
		l.set("kafka.brokers", v, "env KAFKA_BROKERS")
	}
	for _, f := range configFields().leaves {
		name := EnvName(f.key)
		if v := env(name); v != "" {
			l.set(f.key, v, "env "+name)
		}
	}
	for _, o := range overrides {
		key, val, ok := strings.Cut(o, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			l.fail(&ConfigError{Origin: originCommandLine, Msg: fmt.Sprintf("override %q is not key=value (e.g. source.table=orders)", o)})
			continue
		}
		if configFields().sections[key] {
			l.fail(&ConfigError{Origin: originCommandLine, Key: key, Msg: fmt.Sprintf("is a section; set one of its keys, e.g. %s.%s", key, firstLeaf(key))})
			continue
		}
		if configFields().byKey[key] == nil {
			l.fail(&ConfigError{Origin: originCommandLine, Key: key, Msg: unknownKeyMsg(key, false)})
			continue
		}
		l.set(key, val, originCommandLine)
	}
	if l.tables != nil && uses == nil {
		return l.loadTasks() // tasks.go
	}
	c := l.c
	c.ApplyDefaults()
	// Report load and validation problems together; a key that failed to
	// load is not also reported as invalid.
	failed := map[string]bool{}
	for _, err := range l.errs {
		var ce *ConfigError
		if errors.As(err, &ce) && ce.Key != "" {
			failed[ce.Key] = true
		}
	}
	errs := l.errs
	if err := c.Validate(); err != nil {
		for _, e := range unjoin(err) {
			var ce *ConfigError
			if errors.As(e, &ce) && failed[ce.Key] {
				continue
			}
			if key, _, _ := strings.Cut(ce.Key, "["); uses != nil && !slices.Contains(uses, key) {
				continue // a key this command does not use
			}
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return c, nil
}

// unjoin returns the errors joined in err.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// ApplyDefaults fills every unset key that has a default. A key set
// explicitly to zero by LoadConfig (sync.margin: 0s, sync.poll_jitter: 0)
// keeps its zero; an empty string or list always
// means the default. Postgres-only defaults apply only to kind postgres, and
// kafka.topic defaults to source.table.
func (c *Config) ApplyDefaults() {
	fs := configFields()
	kind := c.Source.Kind
	if kind == "" {
		kind = defaults["source.kind"]
	}
	for _, f := range fs.leaves {
		def, ok := defaults[f.key]
		if !ok {
			continue
		}
		if kind != "postgres" && slices.Contains(postgresOnly, f.key) {
			continue
		}
		v := f.value(c)
		if !v.IsZero() {
			continue
		}
		if _, explicit := c.origin[f.key]; explicit && v.Kind() != reflect.String {
			continue
		}
		if err := f.set(c, def); err != nil {
			panic("tidemark: bad default for " + f.key + ": " + err.Error())
		}
	}
	if c.Kafka.Topic == "" && kind == "postgres" {
		c.Kafka.Topic = c.Source.Table
	}
}

var (
	nameRE  = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,200}$`)
	topicRE = regexp.MustCompile(`^[a-zA-Z0-9._-]{1,249}$`)
	// urlFormRE matches a connection string in URL form (scheme://...).
	urlFormRE = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*://`)
)

// Validate reports every problem of c at once, joined with errors.Join, each
// a *ConfigError naming the key and the fix. Call ApplyDefaults first.
func (c *Config) Validate() error {
	p := &problems{c: c}
	with := func(key string) string {
		if d, ok := defaults[key]; ok {
			return " (default " + d + ")"
		}
		return ""
	}

	if c.Name == "" {
		p.add("name", "required; it names the connector (transactional id, checkpoint key, connector header), e.g. name: orders-to-kafka")
	} else if !nameRE.MatchString(c.Name) {
		p.add("name", "%q is not a valid name; use 1..200 of a-z A-Z 0-9 . _ -", c.Name)
	}
	if c.DataDir == "" && len(c.Kafka.Brokers) == 0 {
		p.add("data_dir", "required when kafka.brokers is empty (the embedded broker keeps its data there)%s", with("data_dir"))
	}

	s := &c.Source
	switch s.Kind {
	case "postgres":
		p.identifier("source.schema", s.Schema, true)
		p.identifier("source.table", s.Table, true)
		p.identifier("source.id_column", s.IDColumn, true)
		p.identifier("source.updated_at_column", s.UpdatedAtColumn, true)
		p.identifier("source.deleted_at_column", s.DeletedAtColumn, false)
		if s.IDColumn != "" && s.IDColumn == s.UpdatedAtColumn {
			p.add("source.updated_at_column", "is the same column as source.id_column (%q); name the timestamptz column changed on every write", s.IDColumn)
		}
		if s.DeletedAtColumn != "" && (s.DeletedAtColumn == s.IDColumn || s.DeletedAtColumn == s.UpdatedAtColumn) {
			p.add("source.deleted_at_column", "%q is already source.id_column or source.updated_at_column; name the nullable timestamptz soft-delete column, or remove the key", s.DeletedAtColumn)
		}
		seen := map[string]bool{}
		for i, col := range s.Columns {
			key := fmt.Sprintf("source.columns[%d]", i)
			if col == "" {
				p.addKey("source.columns", key, "empty column name; remove it")
				continue
			}
			p.identifier("source.columns", col, true)
			if seen[col] {
				p.addKey("source.columns", key, "column %q is listed twice; list each column once", col)
			}
			seen[col] = true
		}
		for _, f := range configFields().leaves {
			if strings.HasPrefix(f.key, "source.http.") && !f.value(c).IsZero() {
				p.add(f.key, "only used with source.kind http; remove it (source.kind is postgres)")
			}
		}
		if strings.TrimSpace(s.DSN) == "" {
			p.add("source.dsn", "required; e.g. postgres://tidemark@db.example.com:5432/shop?sslmode=require (put the password in source.password_env or source.password_file)")
		} else if msg := checkPostgresDSN(s.DSN); msg != "" {
			p.add("source.dsn", "%s", msg)
		}
	case "http":
		for _, key := range postgresOnly {
			if !configFields().byKey[key].value(c).IsZero() {
				p.add(key, "only used with source.kind postgres; remove it (source.kind is http)")
			}
		}
		if c.Sweep.Interval.Duration > 0 {
			p.add("sweep.interval", "an HTTP source cannot be swept (it cannot list its live rows); remove it, or set 0s%s", with("sweep.interval"))
		}
		if s.OnSchemaChange == "republish" {
			p.add("source.on_schema_change", "republish runs a sweep, which an HTTP source cannot do; use continue%s", with("source.on_schema_change"))
		}
		if s.DSN == "" {
			p.add("source.dsn", "required for source.kind http: the changes API URL, e.g. https://api.example.com/v1/changes")
		} else if u, err := url.Parse(s.DSN); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			p.add("source.dsn", "not an http(s) URL with a host; use e.g. https://api.example.com/v1/changes (percent-encode special characters)")
		}
		if c.Kafka.Topic == "" {
			p.add("kafka.topic", "required for source.kind http (it defaults to source.table only for postgres)")
		}
		h := &s.HTTP
		if h.Pagination != "" && h.Pagination != "cursor" && h.Pagination != "link" {
			p.add("source.http.pagination", "%q is not a pagination; use cursor (next cursor in the body) or link (Link rel=\"next\")", h.Pagination)
		}
		if h.AuthValueEnv != "" && h.AuthValueFile != "" {
			p.add("source.http.auth_value_file", "source.http.auth_value_env and source.http.auth_value_file are both set; keep one")
		}
		if (h.AuthHeader == "") != (h.AuthValueEnv == "" && h.AuthValueFile == "") {
			p.add("source.http.auth_header", "auth_header and one of auth_value_env or auth_value_file go together; set both or neither")
		}
		for i, st := range h.RejectStatuses {
			if n, err := strconv.Atoi(st); err != nil || n < 400 || n > 499 {
				p.addKey("source.http.reject_statuses", fmt.Sprintf("source.http.reject_statuses[%d]", i), "%q is not a 4xx status; list e.g. 400, 410 (5xx are retried)", st)
			}
		}
		if h.MaxLimit < 0 || h.MaxRetries < 0 || h.RequestTimeout.Duration < 0 || h.MaxRetryAfter.Duration < 0 || h.MaxEmptyPages < 0 {
			p.add("source.http", "max_limit, max_retries, request_timeout, max_retry_after and max_empty_pages must not be negative (0 means the default)")
		}
	default:
		p.add("source.kind", "%q is not a source kind; use postgres or http%s", s.Kind, with("source.kind"))
	}
	switch s.InitialLoad {
	case "moving":
	case "consistent":
		if s.Kind == "http" {
			p.add("source.initial_load", "consistent needs a postgres snapshot; use moving with source.kind http")
		}
	default:
		p.add("source.initial_load", "%q is not an initial load mode; use moving or consistent%s", s.InitialLoad, with("source.initial_load"))
	}
	switch s.OnSchemaChange {
	case "continue", "republish":
	default:
		p.add("source.on_schema_change", "%q is not a choice; use continue or republish%s", s.OnSchemaChange, with("source.on_schema_change"))
	}
	if s.PasswordEnv != "" && s.PasswordFile != "" {
		p.add("source.password_file", "source.password_env and source.password_file are both set; keep one")
	}
	if (s.PasswordEnv != "" || s.PasswordFile != "") && dsnHasPassword(s.DSN) {
		p.add("source.dsn", "holds a password and source.password_env or source.password_file is set too; keep one (remove the password from the DSN)")
	}

	k := &c.Kafka
	for i, b := range k.Brokers {
		key := fmt.Sprintf("kafka.brokers[%d]", i)
		host, port, err := net.SplitHostPort(strings.TrimSpace(b))
		if err != nil || host == "" {
			p.addKey("kafka.brokers", key, "%q is not host:port; write e.g. localhost:9092", b)
			continue
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			p.addKey("kafka.brokers", key, "%q has no valid port; use 1..65535, e.g. localhost:9092", b)
		}
	}
	if k.Topic != "" || s.Kind != "postgres" || s.Table != "" {
		p.topic("kafka.topic", k.Topic) // else it defaults to the missing source.table, reported above
	}
	p.topic("kafka.offsets_topic", k.OffsetsTopic)
	p.topic("kafka.ledger_topic", k.LedgerTopic)
	if k.Topic != "" && k.Topic == k.OffsetsTopic {
		p.add("kafka.offsets_topic", "is the data topic %q too; use a separate topic%s", k.Topic, with("kafka.offsets_topic"))
	}
	if k.LedgerTopic != "" && (k.LedgerTopic == k.Topic || k.LedgerTopic == k.OffsetsTopic) {
		p.add("kafka.ledger_topic", "%q is already the data or offsets topic; use a separate topic%s", k.LedgerTopic, with("kafka.ledger_topic"))
	}
	if k.LedgerRetention.Duration < time.Hour {
		p.add("kafka.ledger_retention", "%s is too short; use 1h or more%s", k.LedgerRetention, with("kafka.ledger_retention"))
	}
	if k.Partitions < 1 {
		p.add("kafka.partitions", "%d is out of range; use 1 or more%s", k.Partitions, with("kafka.partitions"))
	}
	if k.ReplicationFactor == 0 || k.ReplicationFactor < -1 {
		p.add("kafka.replication_factor", "%d is out of range; use 1 or more, or -1 for the broker default%s", k.ReplicationFactor, with("kafka.replication_factor"))
	}
	if k.TransactionTimeout.Duration <= 0 {
		p.add("kafka.transaction_timeout", "%s is out of range; use a positive duration%s", k.TransactionTimeout, with("kafka.transaction_timeout"))
	}
	if !slices.Contains(compressionCodecs, k.Compression) {
		p.add("kafka.compression", "%q is not a codec; use none, gzip, snappy, lz4 or zstd (the Java client's compression.type)%s", k.Compression, with("kafka.compression"))
	}
	if k.Linger.Duration < 0 || k.Linger.Duration > maxLinger {
		p.add("kafka.linger", "%s is out of range; use 0s..%s (the Java client's linger.ms): a commit sends whatever waits, so a longer linger only holds records back%s", k.Linger, maxLinger, with("kafka.linger"))
	}
	if k.BatchMaxBytes > producer.MaxBatchBytes {
		p.add("kafka.batch_max_bytes", "%d is more than %d bytes, Kafka's default max.message.bytes: a larger batch can be refused by the broker (tidemark checks the offsets topic against that limit and sizes its batches to it); use %d or less%s",
			k.BatchMaxBytes, producer.MaxBatchBytes, producer.MaxBatchBytes, with("kafka.batch_max_bytes"))
	} else if k.BatchMaxBytes < minBatchMaxBytes {
		p.add("kafka.batch_max_bytes", "%d is less than %d bytes: a row whose record is larger than one batch cannot be produced; use %d..%d%s",
			k.BatchMaxBytes, minBatchMaxBytes, minBatchMaxBytes, producer.MaxBatchBytes, with("kafka.batch_max_bytes"))
	}

	y := &c.Sync
	if y.PageSize < 1 || y.PageSize > 100000 {
		p.add("sync.page_size", "%d is out of range; use 1..100000%s", y.PageSize, with("sync.page_size"))
	}
	if y.LoadWorkers < 0 || y.LoadWorkers > maxLoadWorkers {
		p.add("sync.load_workers", "%d is out of range; use 0 (load as a pass) or 1..%d database sessions%s", y.LoadWorkers, maxLoadWorkers, with("sync.load_workers"))
	} else if y.LoadWorkers > 0 && s.Kind == "http" {
		p.add("sync.load_workers", "a changes API cannot be read in id ranges; remove it (or set 0) with source.kind http")
	}
	if y.Margin.Duration < 0 {
		p.add("sync.margin", "%s is negative; use 0s or more%s", y.Margin, with("sync.margin"))
	}
	if y.PollInterval.Duration <= 0 {
		p.add("sync.poll_interval", "%s is out of range; use a positive duration%s", y.PollInterval, with("sync.poll_interval"))
	} else if y.PollInterval.Duration < minPollInterval {
		p.add("sync.poll_interval", "%s is below %s: every pass costs at least one query or request to the source, so a tighter loop only loads it; use %s or more%s", y.PollInterval, minPollInterval, minPollInterval, with("sync.poll_interval"))
	}
	if y.Margin.Duration > maxMargin {
		p.add("sync.margin", "%s is more than %s: every pass re-reads every row changed within the margin; size it to your longest writing transaction, or use source.horizon (README, Late commits)%s", y.Margin, maxMargin, with("sync.margin"))
	}
	if math.IsNaN(y.PollJitter) || y.PollJitter < 0 || y.PollJitter > 1 {
		p.add("sync.poll_jitter", "%v is out of range; use a fraction 0..1%s", y.PollJitter, with("sync.poll_jitter"))
	}
	if y.TxnMaxRecords < 1 {
		p.add("sync.txn_max_records", "%d is out of range; use 1 or more%s", y.TxnMaxRecords, with("sync.txn_max_records"))
	} else if y.PageSize >= 1 && y.TxnMaxRecords < y.PageSize {
		p.add("sync.txn_max_records", "%d is less than sync.page_size %d; a transaction holds at least one page, so raise it or lower sync.page_size", y.TxnMaxRecords, y.PageSize)
	}
	if y.TxnMaxBytes < 1 {
		p.add("sync.txn_max_bytes", "%d is out of range; use 1 or more bytes, e.g. 16MiB%s", y.TxnMaxBytes, with("sync.txn_max_bytes"))
	}
	if y.TxnMaxDuration.Duration <= 0 {
		p.add("sync.txn_max_duration", "%s is out of range; use a positive duration%s", y.TxnMaxDuration, with("sync.txn_max_duration"))
	} else if k.TransactionTimeout.Duration > 0 && y.TxnMaxDuration.Duration >= k.TransactionTimeout.Duration {
		p.add("sync.txn_max_duration", "%s is not below kafka.transaction_timeout %s; the broker would abort transactions, so lower it or raise the timeout", y.TxnMaxDuration, k.TransactionTimeout)
	}
	for key, d := range map[string]Duration{"sync.retry_timeout": y.RetryTimeout, "sync.once_retry_timeout": y.OnceRetryTimeout} {
		if d.Duration < 0 {
			p.add(key, "%s is negative; use 0s (no limit) or a positive duration such as 10m%s", d, with(key))
		}
	}

	if c.Sweep.Interval.Duration < 0 {
		p.add("sweep.interval", "%s is negative; use 0s (on demand only) or a positive duration such as 1h%s", c.Sweep.Interval, with("sweep.interval"))
	}
	if c.Sweep.MaxKeysInMemory < 0 {
		p.add("sweep.max_keys_in_memory", "%d is negative; use 0 (always by buckets) or a number of keys such as 4000000%s", c.Sweep.MaxKeysInMemory, with("sweep.max_keys_in_memory"))
	}

	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		p.add("log.level", "%q is not a level; use debug, info, warn or error%s", c.Log.Level, with("log.level"))
	}
	switch c.Log.Format {
	case "auto", "text", "json":
	default:
		p.add("log.format", "%q is not a format; use auto, text or json%s", c.Log.Format, with("log.format"))
	}
	c.validateNotify(p) // notify.go
	c.validateSecurity(p)
	c.validateMetrics(p)
	c.validateEmbedded(p)
	c.validateGroup(p)
	return errors.Join(p.errs...)
}

// Bounds of the values that are refused or warned about (Validate,
// Warnings): below or above them a value is a mistake, not a choice.
const (
	minPollInterval  = 10 * time.Millisecond
	warnPollInterval = 100 * time.Millisecond
	maxMargin        = 168 * time.Hour
	warnMargin       = time.Hour
	maxLinger        = time.Second
	minBatchMaxBytes = 16 << 10
	maxLoadWorkers   = 64
)

// compressionCodecs are the values of kafka.compression (cli.go maps them
// to the client's codecs).
var compressionCodecs = []string{"none", "gzip", "snappy", "lz4", "zstd"}

// Warnings lists values that are allowed but unusual, each naming the key
// and the cost; the CLI logs them at start.
func (c *Config) Warnings() []string {
	var w []string
	if d := c.Sync.PollInterval.Duration; d >= minPollInterval && d < warnPollInterval {
		w = append(w, fmt.Sprintf("sync.poll_interval %s is short: a caught-up connector queries the source %d times a second", d, time.Second/d))
	}
	if c.Embedded.Listen != "" && len(c.Kafka.Brokers) > 0 {
		w = append(w, "embedded.listen is ignored: kafka.brokers is set, so there is no embedded broker")
	}
	if d := c.Sync.Margin.Duration; d > warnMargin && d <= maxMargin {
		w = append(w, fmt.Sprintf("sync.margin %s is long: every pass re-reads every row changed in the last %s (deduplicated, but read)", d, d))
	}
	w = append(w, c.notifyWarnings()...) // notify.go
	if s := c.Source; s.Kind == "http" {
		if u, err := url.Parse(s.DSN); err == nil && u.Scheme == "http" && (s.HTTP.AuthHeader != "" || u.User.String() != "") && !loopbackHost(u.Hostname()) {
			what := "the " + s.HTTP.AuthHeader + " header (source.http.auth_header)"
			if s.HTTP.AuthHeader == "" {
				what = "the URL's user name and password (sent as basic auth)"
			}
			w = append(w, fmt.Sprintf("source.dsn is plain http to %s: %s crosses the network unencrypted on every request; use https", u.Hostname(), what))
		}
	}
	if len(c.Tasks) == 0 && c.Kafka.TopicPrefix != "" {
		w = append(w, "kafka.topic_prefix is ignored: it names the topics of a tables: list, and this configuration has one table (kafka.topic)")
	}
	return w
}

// loopbackHost reports whether host names this machine's loopback
// interface (localhost, 127.0.0.0/8, ::1).
func loopbackHost(host string) bool {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// problems collects validation errors.
type problems struct {
	c    *Config
	errs []error
}

func (p *problems) add(key, format string, args ...any) {
	p.addKey(key, key, format, args...)
}

// addKey reports a problem with an element (display, e.g.
// "kafka.brokers[1]") of the key whose origin is looked up.
func (p *problems) addKey(key, display, format string, args ...any) {
	p.errs = append(p.errs, &ConfigError{Key: display, Origin: p.c.origin[key], Msg: fmt.Sprintf(format, args...)})
}

// identifier checks a PostgreSQL identifier. It is always quoted, so any
// text works, but PostgreSQL truncates names past 63 bytes, which would
// silently name another object.
func (p *problems) identifier(key, v string, required bool) {
	switch {
	case v == "" && required:
		p.add(key, "required; name a %s", strings.ReplaceAll(strings.TrimPrefix(key, "source."), "_", " "))
	case len(v) > 63:
		p.add(key, "%q is %d bytes; PostgreSQL identifiers are at most 63 bytes", v, len(v))
	case strings.ContainsRune(v, 0):
		p.add(key, "contains a NUL byte; PostgreSQL identifiers cannot")
	}
}

func (p *problems) topic(key, v string) {
	if v == "" {
		p.add(key, "required; name a Kafka topic")
	} else if !topicRE.MatchString(v) || v == "." || v == ".." {
		p.add(key, "%q is not a valid Kafka topic name; use 1..249 of a-z A-Z 0-9 . _ -", v)
	}
}

// Password resolves source.password_env or source.password_file. It returns
// "" and no error when neither is set (the password, if any, is then in the
// DSN or ~/.pgpass). Errors name the variable or the file, never the value.
// env nil means os.Getenv.
func (c *Config) Password(env func(string) string) (string, error) {
	if env == nil {
		env = os.Getenv
	}
	switch {
	case c.Source.PasswordEnv != "":
		name := c.Source.PasswordEnv
		v := env(name)
		if v == "" {
			return "", &ConfigError{Key: "source.password_env", Origin: c.origin["source.password_env"], Credentials: true,
				Msg: fmt.Sprintf("environment variable %s is not set or empty; export it, or use source.password_file", name)}
		}
		return v, nil
	case c.Source.PasswordFile != "":
		// Read here to fail at start with exit 2; the source reads it
		// again for every new connection (postgres.Config.PasswordFile).
		v, err := postgres.ReadPasswordFile(c.Source.PasswordFile)
		if err != nil {
			return "", &ConfigError{Key: "source.password_file", Origin: c.origin["source.password_file"], Msg: err.Error(), Credentials: true}
		}
		return v, nil
	}
	return "", nil
}

// clone returns a deep copy of c.
func (c *Config) clone() *Config {
	d := *c
	d.Source.Columns = slices.Clone(c.Source.Columns)
	d.Kafka.Brokers = slices.Clone(c.Kafka.Brokers)
	d.Tasks = nil
	d.Source.HTTP.RejectStatuses = slices.Clone(c.Source.HTTP.RejectStatuses)
	d.Source.HTTP.RejectCodes = slices.Clone(c.Source.HTTP.RejectCodes)
	if c.origin != nil {
		d.origin = make(map[string]string, len(c.origin))
		for k, v := range c.origin {
			d.origin[k] = v
		}
	}
	return &d
}

// Redacted returns a copy of c whose DSN has its password (and any other
// secret-looking parameter) replaced by "REDACTED". Print this, never c.
func (c *Config) Redacted() *Config {
	d := c.clone()
	d.Source.DSN = RedactDSN(d.Source.DSN)
	return d
}

// YAML returns the redacted configuration as YAML, in the file's syntax; it
// loads back with LoadConfig.
func (c *Config) YAML() ([]byte, error) {
	var b bytes.Buffer
	e := yaml.NewEncoder(&b)
	e.SetIndent(2)
	if err := e.Encode(c.Redacted()); err != nil {
		return nil, err
	}
	if err := e.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// redacted replaces a secret.
const redacted = httpsrc.Redacted

// RedactDSN returns dsn with its password replaced by "REDACTED": the
// password of a URL's user info (postgres://u:pw@h/db, and http(s) URLs),
// secret-looking URL query parameters (password, sslpassword, token, key,
// secret, ...; httpsrc.RedactURL) and secret-looking keywords of the
// keyword form (host=h password='p w'; parsed by postgres.ParseKeywordDSN).
// A string it cannot parse is redacted whole. When in doubt it redacts too
// much rather than too little.
func RedactDSN(dsn string) string {
	switch {
	case dsn == "":
		return ""
	case urlFormRE.MatchString(dsn):
		return httpsrc.RedactURL(dsn)
	case strings.Contains(dsn, "="):
		pairs, err := postgres.ParseKeywordDSN(dsn)
		if err != nil {
			return redacted
		}
		var b strings.Builder
		last := 0
		for _, kv := range pairs {
			if httpsrc.IsSecretParam(kv.Key) {
				b.WriteString(dsn[last:kv.Start])
				b.WriteString(redacted)
				last = kv.End
			}
		}
		b.WriteString(dsn[last:])
		return b.String()
	default:
		return redacted
	}
}

// dsnHasPassword reports whether a DSN carries a password: in a URL's user
// info or password query parameter, or as the password keyword.
func dsnHasPassword(dsn string) bool {
	if urlFormRE.MatchString(dsn) {
		if strings.Contains(RedactDSN(dsn), ":"+redacted+"@") {
			return true
		}
		if _, q, ok := strings.Cut(dsn, "?"); ok {
			for _, prm := range strings.Split(q, "&") {
				if name, _, _ := strings.Cut(prm, "="); strings.EqualFold(name, "password") {
					return true
				}
			}
		}
		return false
	}
	pairs, _ := postgres.ParseKeywordDSN(dsn)
	for _, kv := range pairs {
		if kv.Key == "password" {
			return true
		}
	}
	return false
}

// checkPostgresDSN returns what is wrong with a PostgreSQL DSN, or "". The
// message never quotes the DSN.
func checkPostgresDSN(dsn string) string {
	if urlFormRE.MatchString(dsn) {
		scheme, _, _ := strings.Cut(dsn, "://")
		if scheme != "postgres" && scheme != "postgresql" {
			return fmt.Sprintf("URL scheme %q is not postgres:// or postgresql://", scheme)
		}
		if _, err := url.Parse(dsn); err != nil {
			return "not a valid URL; percent-encode special characters in the password (e.g. @ as %40, / as %2F), or use source.password_env"
		}
		return ""
	}
	if !strings.Contains(dsn, "=") {
		return "not a PostgreSQL connection string; use postgres://user@host:5432/db or the keyword form host=... dbname=... (quote values with spaces in single quotes)"
	}
	if _, err := postgres.ParseKeywordDSN(dsn); err != nil {
		return err.Error() // names keywords, never values
	}
	return ""
}

// dsnTarget returns the parts of a DSN that identify the data set: the
// host(s) without ports, and the database name (postgres) or URL path (http).
// No user name or password.
func dsnTarget(kind, dsn string) (host, db string) {
	if urlFormRE.MatchString(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return "", ""
		}
		var hosts []string
		for _, h := range strings.Split(u.Host, ",") {
			if hh, _, err := net.SplitHostPort(h); err == nil {
				h = hh
			}
			hosts = append(hosts, strings.ToLower(h))
		}
		host = strings.Join(hosts, ",")
		if kind == "http" {
			return host, u.Path
		}
		return host, strings.TrimPrefix(u.Path, "/")
	}
	pairs, _ := postgres.ParseKeywordDSN(dsn)
	for _, kv := range pairs {
		switch kv.Key {
		case "host":
			host = strings.ToLower(kv.Value)
		case "dbname":
			db = kv.Value
		}
	}
	return host, db
}

// Fingerprint digests the configuration that defines the data set and the
// record format: name, source kind, DSN host and database (or URL path;
// never user or password), schema, table, id/updated_at/deleted_at columns,
// columns, filter, initial_load and kafka.topic. Tuning knobs (page size,
// margin, transaction bounds, polling, logging) are not part of it. sum is
// the first 16 bytes of a SHA-256, hex; fields maps each input's dotted key to
// its value so a mismatch can be described (DiffFingerprint). Defaults are
// applied to a copy first.
func (c *Config) Fingerprint() (sum string, fields map[string]string) {
	d := c.clone()
	d.ApplyDefaults()
	s := &d.Source
	fields = map[string]string{
		"name":                     d.Name,
		"source.kind":              s.Kind,
		"source.schema":            s.Schema,
		"source.table":             s.Table,
		"source.id_column":         s.IDColumn,
		"source.updated_at_column": s.UpdatedAtColumn,
		"source.deleted_at_column": s.DeletedAtColumn,
		"source.columns":           strings.Join(s.Columns, ","),
		"source.filter":            s.Filter,
		"source.initial_load":      s.InitialLoad,
		"kafka.topic":              d.Kafka.Topic,
	}
	host, db := dsnTarget(s.Kind, s.DSN)
	fields["source.dsn.host"] = host
	if s.Kind == "http" {
		fields["source.dsn.path"] = db
		// The paths that decide the record's key, value and deletes.
		h := &s.HTTP
		for k, v := range map[string]string{"items_path": h.ItemsPath, "id_path": h.IDPath, "updated_at_path": h.UpdatedAtPath,
			"deleted_path": h.DeletedPath, "deleted_at_path": h.DeletedAtPath, "value_path": h.ValuePath} {
			fields["source.http."+k] = v
		}
	} else {
		fields["source.dsn.dbname"] = db
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	h := sha256.New()
	for _, k := range keys {
		fmt.Fprintf(h, "%s=%q\n", k, fields[k])
	}
	return hex.EncodeToString(h.Sum(nil)[:16]), fields
}

// DiffFingerprint describes how two fingerprint field sets differ, one line
// per changed key in key order: `source.table: "orders" -> "orders2"`. A key
// missing on one side shows as (unset).
func DiffFingerprint(old, new map[string]string) []string {
	keys := map[string]bool{}
	for k := range old {
		keys[k] = true
	}
	for k := range new {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	slices.Sort(sorted)
	show := func(m map[string]string, k string) string {
		if v, ok := m[k]; ok {
			return strconv.Quote(v)
		}
		return "(unset)"
	}
	var out []string
	for _, k := range sorted {
		ov, ook := old[k]
		nv, nok := new[k]
		if ook == nok && ov == nv {
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s -> %s", k, show(old, k), show(new, k)))
	}
	return out
}

// The key walk: a generic view of Config's fields by dotted yaml key.

// field is one leaf of Config.
type field struct {
	key    string
	index  []int
	secret bool // never quote the value in an error
	bytes  bool // int64 accepting sizes such as 16MiB
}

type fieldSet struct {
	leaves   []*field
	byKey    map[string]*field
	sections map[string]bool
}

var durationType = reflect.TypeFor[Duration]()

var configFields = sync.OnceValue(func() *fieldSet {
	fs := &fieldSet{byKey: map[string]*field{}, sections: map[string]bool{}}
	var walk func(t reflect.Type, prefix string, index []int)
	walk = func(t reflect.Type, prefix string, index []int) {
		for i := range t.NumField() {
			sf := t.Field(i)
			name, _, _ := strings.Cut(sf.Tag.Get("yaml"), ",")
			if !sf.IsExported() || name == "" || name == "-" {
				continue
			}
			key := name
			if prefix != "" {
				key = prefix + "." + name
			}
			idx := append(slices.Clone(index), i)
			if sf.Type.Kind() == reflect.Struct && sf.Type != durationType {
				fs.sections[key] = true
				walk(sf.Type, key, idx)
				continue
			}
			tag := sf.Tag.Get("tidemark")
			f := &field{key: key, index: idx, secret: tag == "secret", bytes: tag == "bytes"}
			fs.leaves = append(fs.leaves, f)
			fs.byKey[key] = f
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return fs
})

// isBool reports whether the key is a boolean.
func (f *field) isBool() bool {
	return reflect.TypeFor[Config]().FieldByIndex(f.index).Type.Kind() == reflect.Bool
}

func (f *field) value(c *Config) reflect.Value {
	return reflect.ValueOf(c).Elem().FieldByIndex(f.index)
}

// set parses raw into the field. Lists are comma-separated.
func (f *field) set(c *Config, raw string) error {
	v := f.value(c)
	if v.Kind() == reflect.Slice {
		var list []string
		for _, item := range strings.Split(raw, ",") {
			if item = strings.TrimSpace(item); item != "" {
				list = append(list, item)
			}
		}
		v.Set(reflect.ValueOf(list))
		return nil
	}
	return f.setScalar(v, raw)
}

func (f *field) setScalar(v reflect.Value, raw string) error {
	if v.Type() == durationType {
		var d Duration
		if err := d.UnmarshalText([]byte(raw)); err != nil {
			return err
		}
		v.Set(reflect.ValueOf(d))
		return nil
	}
	t := strings.TrimSpace(raw)
	switch v.Kind() {
	case reflect.String:
		v.SetString(raw)
	case reflect.Bool:
		b, err := strconv.ParseBool(t)
		if err != nil {
			return fmt.Errorf("%q is not a boolean; use true or false", raw)
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int16, reflect.Int32, reflect.Int64:
		if f.bytes {
			n, err := parseBytes(t)
			if err != nil {
				return err
			}
			v.SetInt(n)
			return nil
		}
		n, err := strconv.ParseInt(t, 10, v.Type().Bits())
		if err != nil {
			if errors.Is(err, strconv.ErrRange) {
				return fmt.Errorf("%q is out of range for this key", raw)
			}
			return fmt.Errorf("%q is not an integer", raw)
		}
		v.SetInt(n)
	case reflect.Float64:
		n, err := strconv.ParseFloat(t, 64)
		if err != nil || math.IsNaN(n) || math.IsInf(n, 0) {
			return fmt.Errorf("%q is not a number", raw)
		}
		v.SetFloat(n)
	default:
		panic("tidemark: config field of unsupported type " + v.Type().String())
	}
	return nil
}

var byteUnits = map[string]int64{
	"": 1, "b": 1,
	"kb": 1000, "mb": 1000 * 1000, "gb": 1000 * 1000 * 1000,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30,
}

// parseBytes parses "16777216", "16MiB", "16 MiB", "500kB".
func parseBytes(s string) (int64, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	unit, ok := byteUnits[strings.ToLower(strings.TrimSpace(s[i:]))]
	n, err := strconv.ParseInt(s[:i], 10, 64)
	if i == 0 || !ok || err != nil || n > math.MaxInt64/unit {
		return 0, fmt.Errorf("%q is not a size; write bytes or a number with a unit: B, kB, MB, GB, KiB, MiB, GiB (e.g. 16MiB)", s)
	}
	return n * unit, nil
}

// loader applies the layers of LoadConfig, collecting every error.
type loader struct {
	c    *Config
	env  func(string) string
	file string
	errs []error

	tables, tablesKey *yaml.Node // the tables: list (tasks.go)

	// unreadable: the file is not valid YAML or not a mapping, so none of
	// its keys were read; that error is the only one reported.
	unreadable bool
}

func (l *loader) fail(err error) { l.errs = append(l.errs, err) }

// set sets a key from text, recording its origin.
func (l *loader) set(key, raw, origin string) {
	f := configFields().byKey[key]
	if err := f.set(l.c, raw); err != nil {
		l.fail(&ConfigError{Key: key, Origin: origin, Msg: l.safeMsg(f, err)})
		return
	}
	l.c.origin[key] = origin
}

// safeMsg is err's message unless the field is secret.
func (l *loader) safeMsg(f *field, err error) string {
	if f.secret {
		return "invalid value (not shown: it may hold a secret)"
	}
	return err.Error()
}

func (l *loader) at(n *yaml.Node) string { return fmt.Sprintf("%s:%d", l.file, n.Line) }

func (l *loader) loadYAML(b []byte) {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return // empty file
		}
		l.fail(&ConfigError{Origin: l.file, Msg: "not valid YAML", Err: err})
		l.unreadable = true
		return
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		l.fail(&ConfigError{Origin: l.at(&extra), Msg: "a second YAML document; a config file holds one"})
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return
		}
		root = root.Content[0]
	}
	if isNull(root) {
		return
	}
	if root.Kind != yaml.MappingNode {
		l.fail(&ConfigError{Origin: l.at(root), Msg: "the file must be a mapping of keys (name:, source:, kafka:, ...)"})
		l.unreadable = true
		return
	}
	l.walk(root, "")
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// walk visits a mapping whose keys are under prefix.
func (l *loader) walk(m *yaml.Node, prefix string) {
	fs := configFields()
	seen := map[string]int{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, vn := m.Content[i], m.Content[i+1]
		for vn.Kind == yaml.AliasNode && vn.Alias != nil {
			vn = vn.Alias
		}
		key := kn.Value
		if prefix != "" {
			key = prefix + "." + kn.Value
		}
		if line, dup := seen[key]; dup {
			l.fail(&ConfigError{Origin: l.at(kn), Key: key, Msg: fmt.Sprintf("set twice (first on line %d); keep one", line)})
			continue
		}
		seen[key] = kn.Line
		switch {
		case key == "tables":
			l.tables, l.tablesKey = vn, kn
		case fs.sections[key]:
			switch {
			case isNull(vn):
			case vn.Kind == yaml.MappingNode:
				l.walk(vn, key)
			default:
				l.fail(&ConfigError{Origin: l.at(vn), Key: key, Msg: "is a section; write its keys indented beneath it (see tidemark.example.yaml)"})
			}
		case fs.byKey[key] != nil:
			l.leaf(fs.byKey[key], vn)
		default:
			l.fail(&ConfigError{Origin: l.at(kn), Key: key, Msg: unknownKeyMsg(key, true)})
		}
	}
}

// leaf sets one key from its YAML value.
func (l *loader) leaf(f *field, n *yaml.Node) {
	origin := l.at(n)
	if isNull(n) {
		return // "key:" with no value leaves the default
	}
	v := f.value(l.c)
	if v.Kind() == reflect.Slice {
		switch n.Kind {
		case yaml.SequenceNode:
			list := []string{}
			for _, item := range n.Content {
				for item.Kind == yaml.AliasNode && item.Alias != nil {
					item = item.Alias
				}
				if item.Kind != yaml.ScalarNode {
					l.fail(&ConfigError{Origin: l.at(item), Key: f.key, Msg: "list items must be plain values"})
					return
				}
				s, ok := l.expand(f, item)
				if !ok {
					return
				}
				list = append(list, s)
			}
			v.Set(reflect.ValueOf(list))
			l.c.origin[f.key] = origin
			return
		case yaml.ScalarNode:
			if s, ok := l.expand(f, n); ok {
				l.set(f.key, s, origin)
			}
			return
		}
		l.fail(&ConfigError{Origin: origin, Key: f.key, Msg: "expects a list, e.g. [a, b]"})
		return
	}
	if n.Kind != yaml.ScalarNode {
		l.fail(&ConfigError{Origin: origin, Key: f.key, Msg: "expects a single value, not a list or mapping"})
		return
	}
	if s, ok := l.expand(f, n); ok {
		l.set(f.key, s, origin)
	}
}

func (l *loader) expand(f *field, n *yaml.Node) (string, bool) {
	s, err := expandVars(n.Value, l.env)
	if err != nil {
		l.fail(&ConfigError{Origin: l.at(n), Key: f.key, Msg: err.Error()})
		return "", false
	}
	return s, true
}

var varNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// expandVars replaces ${VAR} and ${VAR:-default} from env; the default is
// used when VAR is unset or empty, and an unset or empty VAR without a default
// is an error. $${ is a literal ${. Error messages name variables, never
// values.
func expandVars(s string, env func(string) string) (string, error) {
	if !strings.Contains(s, "${") {
		return s, nil
	}
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		if i > 0 && s[i-1] == '$' {
			b.WriteString(s[:i]) // keeps one '$' of "$$"
			b.WriteString("{")
			s = s[i+2:]
			continue
		}
		b.WriteString(s[:i])
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", errors.New("unterminated ${ ... }; close it, or write $${ for a literal ${")
		}
		expr := s[i+2 : i+end]
		s = s[i+end+1:]
		name, def, hasDef := strings.Cut(expr, ":-")
		if !varNameRE.MatchString(name) {
			return "", fmt.Errorf("${%s} is not a variable reference; names are letters, digits and _ (write $${ for a literal ${)", name)
		}
		v := env(name)
		switch {
		case v != "":
			b.WriteString(v)
		case hasDef:
			b.WriteString(def)
		default:
			// env cannot tell unset from empty: both need a default.
			return "", fmt.Errorf("environment variable %s is not set (or empty); export it, or write ${%s:-default}", name, name)
		}
	}
}

// firstLeaf returns the name of the first key of a section.
func firstLeaf(section string) string {
	for _, f := range configFields().leaves {
		if rest, ok := strings.CutPrefix(f.key, section+"."); ok {
			return rest
		}
	}
	return ""
}

// unknownKeyMsg says a key is unknown and suggests the closest known one
// (or section, when sections is true).
func unknownKeyMsg(key string, sections bool) string {
	if s := suggestKey(key, sections); s != "" {
		return fmt.Sprintf("unknown key; did you mean %s?", s)
	}
	return "unknown key; see tidemark.example.yaml for every key"
}

// suggestKey returns the known key (or section) closest to key, or "".
func suggestKey(key string, sections bool) string {
	fs := configFields()
	leaf := key[strings.LastIndexByte(key, '.')+1:]
	best, bestScore := "", math.MaxInt
	consider := func(k string) {
		kl := k[strings.LastIndexByte(k, '.')+1:]
		score := min(levenshtein(key, k), levenshtein(leaf, kl)+1)
		if len(leaf) >= 4 && (strings.HasPrefix(kl, leaf) || strings.HasPrefix(leaf, kl)) {
			score = min(score, 2) // updated_at -> updated_at_column
		}
		if score < bestScore {
			best, bestScore = k, score
		}
	}
	for _, f := range fs.leaves {
		consider(f.key)
	}
	if sections {
		for _, s := range slices.Sorted(maps.Keys(fs.sections)) {
			consider(s)
		}
	}
	if bestScore <= max(2, len(leaf)/3) {
		return best
	}
	return ""
}

func levenshtein(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
