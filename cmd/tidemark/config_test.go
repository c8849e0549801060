package main

import (
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// envMap returns an env function over m.
func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

// writeConfig writes a config file named tidemark.yaml into a temporary
// directory and returns its path.
func writeConfig(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tidemark.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// minimal is the smallest valid postgres configuration.
const minimal = `
name: orders-sync
source:
  dsn: postgres://tidemark@db.example.com:5432/shop
  table: orders
`

func mustLoad(t *testing.T, path string, env map[string]string, overrides ...string) *Config {
	t.Helper()
	c, err := LoadConfig(path, envMap(env), overrides)
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	return c
}

// loadErr loads a config that must fail and returns the error text.
func loadErr(t *testing.T, path string, env map[string]string, overrides ...string) string {
	t.Helper()
	c, err := LoadConfig(path, envMap(env), overrides)
	if err == nil {
		t.Fatalf("LoadConfig succeeded, want an error; config %+v", c)
	}
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("error %v (%T) is not a *ConfigError", err, err)
	}
	return err.Error()
}

func wantContains(t *testing.T, got string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(got, w) {
			t.Errorf("error does not contain %q; got:\n%s", w, got)
		}
	}
}

func TestDefaults(t *testing.T) {
	c := mustLoad(t, writeConfig(t, minimal), nil)
	want := Config{
		Name:    "orders-sync",
		DataDir: "./tidemark-data",
		Source: SourceConfig{
			Kind: "postgres", DSN: "postgres://tidemark@db.example.com:5432/shop",
			Schema: "public", Table: "orders", IDColumn: "id", UpdatedAtColumn: "updated_at",
			InitialLoad: "moving", OnSchemaChange: "continue", NotifyMinGap: Duration{20 * time.Millisecond}, NotifyLookback: Duration{100 * time.Millisecond},
		},
		Kafka: KafkaConfig{
			Topic: "orders", OffsetsTopic: "tidemark-offsets", LedgerTopic: "tidemark-ledger",
			LedgerRetention: Duration{7 * 24 * time.Hour}, Partitions: 6, ReplicationFactor: -1,
			TransactionTimeout: Duration{60 * time.Second},
			Compression:        "lz4",
			BatchMaxBytes:      1_000_012,
		},
		Sync: SyncConfig{
			PageSize: 1000, Margin: Duration{10 * time.Second}, PollInterval: Duration{time.Second},
			PollJitter: 0.2, TxnMaxRecords: 10000, TxnMaxBytes: 16 << 20,
			TxnMaxDuration: Duration{5 * time.Second}, OnceRetryTimeout: Duration{5 * time.Minute},
		},
		Sweep: SweepConfig{MaxKeysInMemory: 4000000},
		Log:   LogConfig{Level: "info", Format: "auto"},
		Group: GroupConfig{SessionTimeout: Duration{45 * time.Second}, RebalanceTimeout: Duration{60 * time.Second}},
	}
	c.origin = nil
	if !reflect.DeepEqual(*c, want) {
		t.Errorf("defaults:\n got %+v\nwant %+v", *c, want)
	}
}

func TestApplyDefaultsOnLiteral(t *testing.T) {
	c := &Config{Name: "x", Source: SourceConfig{DSN: "host=h dbname=d", Table: "t"}}
	c.ApplyDefaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate after ApplyDefaults: %v", err)
	}
	if c.Sync.Margin.Duration != 10*time.Second || c.Kafka.Topic != "t" || c.Source.Schema != "public" {
		t.Errorf("defaults not applied: %+v", c)
	}
}

func TestExplicitZeroKept(t *testing.T) {
	c := mustLoad(t, writeConfig(t, minimal+`
sync:
  margin: 0s
  poll_jitter: 0
  dedupe_max_entries: 0
`), nil)
	if c.Sync.Margin.Duration != 0 || c.Sync.PollJitter != 0 || c.Sync.DedupeMaxEntries != 0 {
		t.Errorf("explicit zeros replaced by defaults: %+v", c.Sync)
	}
	// An empty string still means the default.
	c = mustLoad(t, writeConfig(t, minimal+`
kafka:
  offsets_topic: ""
`), nil)
	if c.Kafka.OffsetsTopic != "tidemark-offsets" {
		t.Errorf("offsets_topic = %q, want the default", c.Kafka.OffsetsTopic)
	}
}

func TestPrecedence(t *testing.T) {
	path := writeConfig(t, minimal+`
kafka:
  brokers: [file:9092]
sync:
  page_size: 10
  txn_max_records: 100
  margin: 1s
`)
	env := map[string]string{
		"TIDEMARK_SOURCE_TABLE":   "from_env",
		"TIDEMARK_SYNC_PAGE_SIZE": "20",
		"KAFKA_BROKERS":           "plain1:9092,plain2:9092",
	}
	c := mustLoad(t, path, env)
	if c.Source.Table != "from_env" || c.Sync.PageSize != 20 || c.Sync.Margin.Duration != time.Second {
		t.Errorf("env over file: table %q page_size %d margin %s", c.Source.Table, c.Sync.PageSize, c.Sync.Margin)
	}
	if !slices.Equal(c.Kafka.Brokers, []string{"plain1:9092", "plain2:9092"}) {
		t.Errorf("KAFKA_BROKERS over file: %v", c.Kafka.Brokers)
	}
	if c.Kafka.Topic != "from_env" {
		t.Errorf("topic %q, want the table from env", c.Kafka.Topic)
	}

	env["TIDEMARK_KAFKA_BROKERS"] = "tm1:9092, tm2:9092"
	c = mustLoad(t, path, env, "source.table=from_flag", "sync.margin=3s")
	if c.Source.Table != "from_flag" || c.Sync.PageSize != 20 || c.Sync.Margin.Duration != 3*time.Second {
		t.Errorf("overrides over env: table %q page_size %d margin %s", c.Source.Table, c.Sync.PageSize, c.Sync.Margin)
	}
	if !slices.Equal(c.Kafka.Brokers, []string{"tm1:9092", "tm2:9092"}) {
		t.Errorf("TIDEMARK_KAFKA_BROKERS over KAFKA_BROKERS: %v", c.Kafka.Brokers)
	}
	c = mustLoad(t, path, env, "kafka.brokers=flag:9092")
	if !slices.Equal(c.Kafka.Brokers, []string{"flag:9092"}) {
		t.Errorf("override over env: %v", c.Kafka.Brokers)
	}
}

