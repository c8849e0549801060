package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
)

// The security tests run the CLI against an in-process kfake cluster with
// SASL/SCRAM and ACLs enabled: a superuser (to inspect the topics) and the
// connector's user, granted exactly the ACLs docs/operating.md lists, or
// those minus one.

const (
	secName      = "sec-sync"
	secTopic     = "sec-topic"
	secUser      = "tidemark-sec"
	secPassword  = "Kafka-S3cret-pw-123"
	adminUser    = "admin"
	adminPass    = "admin-pw-456"
	secMechanism = "SCRAM-SHA-256"
)

type secACL struct {
	rt   kmsg.ACLResourceType
	name string
	op   kmsg.ACLOperation
}

func (a secACL) String() string { return fmt.Sprintf("%s %s %s", a.op, a.rt, a.name) }

// connectorACLs are the ACLs docs/operating.md documents for a connector
// named secName writing secTopic.
func connectorACLs() []secACL {
	var acls []secACL
	for _, topic := range []string{secTopic, "tidemark-offsets", "tidemark-ledger"} {
		for _, op := range []kmsg.ACLOperation{kmsg.ACLOperationDescribe, kmsg.ACLOperationDescribeConfigs,
			kmsg.ACLOperationCreate, kmsg.ACLOperationRead, kmsg.ACLOperationWrite} {
			acls = append(acls, secACL{kmsg.ACLResourceTypeTopic, topic, op})
		}
	}
	txn := producer.TransactionalID(secName)
	acls = append(acls,
		secACL{kmsg.ACLResourceTypeTransactionalId, txn, kmsg.ACLOperationDescribe},
		secACL{kmsg.ACLResourceTypeTransactionalId, txn, kmsg.ACLOperationWrite})
	return acls
}

// secWorld is a PostgreSQL table with rows and a SASL+ACL kfake cluster.
type secWorld struct {
	*cliWorld
	cluster *kfake.Cluster
	brokers []string
}

// newSecWorld starts a cluster whose connector user has the documented
// ACLs except those for which drop returns true.
func newSecWorld(t *testing.T, drop func(secACL) bool) *secWorld {
	t.Helper()
	w := newCLIWorld(t)
	var seeded []kfake.ACL
	for _, a := range connectorACLs() {
		if drop != nil && drop(a) {
			continue
		}
		seeded = append(seeded, kfake.ACL{Resource: a.rt, Name: a.name, Pattern: kmsg.ACLResourcePatternTypeLiteral, Operation: a.op, Allow: true})
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser(secMechanism, adminUser, adminPass),
		kfake.User(secMechanism, secUser, secPassword, seeded...))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return &secWorld{cliWorld: w, cluster: c, brokers: c.ListenAddrs()}
}

// config writes a config file using SASL with the password in a file.
func (w *secWorld) config(file, password string) string {
	w.t.Helper()
	pwFile := filepath.Join(w.dir, file+".kafka-password")
	if err := os.WriteFile(pwFile, []byte(password+"\n"), 0o600); err != nil {
		w.t.Fatal(err)
	}
	text := fmt.Sprintf(`name: %s
source:
  dsn: %q
  schema: %s
  table: items
  deleted_at_column: deleted_at
kafka:
  brokers: [%s]
  topic: %s
  partitions: 2
  sasl:
    mechanism: %s
    username: %s
    password_file: %s
sync:
  page_size: 2
  poll_interval: 50ms
  poll_jitter: 0
log:
  level: warn
  format: text
`, secName, w.dsn, w.db.Schema, strings.Join(w.brokers, ", "), secTopic, secMechanism, secUser, pwFile)
	path := filepath.Join(w.dir, file)
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		w.t.Fatal(err)
	}
	return path
}

// cli runs the CLI and checks that no output holds either password.
func (w *secWorld) cli(args ...string) (code int, stdout, stderr string) {
	w.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	code, stdout, stderr = w.cliWorld.cli(ctx, args...)
	for _, s := range []string{stdout, stderr} {
		if strings.Contains(s, secPassword) {
			w.t.Errorf("tidemark %s printed the Kafka password:\n%s", args[0], s)
		}
	}
	return code, stdout, stderr
}