func TestNoFile(t *testing.T) {
	c := mustLoad(t, "", map[string]string{
		"TIDEMARK_NAME":       "n",
		"TIDEMARK_SOURCE_DSN": "host=h dbname=d",
	}, "source.table=t", "source.columns=id, name ,updated_at", "source.horizon=true", "sync.txn_max_bytes=1MiB")
	if c.Source.Table != "t" || !c.Source.Horizon || c.Sync.TxnMaxBytes != 1<<20 {
		t.Errorf("got %+v", c)
	}
	if !slices.Equal(c.Source.Columns, []string{"id", "name", "updated_at"}) {
		t.Errorf("columns %q", c.Source.Columns)
	}
}

// TestEveryKeySettable sets every key through an override and through its
// environment variable, proving the generic walk reaches each field.
func TestEveryKeySettable(t *testing.T) {
	samples := map[string]string{
		"name": "n2", "data_dir": "/var/lib/tm", "source.kind": "postgres",
		"source.dsn": "host=h2 dbname=d2", "source.password_env": "PW", "source.password_file": "",
		"source.schema": "s2", "source.table": "t2", "source.id_column": "i2",
		"source.updated_at_column": "u2", "source.deleted_at_column": "d2",
		"source.columns": "i2,u2,x", "source.filter": "x > 1", "source.horizon": "true",
		"source.initial_load": "consistent", "source.on_schema_change": "republish", "source.notify": "n2_changes", "source.notify_min_gap": "35ms", "source.notify_lookback": "70ms", "kafka.brokers": "a:1,b:2", "kafka.topic": "tp",
		"kafka.offsets_topic": "off", "kafka.ledger_topic": "led", "kafka.ledger_retention": "48h", "kafka.partitions": "3", "kafka.replication_factor": "3",
		"kafka.allow_non_compacted": "true", "kafka.transaction_timeout": "2m",
		"kafka.compression": "zstd", "kafka.linger": "7ms", "kafka.batch_max_bytes": "64KiB",
		"sync.page_size": "500", "sync.margin": "30s", "sync.poll_interval": "5s",
		"sync.poll_jitter": "0.5", "sync.txn_max_records": "600", "sync.txn_max_bytes": "1000",
		"sync.txn_max_duration": "1s", "sync.load_workers": "3", "sync.retry_timeout": "1h", "sync.once_retry_timeout": "3m", "sync.dedupe_max_entries": "7", "sweep.interval": "1h", "sweep.max_keys_in_memory": "1000", "log.level": "debug",
		"log.format":        "json",
		"kafka.tls.enabled": "true", "kafka.tls.ca_file": "/etc/ca.pem", "kafka.tls.cert_file": "/etc/c.pem",
		"kafka.tls.key_file": "/etc/k.pem", "kafka.tls.server_name": "kafka.internal",
		"kafka.sasl.mechanism": "SCRAM-SHA-512", "kafka.sasl.username": "tm", "kafka.sasl.password_env": "KPW",
		"kafka.sasl.password_file": "",
		"metrics.listen":           "0.0.0.0:9464", "metrics.ready_max_lag": "5m", "metrics.hold_on_stop": "30s",
		"embedded.listen":    "127.0.0.1:19092",
		"kafka.topic_prefix": "pre.", "group.session_timeout": "10s", "group.rebalance_timeout": "2m", "group.tasks_topic": "tt",
		// source.http.* only apply to kind http (cli_http_test.go sets them).
		"source.http.since_param":      "",
		"source.http.cursor_param":     "",
		"source.http.limit_param":      "",
		"source.http.max_limit":        "",
		"source.http.items_path":       "",
		"source.http.id_path":          "",
		"source.http.updated_at_path":  "",
		"source.http.deleted_path":     "",
		"source.http.deleted_at_path":  "",
		"source.http.value_path":       "",
		"source.http.pagination":       "",
		"source.http.next_cursor_path": "",
		"source.http.has_more_path":    "",
		"source.http.auth_header":      "",
		"source.http.auth_value_env":   "",
		"source.http.auth_value_file":  "",
		"source.http.reject_statuses":  "",
		"source.http.reject_codes":     "",
		"source.http.error_code_path":  "",
		"source.http.request_timeout":  "",
		"source.http.max_retries":      "",
		"source.http.max_retry_after":  "",
		"source.http.max_empty_pages":  "",
	}
	keys := ConfigKeys()
	if len(keys) != len(samples) {
		t.Fatalf("ConfigKeys has %d keys, the test samples %d: %v", len(keys), len(samples), keys)
	}
	var overrides []string
	env := map[string]string{}
	for _, k := range keys {
		v, ok := samples[k]
		if !ok {
			t.Fatalf("no sample for key %s", k)
		}
		if v == "" {
			continue
		}
		overrides = append(overrides, k+"="+v)
		env[EnvName(k)] = v
	}
	for name, c := range map[string]*Config{
		"overrides": mustLoad(t, "", nil, overrides...),
		"env":       mustLoad(t, "", env),
	} {
		y, err := c.YAML()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"n2", "/var/lib/tm", "s2", "t2", "i2", "u2", "d2", "x > 1", "consistent",
			"a:1", "tp", "off", "ledger_topic: led", "ledger_retention: 48h0m0s", "partitions: 3", "replication_factor: 3", "allow_non_compacted: true",
			"transaction_timeout: 2m0s", "page_size: 500", "margin: 30s", "poll_interval: 5s",
			"poll_jitter: 0.5", "txn_max_records: 600", "txn_max_bytes: 1000", "txn_max_duration: 1s",
			"dedupe_max_entries: 7", "level: debug", "format: json", "horizon: true", "password_env: PW",
			"notify: n2_changes", "notify_min_gap: 35ms", "notify_lookback: 70ms", "load_workers: 3",
			"compression: zstd", "linger: 7ms", "batch_max_bytes: 65536"} {
			if !strings.Contains(string(y), want) {
				t.Errorf("%s: effective config lacks %q:\n%s", name, want, y)
			}
		}
	}
}

func TestEnvNamesUnique(t *testing.T) {
	seen := map[string]string{}
	for _, k := range ConfigKeys() {
		n := EnvName(k)
		if other, dup := seen[n]; dup {
			t.Errorf("%s and %s share the variable %s", k, other, n)
		}
		seen[n] = k
	}
	if EnvName("sync.page_size") != "TIDEMARK_SYNC_PAGE_SIZE" {
		t.Errorf("EnvName(sync.page_size) = %s", EnvName("sync.page_size"))
	}
}

func TestExpandVars(t *testing.T) {
	path := writeConfig(t, `
name: ${NAME}
source:
  dsn: postgres://tidemark:${DBPASS}@${DBHOST:-localhost}:5432/shop
  table: ${TABLE:-orders}
  filter: "note <> '$${literal}'"
sync:
  page_size: ${PAGE:-250}
  txn_max_records: ${PAGE:-250}
`)
	c := mustLoad(t, path, map[string]string{"NAME": "exp", "DBPASS": "s3cr3t", "TABLE": ""})
	if c.Name != "exp" || c.Source.Table != "orders" || c.Sync.PageSize != 250 {
		t.Errorf("expansion: name %q table %q page_size %d", c.Name, c.Source.Table, c.Sync.PageSize)
	}
	if c.Source.DSN != "postgres://tidemark:s3cr3t@localhost:5432/shop" {
		t.Errorf("dsn not expanded as expected")
	}
	if c.Source.Filter != "note <> '${literal}'" {
		t.Errorf("filter %q: $${ must stay a literal ${", c.Source.Filter)
	}

	msg := loadErr(t, path, map[string]string{"DBPASS": "s3cr3t"})
	wantContains(t, msg, "tidemark.yaml:2: name: environment variable NAME is not set", "${NAME:-default}")

	bad := writeConfig(t, minimal+"log:\n  level: ${oops\n")
	wantContains(t, loadErr(t, bad, nil), "log.level", "unterminated ${")
	bad = writeConfig(t, minimal+"log:\n  level: ${1X}\n")
	wantContains(t, loadErr(t, bad, nil), "log.level", "not a variable reference")
}

func TestUnknownKeys(t *testing.T) {
	path := writeConfig(t, `name: x
source:
  dsn: host=h dbname=d
  tabel: orders
kafak:
  topic: t
sync:
  page_sise: 10
  nonsense_entirely_unrelated: 1
`)
	msg := loadErr(t, path, nil)
	wantContains(t, msg,
		"tidemark.yaml:4: source.tabel: unknown key; did you mean source.table?",
		"tidemark.yaml:5: kafak: unknown key; did you mean kafka?",
		"tidemark.yaml:8: sync.page_sise: unknown key; did you mean sync.page_size?",
		"tidemark.yaml:9: sync.nonsense_entirely_unrelated: unknown key; see tidemark.example.yaml",
	)
	// source.table is not also reported as missing? It is: the typo left it
	// unset, and the operator should see that too.
	wantContains(t, msg, "source.table: required")

	wantContains(t, loadErr(t, writeConfig(t, minimal), nil, "sync.pagesize=5"),
		"command line: sync.pagesize: unknown key; did you mean sync.page_size?")
	wantContains(t, loadErr(t, writeConfig(t, minimal), nil, "source=x"),
		"command line: source: is a section; set one of its keys, e.g. source.kind")
	wantContains(t, loadErr(t, writeConfig(t, minimal), nil, "source.table"),
		`override "source.table" is not key=value`)
	// A key in the wrong section is found by its leaf name.
	wantContains(t, loadErr(t, writeConfig(t, minimal+"kafka:\n  page_size: 5\n"), nil),
		"kafka.page_size: unknown key; did you mean sync.page_size?")
}

func TestFileShapeErrors(t *testing.T) {
	for name, tc := range map[string]struct{ text, want string }{
		"duplicate":   {minimal + "name: again\n", "tidemark.yaml:6: name: set twice (first on line 2)"},
		"section":     {minimal + "sync: 5\n", "tidemark.yaml:6: sync: is a section"},
		"list":        {minimal + "log:\n  level: [a, b]\n", "log.level: expects a single value"},
		"int":         {minimal + "sync:\n  page_size: lots\n", `tidemark.yaml:7: sync.page_size: "lots" is not an integer`},
		"duration":    {minimal + "sync:\n  margin: 10\n", `sync.margin: "10" is not a duration`},
		"bool":        {"name: x\nsource:\n  horizon: maybe\n", `tidemark.yaml:3: source.horizon: "maybe" is not a boolean`},
		"bytes":       {minimal + "sync:\n  txn_max_bytes: 16MB/s\n", `"16MB/s" is not a size`},
		"range":       {minimal + "kafka:\n  replication_factor: 70000\n", `"70000" is out of range`},
		"not mapping": {"- a\n- b\n", "the file must be a mapping"},
		"syntax":      {"name: [\n", "not valid YAML"},
		"two docs":    {minimal + "---\nname: y\n", "a second YAML document"},
	} {
		t.Run(name, func(t *testing.T) {
			wantContains(t, loadErr(t, writeConfig(t, tc.text), nil), tc.want)
		})
	}
	if _, err := LoadConfig(filepath.Join(t.TempDir(), "missing.yaml"), nil, nil); err == nil {
		t.Error("missing file loaded")
	} else {
		var ce *ConfigError
		if !errors.As(err, &ce) || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("missing file: %v is not a ConfigError wrapping ErrNotExist", err)
		}
	}
}

func TestEmptyFile(t *testing.T) {
	c := mustLoad(t, writeConfig(t, "# nothing\n"), map[string]string{
		"TIDEMARK_NAME": "n", "TIDEMARK_SOURCE_DSN": "host=h", "TIDEMARK_SOURCE_TABLE": "t",
	})
	if c.Kafka.Topic != "t" {
		t.Errorf("topic %q", c.Kafka.Topic)
	}
}