func (w *secWorld) adminOpts() []kgo.Opt {
	return []kgo.Opt{kgo.SeedBrokers(w.brokers...),
		kgo.SASL(scram.Auth{User: adminUser, Pass: adminPass}.AsSha256Mechanism())}
}

// dataRecords folds the data topic as the superuser and returns how many
// records it holds (0 when the topic does not exist).
func (w *secWorld) dataRecords() int {
	w.t.Helper()
	ctx := context.Background()
	cl, err := kgo.NewClient(w.adminOpts()...)
	if err != nil {
		w.t.Fatal(err)
	}
	defer cl.Close()
	topics, err := kadm.NewClient(cl).ListTopics(ctx, secTopic)
	if err != nil {
		w.t.Fatal(err)
	}
	if !topics.Has(secTopic) {
		return 0
	}
	st, err := fold.Map(ctx, w.adminOpts(), secTopic)
	if err != nil {
		w.t.Fatal(err)
	}
	return st.Records
}

// TestSecuritySASLWithACLs: the documented ACLs are enough: run --once
// syncs the table, and check and status show the password redacted.
func TestSecuritySASLWithACLs(t *testing.T) {
	w := newSecWorld(t, nil)
	cfg := w.config("ok.yaml", secPassword)
	code, out, errOut := w.cli("run", "--config", cfg, "--once")
	if code != exitOK {
		t.Fatalf("run with the documented ACLs: exit %d\n%s\n%s", code, out, errOut)
	}
	if n := w.dataRecords(); n != 7 {
		t.Errorf("data topic holds %d records, want 7", n)
	}
	for _, cmd := range []string{"check", "status"} {
		code, out, errOut := w.cli(cmd, "--config", cfg)
		if code != exitOK {
			t.Fatalf("%s: exit %d\n%s\n%s", cmd, code, out, errOut)
		}
		if !strings.Contains(out, "sasl SCRAM-SHA-256 user "+secUser+" password REDACTED") {
			t.Errorf("%s does not show the SASL settings redacted:\n%s", cmd, out)
		}
	}
}