func TestValidateAllAtOnce(t *testing.T) {
	path := writeConfig(t, `
name: "bad name!"
source:
  dsn: mysql://root@localhost/db
  table: ""
  id_column: ts
  updated_at_column: ts
  columns: [a, b, a]
  initial_load: snapshot
kafka:
  brokers: ["nohost", "h:99999"]
  offsets_topic: "bad topic"
  partitions: 0
  replication_factor: -2
  transaction_timeout: 2s
sync:
  page_size: 0
  margin: -1s
  poll_interval: 0s
  poll_jitter: 1.5
  txn_max_bytes: 0
  txn_max_duration: 3s
  load_workers: 65
log:
  level: verbose
  format: xml
`)
	msg := loadErr(t, path, nil)
	wantContains(t, msg,
		`name: "bad name!" is not a valid name`,
		`source.dsn: URL scheme "mysql" is not postgres:// or postgresql://`,
		"source.table: required",
		`source.updated_at_column: is the same column as source.id_column ("ts")`,
		`source.columns[2]: column "a" is listed twice`,
		`source.initial_load: "snapshot" is not an initial load mode; use moving or consistent (default moving)`,
		`kafka.brokers[0]: "nohost" is not host:port`,
		`kafka.brokers[1]: "h:99999" has no valid port`,
		`kafka.offsets_topic: "bad topic" is not a valid Kafka topic name`,
		"kafka.partitions: 0 is out of range; use 1 or more (default 6)",
		"kafka.replication_factor: -2 is out of range",
		"sync.page_size: 0 is out of range; use 1..100000 (default 1000)",
		"sync.margin: -1s is negative",
		"sync.poll_interval: 0s is out of range",
		"sync.poll_jitter: 1.5 is out of range; use a fraction 0..1 (default 0.2)",
		"sync.txn_max_bytes: 0 is out of range",
		"sync.txn_max_duration: 3s is not below kafka.transaction_timeout 2s",
		"sync.load_workers: 65 is out of range; use 0 (load as a pass) or 1..64 database sessions (default 0)",
		`log.level: "verbose" is not a level`,
		`log.format: "xml" is not a format`,
	)
	// Each problem names where the value was set.
	wantContains(t, msg, "tidemark.yaml:17: sync.page_size: 0 is out of range")
	if n := strings.Count(msg, "\n") + 1; n != 20 {
		t.Errorf("got %d problems, want 20:\n%s", n, msg)
	}

	// Validate itself joins *ConfigErrors.
	c := &Config{}
	err := c.Validate()
	var ce *ConfigError
	if !errors.As(err, &ce) {
		t.Fatalf("Validate error %T is not a *ConfigError", err)
	}
	if len(unjoin(err)) < 5 {
		t.Errorf("zero config: want many problems, got %v", err)
	}
}

func TestContradictions(t *testing.T) {
	httpBase := `
name: api
source:
  kind: http
  dsn: https://api.example.com/v1/changes?token=abc
kafka:
  topic: things
`
	c := mustLoad(t, writeConfig(t, httpBase), nil)
	if c.Source.Schema != "" || c.Source.IDColumn != "" {
		t.Errorf("postgres defaults applied to kind http: %+v", c.Source)
	}
	msg := loadErr(t, writeConfig(t, httpBase+`  allow_non_compacted: true
source:
  kind: http
`), nil)
	wantContains(t, msg, "source: set twice")

	msg = loadErr(t, writeConfig(t, httpBase), nil,
		"source.initial_load=consistent", "source.horizon=true", "source.table=x", "source.filter=a=1")
	wantContains(t, msg,
		"command line: source.initial_load: consistent needs a postgres snapshot",
		"command line: source.horizon: only used with source.kind postgres",
		"command line: source.table: only used with source.kind postgres",
		"command line: source.filter: only used with source.kind postgres",
	)
	// An HTTP feed cannot list its live rows: a scheduled sweep would fail
	// after every first pass (exit 1, and a restart loop).
	msg = loadErr(t, writeConfig(t, httpBase), nil, "sweep.interval=1h", "source.on_schema_change=republish")
	wantContains(t, msg, "command line: sweep.interval: an HTTP source cannot be swept", "command line: source.on_schema_change: republish runs a sweep")
	msg = loadErr(t, writeConfig(t, httpBase), nil, "kafka.topic=", "source.dsn=ftp://x")
	wantContains(t, msg, "kafka.topic: required for source.kind http", "source.dsn: not an http(s) URL")

	msg = loadErr(t, writeConfig(t, minimal), nil, "source.password_env=PW", "source.password_file=/run/pw")
	wantContains(t, msg, "source.password_file: source.password_env and source.password_file are both set; keep one")

	msg = loadErr(t, writeConfig(t, minimal), nil, "source.dsn=host=h password=pw", "source.password_env=PW")
	wantContains(t, msg, "source.dsn: holds a password and source.password_env")
	if strings.Contains(msg, "pw ") || strings.Contains(msg, "=pw") {
		t.Errorf("password in error: %s", msg)
	}
	// sslkey is a path, not a password.
	mustLoad(t, writeConfig(t, minimal), nil, "source.dsn=host=h sslkey=/k.pem", "source.password_env=PW")

	msg = loadErr(t, writeConfig(t, minimal), nil, "sync.page_size=5000", "sync.txn_max_records=4000")
	wantContains(t, msg, "sync.txn_max_records: 4000 is less than sync.page_size 5000")
	msg = loadErr(t, writeConfig(t, minimal), nil, "kafka.topic=tidemark-offsets")
	wantContains(t, msg, `kafka.offsets_topic: is the data topic "tidemark-offsets" too`)
	msg = loadErr(t, writeConfig(t, minimal), nil, "kafka.ledger_topic=orders", "kafka.ledger_retention=10m")
	wantContains(t, msg, `kafka.ledger_topic: "orders" is already the data or offsets topic`,
		"kafka.ledger_retention: 10m0s is too short; use 1h or more (default 168h)")
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"1024": 1024, "16MiB": 16 << 20, "16 MiB": 16 << 20, "500kB": 500000, "2GB": 2e9,
		"1gib": 1 << 30, "7B": 7, "3KiB": 3072,
	} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5MiB", "16 mebibytes", "99999999999GiB"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) succeeded", in)
		}
	}
}

func TestRedactDSN(t *testing.T) {
	const pw = "hunter2"
	for _, tc := range []struct{ in, want string }{
		{"postgres://u:hunter2@h:5432/db?sslmode=require", "postgres://u:REDACTED@h:5432/db?sslmode=require"},
		{"postgresql://u:hunter2@h1:5432,h2:5433/db", "postgresql://u:REDACTED@h1:5432,h2:5433/db"},
		{"postgres://u@h/db?password=hunter2&sslmode=disable", "postgres://u@h/db?password=REDACTED&sslmode=disable"},
		{"postgres://u:hun%40ter2@h/db", "postgres://u:REDACTED@h/db"},
		{"postgres://u@h/db", "postgres://u@h/db"},
		// Unencoded '@', '/', '?', '#' in the password: parsed conservatively.
		{"postgres://u:hun@ter2@h/db", "postgres://u:REDACTED@h/db"},
		{"postgres://u:12/hunter2@h/db", "postgres://u:REDACTED@h/db"},
		{"postgres://u:1?hunter2@h/db", "postgres://u:REDACTED@h/db"},
		{"postgres://u:1#hunter2@h/db", "postgres://u:REDACTED@h/db"},
		{"postgres://u:hunter2@h/db?application_name=a@b", "postgres://u:REDACTED@b"},
		{"host=h password=hunter2 dbname=d", "host=h password=REDACTED dbname=d"},
		{"host=h password = 'hun ter2\\' x' dbname=d", "host=h password = REDACTED dbname=d"},
		{"host=h sslpassword=hunter2", "host=h sslpassword=REDACTED"},
		{"host=h password='hunter2", "REDACTED"},
		{"hunter2", "REDACTED"},
		{"password=hunter2 options=x://y", "password=REDACTED options=x://y"},
		{"https://api.example.com/v1?token=hunter2&limit=5", "https://api.example.com/v1?limit=5&token=REDACTED"},
		{"https://user:hunter2@api.example.com/v1", "https://user:REDACTED@api.example.com/v1"},
		// An '@' in the query (an e-mail address) is not the user info's.
		{"http://127.0.0.1:8080/changes?owner=a@b.com&api_key=hunter2", "http://127.0.0.1:REDACTED@b.com&api_key=REDACTED"},
		{"https://u:hunter2@h/changes?owner=a@b.com&token=hunter2&limit=5", "https://u:REDACTED@b.com&token=REDACTED&limit=5"},
		{"https://h/changes?owner=a@b.com&x=1#sig=hunter2", "https://h/changes?owner=a@b.com&x=1#sig=REDACTED"},
		{"https://h/changes?token=hunter2&owner=a@b.com", "https://h/changes?token=REDACTED&owner=a@b.com"},
		{"https://user@h/p?token=hunter2&e=a@b", "https://user@h/p?token=REDACTED&e=a@b"},
		// An HTTP client sends a user name alone as basic auth: often an API key.
		{"https://hunter2key@api.example.com/v1/changes", "https://REDACTED@api.example.com/v1/changes"},
		{"", ""},
	} {
		got := RedactDSN(tc.in)
		if got != tc.want {
			t.Errorf("RedactDSN(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Contains(got, "ter2") {
			t.Errorf("RedactDSN(%q) leaks the password: %q", tc.in, got)
		}
	}
	_ = pw
}

// TestSecretsNeverPrinted checks that a DSN password appears in no output:
// Redacted, YAML, validation errors, load errors, fingerprint fields.
func TestSecretsNeverPrinted(t *testing.T) {
	const secret = "Sup3rS3cret"
	path := writeConfig(t, `
name: s
source:
  dsn: postgres://admin:${PW}@db.internal:5432/shop?sslpassword=${PW}
  table: orders
`)
	env := map[string]string{"PW": secret}
	c := mustLoad(t, path, env)
	if !strings.Contains(c.Source.DSN, secret) {
		t.Fatal("the real config must keep the password")
	}
	r := c.Redacted()
	if strings.Contains(r.Source.DSN, secret) || !strings.Contains(r.Source.DSN, "REDACTED") {
		t.Errorf("Redacted DSN %q", r.Source.DSN)
	}
	if !strings.Contains(c.Source.DSN, secret) {
		t.Error("Redacted modified the original")
	}
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(y), secret) {
		t.Errorf("YAML leaks the password:\n%s", y)
	}
	_, fields := c.Fingerprint()
	for k, v := range fields {
		if strings.Contains(v, secret) || strings.Contains(v, "admin") {
			t.Errorf("fingerprint field %s = %q holds a credential", k, v)
		}
	}

	// Errors from every layer with a secret-bearing DSN.
	for _, o := range [][]string{
		{"source.dsn=mysql://admin:" + secret + "@h/db", "sync.page_size=0"},
		{"source.dsn=postgres://admin:" + secret + "@h:notaport/db"},
		{"source.dsn=postgres://admin:" + secret + "@h/db", "source.password_env=X"},
		{"source.dsn=host=h password='" + secret},
		{"source.dsn=" + secret},
		{"source.kind=http", "source.dsn=postgres://admin:" + secret + "@h/db"},
	} {
		_, err := LoadConfig(path, envMap(env), o)
		if err == nil {
			t.Errorf("%v: loaded", o)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%v: error leaks the password: %v", o, err)
		}
	}
	_, err = LoadConfig(path, envMap(map[string]string{"TIDEMARK_SOURCE_DSN": "host=h password=" + secret, "TIDEMARK_SOURCE_PASSWORD_FILE": "/nonexistent"}), nil)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Errorf("env DSN: %v", err)
	}
}