// TestSecurityWrongPassword: a wrong SASL password exits 2 with a message
// naming the user and where the password came from; nothing is written.
func TestSecurityWrongPassword(t *testing.T) {
	w := newSecWorld(t, nil)
	code, out, errOut := w.cli("run", "--config", w.config("bad.yaml", "not-the-password"), "--once")
	if code != exitConfig {
		t.Fatalf("exit %d, want %d\n%s\n%s", code, exitConfig, out, errOut)
	}
	t.Logf("stderr:\n%s", errOut)
	for _, want := range []string{"kafka.sasl", "rejected the SASL login", secUser, "bad.yaml.kafka-password", "nothing past the last committed checkpoint was written"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if strings.Contains(errOut, "not-the-password") {
		t.Errorf("stderr shows the wrong password:\n%s", errOut)
	}
	if n := w.dataRecords(); n != 0 {
		t.Errorf("data topic holds %d records after a refused login", n)
	}
}

// TestSecurityWrongPasswordEveryCommand: every command that talks to Kafka
// turns a refused SASL login into exit 2 naming kafka.sasl, not exit 1 with
// "list end offsets ...: EOF".
func TestSecurityWrongPasswordEveryCommand(t *testing.T) {
	w := newSecWorld(t, nil)
	cfg := w.config("bad.yaml", "not-the-password")
	for _, args := range [][]string{
		{"run", "--once"}, {"check"}, {"status"}, {"ledger"}, {"verify"}, {"sweep"},
		{"replica", "--target-table", "items_replica", "--once"}, {"reset", "--yes"},
	} {
		code, _, errOut := w.cli(append(args, "--config", cfg)...)
		if code != exitConfig || !strings.Contains(errOut, "kafka.sasl") || !strings.Contains(errOut, "rejected the SASL login") {
			t.Errorf("%v: exit %d, want %d naming kafka.sasl\n%s", args, code, exitConfig, errOut)
		}
		if strings.Contains(errOut, "not-the-password") {
			t.Errorf("%v: stderr shows the wrong password:\n%s", args, errOut)
		}
	}
}

// TestSecurityMissingACL: without one of the documented ACLs the run exits
// 2, says what to grant, and writes nothing to the data topic.
func TestSecurityMissingACL(t *testing.T) {
	txn := producer.TransactionalID(secName)
	for _, tc := range []struct {
		name string
		drop func(secACL) bool
		want []string
	}{
		{"no WRITE on the data topic", func(a secACL) bool {
			return a.name == secTopic && a.op == kmsg.ACLOperationWrite
		}, []string{"kafka ACLs", "TOPIC_AUTHORIZATION_FAILED", "User:" + secUser + " lacks WRITE on topic " + secTopic}},
		{"no transactional id ACL", func(a secACL) bool {
			return a.rt == kmsg.ACLResourceTypeTransactionalId
		}, []string{"kafka ACLs", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "WRITE on TransactionalId " + txn}},
		// READ and WRITE imply DESCRIBE (as in Kafka), so drop them all.
		{"no ACLs on the offsets topic", func(a secACL) bool {
			return a.name == "tidemark-offsets"
		}, []string{"kafka ACLs", "TOPIC_AUTHORIZATION_FAILED", "lacks DESCRIBE on topic tidemark-offsets"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newSecWorld(t, tc.drop)
			code, out, errOut := w.cli("run", "--config", w.config("acl.yaml", secPassword), "--once")
			if code != exitConfig {
				t.Fatalf("exit %d, want %d\n%s\n%s", code, exitConfig, out, errOut)
			}
			t.Logf("stderr:\n%s", errOut)
			for _, want := range append(tc.want, "nothing past the last committed checkpoint was written") {
				if !strings.Contains(errOut, want) {
					t.Errorf("stderr lacks %q:\n%s", want, errOut)
				}
			}
			if n := w.dataRecords(); n != 0 {
				t.Errorf("data topic holds %d records (folded as superuser); want none", n)
			}
		})
	}
}

// TestPostgresTLSWarning: a non-loopback host without verify-full warns.
func TestPostgresTLSWarning(t *testing.T) {
	env := func(string) string { return "" }
	for dsn, warn := range map[string]bool{
		"postgres://u@db.example.com:5432/shop?sslmode=require":                    true,
		"postgres://u@db.example.com:5432/shop":                                    true,
		"postgres://u@db.example.com:5432/shop?sslmode=verify-full":                false,
		"postgres://u@localhost:5432/shop?sslmode=disable":                         false,
		"postgres://u@127.0.0.1/shop":                                              false,
		"postgres://u@[::1]:5432/shop":                                             false,
		"host=/var/run/postgresql dbname=shop":                                     false,
		"host=10.0.0.5 dbname=shop sslmode=verify-ca":                              true,
		"host=10.0.0.5 dbname=shop sslmode=verify-full":                            false,
		"postgres://u@localhost,db2.example.com/shop?sslmode=prefer":               true,
		"postgres:///shop?host=/tmp":                                               false,
		"dbname=shop":                                                              false,
		"postgres://u@db.example.com/shop?sslmode=verify-full&sslrootcert=/ca.pem": false,
	} {
		if got := postgresTLSWarning(dsn, env) != ""; got != warn {
			t.Errorf("%s: warning %v, want %v", dsn, got, warn)
		}
	}
	if postgresTLSWarning("dbname=shop", func(k string) string {
		return map[string]string{"PGHOST": "db.example.com", "PGSSLMODE": "require"}[k]
	}) == "" {
		t.Errorf("PGHOST and PGSSLMODE are not taken into account")
	}
}

// TestSecurityConfigErrors: the SASL and TLS keys are validated up front.
func TestSecurityConfigErrors(t *testing.T) {
	base := []string{"name=n", "source.dsn=postgres://u@localhost/db", "source.table=t"}
	for _, tc := range []struct {
		sets []string
		want string
	}{
		{[]string{"kafka.brokers=k:9092", "kafka.sasl.mechanism=SCRAM-SHA-1", "kafka.sasl.username=u", "kafka.sasl.password_env=P"}, `kafka.sasl.mechanism: "SCRAM-SHA-1" is not supported`},
		{[]string{"kafka.brokers=k:9092", "kafka.sasl.mechanism=PLAIN", "kafka.sasl.username=u"}, "kafka.sasl.password_env: required"},
		{[]string{"kafka.brokers=k:9092", "kafka.sasl.username=u"}, "kafka.sasl.username: is set but kafka.sasl.mechanism is not"},
		{[]string{"kafka.sasl.mechanism=PLAIN", "kafka.sasl.username=u", "kafka.sasl.password_env=P"}, "kafka.brokers is empty"},
		{[]string{"kafka.brokers=k:9092", "kafka.tls.cert_file=/c.pem"}, "kafka.tls.key_file: kafka.tls.cert_file and kafka.tls.key_file go together"},
		{[]string{"metrics.listen=9464"}, `metrics.listen: "9464" is not host:port`},
	} {
		_, err := LoadConfig("", func(string) string { return "" }, append(append([]string{}, base...), tc.sets...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.sets, err, tc.want)
		}
	}
}

// TestMistypedOverrideDoesNotPrintItsSecret: a --set written with a space
// or a colon instead of '=' is a usage error that quotes what it did not
// understand; a DSN password in it must not reach stderr.
func TestMistypedOverrideDoesNotPrintItsSecret(t *testing.T) {
	const pw = "S3cretPw42"
	path := writeConfig(t, "name: x\nsource:\n  dsn: postgres://u@h/db\n  table: t\n")
	for _, args := range [][]string{
		{"check", "--config", path, "--set", "source.dsn", "postgres://u:" + pw + "@h/db"},
		{"check", "--config", path, "--set", "source.dsn: postgres://u:" + pw + "@h/db?sslmode=require"},
		{"check", "--config", path, "--set", "postgres://u:" + pw + "@h/db"},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), args, &out, &errb)
		if code != exitConfig || strings.Contains(errb.String()+out.String(), pw) {
			t.Errorf("%q: exit %d, want %d and no password; stderr:\n%s", args[3:], code, exitConfig, errb.String())
		}
	}
}

// TestLedgerEntryRedactsItsDetail: a run that resumed an open pass names
// the cursor it resumed from in its ledger entry's detail; with link
// pagination that cursor is a URL carrying the endpoint's query, whose
// secret `tidemark ledger` must not print, as text or JSON.
func TestLedgerEntryRedactsItsDetail(t *testing.T) {
	const secret = "Api-K3y-S3cret"
	link := "https://api.example.com/v1/changes?api_key=" + secret + "&cursor=c7"
	for _, asJSON := range []bool{false, true} {
		var b bytes.Buffer
		printLedgerEntry(&b, &schemas.LedgerEntry{Kind: schemas.LedgerRun, RunID: "r", Reason: "resumed",
			Detail: fmt.Sprintf("resumed: phase pass, watermark 2026-01-01T00:00:00.000000Z, cursor %q, seq 4", link), RequestCursor: link}, asJSON)
		printLedgerEntry(&b, &schemas.LedgerEntry{Kind: schemas.LedgerReset, Why: "rejected " + link}, asJSON)
		if strings.Contains(b.String(), secret) || !strings.Contains(b.String(), "api_key=REDACTED") {
			t.Errorf("json %v: the ledger prints:\n%s", asJSON, b.String())
		}
	}
}

// TestResetToAFutureWatermarkIsRefused: a reset to a watermark in the
// future would have every row changed before it never read again; it is a
// usage error before anything is contacted.
func TestResetToAFutureWatermarkIsRefused(t *testing.T) {
	path := writeConfig(t, "name: x\nsource:\n  dsn: postgres://u@127.0.0.1:1/db\n  table: t\nkafka:\n  brokers: [\"127.0.0.1:1\"]\n")
	future := time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	var out, errb bytes.Buffer
	code := run(context.Background(), []string{"reset", "--config", path, "--to-watermark", future, "--yes"}, &out, &errb)
	if code != exitConfig || !strings.Contains(errb.String(), "--to-watermark") || !strings.Contains(errb.String(), "future") {
		t.Errorf("reset to %s: exit %d, want %d naming --to-watermark and the future; stderr:\n%s", future, code, exitConfig, errb.String())
	}
}