func TestPassword(t *testing.T) {
	c := mustLoad(t, writeConfig(t, minimal), nil, "source.password_env=DB_PW")
	pw, err := c.Password(envMap(map[string]string{"DB_PW": "from-env"}))
	if err != nil || pw != "from-env" {
		t.Errorf("Password from env = %q, %v", pw, err)
	}
	_, err = c.Password(envMap(nil))
	var ce *ConfigError
	if !errors.As(err, &ce) || ce.Key != "source.password_env" {
		t.Fatalf("missing env: %v", err)
	}
	wantContains(t, err.Error(), "environment variable DB_PW is not set")

	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("from file \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = mustLoad(t, writeConfig(t, minimal), nil, "source.password_file="+file)
	if pw, err := c.Password(nil); err != nil || pw != "from file " {
		t.Errorf("Password from file = %q, %v (only the trailing newline is trimmed)", pw, err)
	}
	if err := os.WriteFile(file, []byte("crlf\r\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if pw, _ := c.Password(nil); pw != "crlf" {
		t.Errorf("CRLF file: %q", pw)
	}
	if err := os.WriteFile(file, []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Password(nil); err == nil || !strings.Contains(err.Error(), "is empty") {
		t.Errorf("empty file: %v", err)
	}
	c.Source.PasswordFile = filepath.Join(t.TempDir(), "absent")
	_, err = c.Password(nil)
	wantContains(t, err.Error(), "source.password_file", "absent", "no such file")

	c = mustLoad(t, writeConfig(t, minimal), nil)
	if pw, err := c.Password(nil); pw != "" || err != nil {
		t.Errorf("no password source: %q, %v", pw, err)
	}
}

func TestFingerprint(t *testing.T) {
	base := mustLoad(t, writeConfig(t, minimal), nil)
	sum, fields := base.Fingerprint()
	if !regexp.MustCompile(`^[0-9a-f]{32}$`).MatchString(sum) {
		t.Fatalf("fingerprint %q is not 32 hex digits", sum)
	}
	again, _ := mustLoad(t, writeConfig(t, minimal), nil).Fingerprint()
	if again != sum {
		t.Errorf("fingerprint not stable: %s then %s", sum, again)
	}
	want := map[string]string{
		"name": "orders-sync", "source.kind": "postgres", "source.dsn.host": "db.example.com",
		"source.dsn.dbname": "shop", "source.schema": "public", "source.table": "orders",
		"source.id_column": "id", "source.updated_at_column": "updated_at", "source.deleted_at_column": "",
		"source.columns": "", "source.filter": "", "source.initial_load": "moving", "kafka.topic": "orders",
	}
	if !reflect.DeepEqual(fields, want) {
		t.Errorf("fields\n got %v\nwant %v", fields, want)
	}

	// Tuning knobs and credentials do not change it.
	for _, o := range [][]string{
		{"sync.page_size=10"}, {"sync.margin=1m"}, {"sync.txn_max_records=99999"},
		{"sync.txn_max_bytes=1MiB"}, {"sync.poll_interval=1m"}, {"sync.dedupe_max_entries=5"},
		{"log.level=debug"}, {"kafka.partitions=12"}, {"kafka.ledger_topic=l2"}, {"kafka.offsets_topic=o2"}, {"kafka.brokers=x:1"},
		{"source.dsn=postgres://other:pw@DB.example.com:6543/shop?sslmode=require"},
		{"source.password_env=PW"}, {"kafka.topic=orders"}, {"source.horizon=true"},
	} {
		s, _ := mustLoad(t, writeConfig(t, minimal), nil, o...).Fingerprint()
		if s != sum {
			t.Errorf("%v changed the fingerprint", o)
		}
	}
	// Data-set keys do.
	for _, o := range [][]string{
		{"source.table=orders2"}, {"name=other"}, {"source.schema=s"}, {"source.id_column=oid"},
		{"source.updated_at_column=ts"}, {"source.deleted_at_column=gone"}, {"source.columns=id,x"},
		{"source.filter=x>1"}, {"source.initial_load=consistent"}, {"kafka.topic=t2"},
		{"source.dsn=postgres://u@other-host/shop"}, {"source.dsn=postgres://u@db.example.com/shop2"},
	} {
		s, f := mustLoad(t, writeConfig(t, minimal), nil, o...).Fingerprint()
		if s == sum {
			t.Errorf("%v did not change the fingerprint", o)
		}
		if len(DiffFingerprint(fields, f)) == 0 {
			t.Errorf("%v: DiffFingerprint found no change", o)
		}
	}
	// Keyword and URL forms of the same target agree.
	s, _ := mustLoad(t, writeConfig(t, minimal), nil, "source.dsn=host=db.example.com port=5432 dbname=shop user=x").Fingerprint()
	if s != sum {
		t.Error("keyword DSN with the same host and dbname changed the fingerprint")
	}
	// Defaults are applied to a copy: an un-defaulted config agrees.
	raw := &Config{Name: "orders-sync", Source: SourceConfig{DSN: "postgres://tidemark@db.example.com:5432/shop", Table: "orders"}}
	if s, _ := raw.Fingerprint(); s != sum {
		t.Error("Fingerprint of an un-defaulted config differs")
	}
	if raw.Sync.PageSize != 0 {
		t.Error("Fingerprint modified its receiver")
	}

	_, f2 := mustLoad(t, writeConfig(t, minimal), nil, "source.table=orders2", "kafka.topic=orders").Fingerprint()
	got := DiffFingerprint(fields, f2)
	if !slices.Equal(got, []string{`source.table: "orders" -> "orders2"`}) {
		t.Errorf("DiffFingerprint = %q", got)
	}
	got = DiffFingerprint(map[string]string{"a": "1", "b": "2"}, map[string]string{"b": "3", "c": ""})
	if !slices.Equal(got, []string{`a: "1" -> (unset)`, `b: "2" -> "3"`, `c: (unset) -> ""`}) {
		t.Errorf("DiffFingerprint = %q", got)
	}

	httpCfg := mustLoad(t, writeConfig(t, "name: a\nsource:\n  kind: http\n  dsn: https://u:p@API.example.com:8443/v1/changes?token=t\nkafka:\n  topic: x\n"), nil)
	_, hf := httpCfg.Fingerprint()
	if hf["source.dsn.host"] != "api.example.com" || hf["source.dsn.path"] != "/v1/changes" {
		t.Errorf("http fingerprint fields %v", hf)
	}
}

func TestYAMLRoundTrip(t *testing.T) {
	c := mustLoad(t, writeConfig(t, minimal), nil,
		"source.columns=id,name", "sync.margin=0s", "kafka.brokers=a:1,b:2", "source.filter=x = 'y: z'")
	y, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back := mustLoad(t, writeConfig(t, string(y)), nil)
	c.origin, back.origin = nil, nil
	if !reflect.DeepEqual(c, back) {
		t.Errorf("round trip differs:\n%s\n got %+v\nwant %+v", y, back, c)
	}
}

// TestExampleConfig loads tidemark.example.yaml: it must validate, mention
// every key, and show the code's defaults.
func TestExampleConfig(t *testing.T) {
	const path = "../../tidemark.example.yaml"
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	c := mustLoad(t, path, nil)
	for _, k := range ConfigKeys() {
		if _, set := c.origin[k]; set {
			continue
		}
		leaf := k[strings.LastIndexByte(k, '.')+1:]
		if !regexp.MustCompile(`(?m)^\s*#\s*` + regexp.QuoteMeta(leaf) + `:`).Match(text) {
			t.Errorf("the example does not show key %s", k)
		}
	}
	fresh := &Config{Source: SourceConfig{Table: c.Source.Table}}
	fresh.ApplyDefaults()
	for k, def := range defaults {
		f := configFields().byKey[k]
		if got, want := f.value(c).Interface(), f.value(fresh).Interface(); !reflect.DeepEqual(got, want) {
			t.Errorf("example shows %s = %v, the default is %v (%s)", k, got, want, def)
		}
	}
	if c.Kafka.Topic != c.Source.Table {
		t.Errorf("example topic %q should equal its default, source.table %q", c.Kafka.Topic, c.Source.Table)
	}
	// Every key with a default is commented with it nearby; spot-check the
	// values the code cannot infer.
	for _, s := range []string{"page_size: 1000", "margin: 10s", "txn_max_bytes: 16MiB", "1..100000", "0..1"} {
		if !strings.Contains(string(text), s) {
			t.Errorf("example lacks %q", s)
		}
	}
}

func TestConfigErrorFormat(t *testing.T) {
	e := &ConfigError{Key: "sync.page_size", Origin: "f.yaml:3", Msg: "bad"}
	if e.Error() != "f.yaml:3: sync.page_size: bad" {
		t.Errorf("%q", e.Error())
	}
	inner := errors.New("boom")
	e = &ConfigError{Msg: "read config file", Err: inner}
	if e.Error() != "read config file: boom" || !errors.Is(e, inner) {
		t.Errorf("%q", e.Error())
	}
}

func TestSuggestKey(t *testing.T) {
	for in, want := range map[string]string{
		"source.tabel":        "source.table",
		"source.id_colum":     "source.id_column",
		"sync.pagesize":       "sync.page_size",
		"kafka.brokers_list":  "kafka.brokers",
		"log.lvl":             "log.level",
		"source.updated_at":   "source.updated_at_column",
		"data-dir":            "data_dir",
		"kafka.offset_topic":  "kafka.offsets_topic",
		"totally.unrelated.x": "",
	} {
		if got := suggestKey(in, false); got != want {
			t.Errorf("suggestKey(%q) = %q, want %q", in, got, want)
		}
	}
}

// leaks reports whether out reveals pw: pw appears in out, and not merely
// because the text around it already contained it.
func leaks(out, pw, skeleton string) bool {
	return len(pw) >= 3 && strings.Contains(out, pw) && !strings.Contains(skeleton, pw)
}

// FuzzRedactDSN embeds an arbitrary password, unencoded, in each DSN form
// and checks that RedactDSN never shows it.
func FuzzRedactDSN(f *testing.F) {
	for _, s := range []string{"hunter2", "p@ss/w?rd#x", "a'b\\c d", "x:y@z", "REDACTED", "12/ss"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, pw string) {
		quoted := "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw) + "'"
		for _, tc := range []struct{ dsn, skeleton string }{
			{"postgres://user:" + pw + "@db.example.com:5432/shop?sslmode=require", "postgres://user:REDACTED@db.example.com:5432/shop?sslmode=require"},
			{"postgres://user@db.example.com/shop?password=" + url.QueryEscape(pw), "postgres://user@db.example.com/shop?password=REDACTED"},
			{"host=db.example.com password=" + quoted + " dbname=shop", "host=db.example.com password=REDACTED dbname=shop"},
		} {
			if out := RedactDSN(tc.dsn); leaks(out, pw, tc.skeleton) {
				t.Errorf("RedactDSN(%q) = %q shows the password", tc.dsn, out)
			}
		}
	})
}

// Item 10: absurd values are refused with a reason (a 1ns poll interval
// is a hot loop; a margin of years re-reads the table on every pass), and
// merely unusual ones are warned about.
func TestAbsurdValues(t *testing.T) {
	path := writeConfig(t, minimal)
	for _, tc := range []struct {
		set  string
		want string
	}{
		{"sync.poll_interval=1ns", "sync.poll_interval: 1ns is below 10ms"},
		{"sync.poll_interval=9ms", "sync.poll_interval: 9ms is below 10ms"},
		{"sync.margin=100000h", "sync.margin: 100000h0m0s is more than 168h"},
	} {
		_, err := LoadConfig(path, envMap(nil), []string{tc.set})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.set, err, tc.want)
		}
	}
	for set, warn := range map[string]string{
		"sync.margin=2h":          "sync.margin",
		"sync.poll_interval=50ms": "sync.poll_interval",
		"sync.margin=10s":         "",
	} {
		c := mustLoad(t, path, nil, set)
		got := strings.Join(c.Warnings(), "\n")
		if (warn == "") != (got == "") || !strings.Contains(got, warn) {
			t.Errorf("%s: warnings %q, want one naming %q", set, got, warn)
		}
	}
}

// The YAML module is go.yaml.in/yaml/v3: gopkg.in/yaml.v3 is archived.
func TestYAMLModuleNotArchived(t *testing.T) {
	b, err := os.ReadFile("../../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "gopkg.in/yaml.v3") || !strings.Contains(string(b), "go.yaml.in/yaml/v3 v") {
		t.Errorf("go.mod must require go.yaml.in/yaml/v3 and not the archived gopkg.in/yaml.v3:\n%s", b)
	}
}

// Every default the README states next to a key, as "`key` (default X)",
// "`key`, default `X`" or "`key` (X)", is the code's default.
func TestREADMEDefaults(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("`([a-z_]+\\.[a-z_.]+)`(?: \\(default:? `?|, default `| \\()([^`),;]+)")
	n := 0
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		key, stated := m[1], strings.TrimSpace(m[2])
		def, ok := ConfigDefault(key)
		if !ok || strings.Contains(stated, " ") && !strings.HasPrefix(stated, def) {
			continue // a key without a fixed default, or prose ("the table name", "broker default")
		}
		n++
		same := stated == def
		if d1, e1 := time.ParseDuration(stated); e1 == nil {
			d2, e2 := time.ParseDuration(def)
			same = e2 == nil && d1 == d2
		}
		if !same {
			t.Errorf("README says %s defaults to %q; ConfigDefault says %q", key, stated, def)
		}
	}
	if n < 3 {
		t.Errorf("checked only %d stated defaults", n)
	}
}