// TestSecuritySASLPasswordRotation: kafka.sasl.password_file is read for
// every login, not once at start: after the password is rotated (the file
// rewritten and the user's SCRAM credentials changed), the connections
// tidemark opens next (a new producer session, a reconnect after the
// broker restarts) log in with the new password.
func TestSecuritySASLPasswordRotation(t *testing.T) {
	w := newSecWorld(t, nil)
	opts, err := loadedCLI(t, w.config("rot.yaml", secPassword)).securityOpts()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	login := func() error { return kafkaPing(ctx, opts, w.brokers) }
	if err := login(); err != nil {
		t.Fatalf("login with the first password: %v", err)
	}
	const rotated = "Kafka-R0tated-pw-789"
	admin, err := kgo.NewClient(w.adminOpts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	res, err := kadm.NewClient(admin).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{{User: secUser, Mechanism: kadm.ScramSha256, Iterations: 4096, Password: rotated}})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		t.Fatalf("rotate the SCRAM password: %v", err)
	}
	if err := os.WriteFile(filepath.Join(w.dir, "rot.yaml.kafka-password"), []byte(rotated+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := login(); err != nil {
		t.Fatalf("login after the rotation, with the same options: %v (the password file was read once, at start)", err)
	}
}

// loadedCLI is the cli of the configuration file at path, loaded as a
// command loads it (with no environment), logging nowhere: for tests of
// what tidemark builds from a configuration.
func loadedCLI(t *testing.T, path string) *cli {
	t.Helper()
	cfg, err := LoadConfig(path, func(string) string { return "" }, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &cli{cfg: cfg, env: func(string) string { return "" }, log: slog.New(slog.DiscardHandler)}
}

// kafkaPing connects a new client with opts to brokers and pings them: a
// fresh connection and login, as a new producer session or a reconnect
// makes one.
func kafkaPing(ctx context.Context, opts []kgo.Opt, brokers []string) error {
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.SeedBrokers(brokers...), kgo.RetryTimeout(3*time.Second))...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

// A SASL login that failed (the broker closed the connection) labels the
// errors that follow as a refused login only until a login goes through:
// during a rotation a refusal is routine, and a later, unrelated failure
// must not be reported as one (exit 2). A SASLAuthenticate answered (the
// first of SCRAM's two rounds, on another connection) proves no login.
func TestSASLRejectionIsForgottenAfterALogin(t *testing.T) {
	w := &saslWatch{}
	w.OnBrokerRead(kgo.BrokerMetadata{}, int16(kmsg.SASLAuthenticate), 0, 0, 0, io.EOF)
	if !w.rejected.Load() {
		t.Fatal("a failed SASLAuthenticate read was not noted")
	}
	for _, k := range []kmsg.Key{kmsg.SASLAuthenticate, kmsg.SASLHandshake, kmsg.ApiVersions} {
		w.OnBrokerRead(kgo.BrokerMetadata{}, int16(k), 0, 0, 0, nil)
		if !w.rejected.Load() {
			t.Fatalf("an answered %s cleared the noted refusal: it proves no login", k.Name())
		}
	}
	w.OnBrokerRead(kgo.BrokerMetadata{}, int16(kmsg.Metadata), 0, 0, 0, nil)
	if w.rejected.Load() {
		t.Fatal("a request answered after a login did not clear the noted refusal")
	}
}