// A file that is not valid YAML is reported as that alone, not also as
// every required key it would have set.
func TestInvalidYAMLOnlyParseError(t *testing.T) {
	for name, text := range map[string]string{
		"syntax":      minimal + "sync:\n  page_size: [1\n",
		"tab":         "name: x\nsource:\n\ttable: t\n",
		"not mapping": "- a\n- b\n",
	} {
		t.Run(name, func(t *testing.T) {
			got := loadErr(t, writeConfig(t, text), nil)
			if strings.Contains(got, "required") || strings.Count(got, "\n") > 0 {
				t.Errorf("want only the file's error, got:\n%s", got)
			}
		})
	}
}

// TestExampleConfigNoWarnings: a copy of the example starts without a
// warning.
func TestExampleConfigNoWarnings(t *testing.T) {
	c := mustLoad(t, "../../tidemark.example.yaml", nil)
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("the example configuration warns: %q", w)
	}
	// Setting notify_min_gap or notify_lookback to its default without
	// notify is harmless.
	c = mustLoad(t, writeConfig(t, minimal+"  notify_min_gap: 20ms\n  notify_lookback: 100ms\n"), nil)
	if w := c.Warnings(); len(w) != 0 {
		t.Errorf("notify_min_gap or notify_lookback at its default warns: %q", w)
	}
}

// TestGroupTimeoutsWithinClientLimits: group.session_timeout and
// group.rebalance_timeout are refused (exit 2, naming the key and a value
// to use) unless the Kafka client accepts them, and every accepted value
// is accepted by the client.
func TestGroupTimeoutsWithinClientLimits(t *testing.T) {
	for _, key := range []string{"group.session_timeout", "group.rebalance_timeout"} {
		for _, v := range []string{"0s", "50ms", "-1s", "600h"} {
			got := loadErr(t, writeConfig(t, minimal), nil, key+"="+v)
			wantContains(t, got, key, "use")
		}
	}
	for _, v := range []string{"1s", "45s", "596h"} {
		c := mustLoad(t, writeConfig(t, minimal), nil, "group.session_timeout="+v, "group.rebalance_timeout="+v)
		cl, err := kgo.NewClient(append(groupTimeouts(c.Group), kgo.SeedBrokers("127.0.0.1:1"), kgo.ConsumerGroup("g"), kgo.ConsumeTopics("t"))...)
		if err != nil {
			t.Errorf("%s accepted by validation, refused by the client: %v", v, err)
			continue
		}
		cl.Close()
	}
}

// TestMemoryLimitLeavesRoomForTheSweep: run's soft memory limit is 256
// MiB, and while a sweep runs it makes room for the sweep's key set
// (sweep.max_keys_in_memory keys of about 56 bytes; 64 counted), for each
// sweep running at once, then goes back. A limit of 256 MiB in all sat
// just above the default budget's 212 MiB: a sweep that filled it kept
// the collector running. In a container it stays below 80% of the
// container's limit; a limit tidemark did not set is never moved.
func TestMemoryLimitLeavesRoomForTheSweep(t *testing.T) {
	const mib = 1 << 20
	var got int64
	m := &memLimit{set: func(n int64) { got = n }}
	if m.sweep(4_000_000)(); got != 0 {
		t.Fatalf("a limit tidemark did not set was moved to %d", got)
	}
	m.start(256*mib, 0)
	if got != 256*mib {
		t.Fatalf("limit %d MiB, want 256", got/mib)
	}
	one := m.sweep(4_000_000)
	if want := int64(256*mib + 4_000_000*64); got != want {
		t.Errorf("during a sweep of 4,000,000 keys: limit %d MiB, want %d", got/mib, want/mib)
	}
	two := m.sweep(100_000)
	if want := int64(256*mib + 4_100_000*64); got != want {
		t.Errorf("during two sweeps: limit %d MiB, want %d", got/mib, want/mib)
	}
	one()
	two()
	if got != 256*mib {
		t.Errorf("after the sweeps: limit %d MiB, want 256", got/mib)
	}
	m.start(256*mib, 512*mib) // deploy/kubernetes: a 512 MiB container
	m.sweep(4_000_000)
	if got != 512*mib/5*4 {
		t.Errorf("a sweep in a 512 MiB container: limit %d MiB, want 409", got/mib)
	}
}

// TestPlainHTTPCredentialWarned: a changes API credential (an auth header,
// or the URL's user, which is sent as basic auth) over plain http to
// another host crosses the network readable; it is warned of at start.
// Over https, or to a loopback address, it is not.
func TestPlainHTTPCredentialWarned(t *testing.T) {
	for _, tc := range []struct {
		dsn, auth string
		warn      bool
	}{
		{"http://api.example.com/v1/changes", "Authorization", true},
		{"http://key@api.example.com/v1/changes", "", true},
		{"http://10.1.2.3:8080/v1/changes", "X-Api-Key", true},
		{"https://api.example.com/v1/changes", "Authorization", false},
		{"http://api.example.com/v1/changes", "", false},
		{"http://127.0.0.1:8080/v1/changes", "Authorization", false},
		{"http://localhost:8080/v1/changes", "Authorization", false},
		{"http://[::1]:8080/v1/changes", "Authorization", false},
		{"http://LOCALHOST.:8080/v1/changes", "Authorization", false},
		{"http://@api.example.com/v1/changes", "", false},
	} {
		text := "name: api\nsource:\n  kind: http\n  dsn: " + tc.dsn + "\n"
		if tc.auth != "" {
			text += "  http:\n    auth_header: " + tc.auth + "\n    auth_value_env: API_KEY\n"
		}
		c := mustLoad(t, writeConfig(t, text+"kafka:\n  topic: things\n"), nil)
		got := strings.Join(c.Warnings(), "\n")
		if tc.warn != strings.Contains(got, "plain http") {
			t.Errorf("%s (auth header %q): warnings %q; want a plain-http warning: %v", tc.dsn, tc.auth, got, tc.warn)
		}
		if strings.Contains(got, "key@") {
			t.Errorf("%s: the warning shows the URL's user: %q", tc.dsn, got)
		}
	}
}
