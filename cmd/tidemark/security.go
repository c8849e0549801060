package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/producer"
)

// KafkaTLSConfig configures TLS to the brokers (kafka.tls.*).
type KafkaTLSConfig struct {
	// Enabled turns TLS on, verifying the brokers against the system roots
	// (or CAFile). Setting any other kafka.tls key turns it on too. Default
	// false.
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM file of CA certificates that replaces the system roots.
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile are a PEM client certificate and its key, for
	// mutual TLS. Set both or neither.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// ServerName overrides the host name verified in the brokers'
	// certificates. Default: the host of each broker address.
	ServerName string `yaml:"server_name"`
}

// On reports whether TLS is configured.
func (t KafkaTLSConfig) On() bool {
	return t.Enabled || t.CAFile != "" || t.CertFile != "" || t.KeyFile != "" || t.ServerName != ""
}

// KafkaSASLConfig configures SASL authentication (kafka.sasl.*). The
// password is never in the file: it comes from PasswordEnv or PasswordFile.
type KafkaSASLConfig struct {
	// Mechanism is "" (default: no SASL), PLAIN, SCRAM-SHA-256 or
	// SCRAM-SHA-512.
	Mechanism string `yaml:"mechanism"`
	// Username is the SASL user; required with a mechanism.
	Username string `yaml:"username"`
	// PasswordEnv names an environment variable holding the password.
	PasswordEnv string `yaml:"password_env"`
	// PasswordFile is a file holding the password; one trailing newline is
	// trimmed. Set exactly one of PasswordEnv and PasswordFile.
	PasswordFile string `yaml:"password_file"`
}

var saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}

// validateSecurity adds the problems of kafka.tls.* and kafka.sasl.*.
func (c *Config) validateSecurity(p *problems) {
	t, s := c.Kafka.TLS, c.Kafka.SASL
	embedded := len(c.Kafka.Brokers) == 0
	if t.On() && embedded {
		p.add("kafka.tls.enabled", "TLS is configured but kafka.brokers is empty (the embedded broker speaks plaintext); set kafka.brokers or remove kafka.tls")
	}
	if (t.CertFile == "") != (t.KeyFile == "") {
		p.add("kafka.tls.key_file", "kafka.tls.cert_file and kafka.tls.key_file go together; set both for a client certificate, or neither")
	}
	if s.Mechanism == "" {
		for _, k := range []string{"username", "password_env", "password_file"} {
			if !configFields().byKey["kafka.sasl."+k].value(c).IsZero() {
				p.add("kafka.sasl."+k, "is set but kafka.sasl.mechanism is not; set the mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512) or remove it")
			}
		}
		return
	}
	valid := false
	for _, m := range saslMechanisms {
		if strings.EqualFold(s.Mechanism, m) {
			valid = true
		}
	}
	if !valid {
		p.add("kafka.sasl.mechanism", "%q is not supported; use PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", s.Mechanism)
	}
	if embedded {
		p.add("kafka.sasl.mechanism", "SASL is configured but kafka.brokers is empty (the embedded broker has no users); set kafka.brokers or remove kafka.sasl")
	}
	if s.Username == "" {
		p.add("kafka.sasl.username", "required with kafka.sasl.mechanism")
	}
	switch {
	case s.PasswordEnv == "" && s.PasswordFile == "":
		p.add("kafka.sasl.password_env", "required with kafka.sasl.mechanism: name the environment variable holding the password (or set kafka.sasl.password_file); the password itself never goes in the file")
	case s.PasswordEnv != "" && s.PasswordFile != "":
		p.add("kafka.sasl.password_file", "kafka.sasl.password_env and kafka.sasl.password_file are both set; keep one")
	}
}

// saslPassword resolves kafka.sasl.password_env or password_file. Errors
// name the variable or file, never the value.
func (c *Config) saslPassword(env func(string) string) (string, error) {
	s := c.Kafka.SASL
	if s.PasswordEnv != "" {
		v := env(s.PasswordEnv)
		if v == "" {
			return "", &ConfigError{Key: "kafka.sasl.password_env", Origin: c.origin["kafka.sasl.password_env"], Credentials: true,
				Msg: fmt.Sprintf("environment variable %s is not set or empty; export it, or use kafka.sasl.password_file", s.PasswordEnv)}
		}
		return v, nil
	}
	v, err := postgres.ReadPasswordFile(s.PasswordFile)
	if err != nil {
		return "", &ConfigError{Key: "kafka.sasl.password_file", Origin: c.origin["kafka.sasl.password_file"], Msg: err.Error(), Credentials: true}
	}
	return v, nil
}

// securityOpts returns the kgo options for kafka.tls.* and kafka.sasl.*.
func (a *cli) securityOpts() ([]kgo.Opt, error) {
	var opts []kgo.Opt
	t, s := a.cfg.Kafka.TLS, a.cfg.Kafka.SASL
	if t.On() {
		tc, err := t.config(a.cfg)
		if err != nil {
			return nil, err
		}
		opts = append(opts, kgo.Dialer(tlsDialer(tc, t.CAFile)))
	}
	if s.Mechanism != "" {
		pw, err := a.cfg.saslPassword(a.env)
		if err != nil {
			return nil, err
		}
		// The password is read above to fail at start with exit 2, and,
		// from a file, again for every login: a rotated secret (the file
		// rewritten, then the user's credentials changed) takes effect on
		// the next connection without a restart.
		// A file that cannot be read then fails that login only (a
		// transient failure, retried), never the run.
		password := func() (string, error) {
			if s.PasswordFile == "" {
				return pw, nil
			}
			v, err := postgres.ReadPasswordFile(s.PasswordFile)
			if err != nil {
				return "", fmt.Errorf("kafka.sasl.password_file: %w", err)
			}
			return v, nil
		}
		switch strings.ToUpper(s.Mechanism) {
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Plain(func(context.Context) (plain.Auth, error) {
				p, err := password()
				return plain.Auth{User: s.Username, Pass: p}, err
			})))
		case "SCRAM-SHA-256", "SCRAM-SHA-512":
			auth := func(context.Context) (scram.Auth, error) {
				p, err := password()
				return scram.Auth{User: s.Username, Pass: p}, err
			}
			if strings.EqualFold(s.Mechanism, "SCRAM-SHA-256") {
				opts = append(opts, kgo.SASL(scram.Sha256(auth)))
			} else {
				opts = append(opts, kgo.SASL(scram.Sha512(auth)))
			}
		}
		if a.sasl == nil {
			a.sasl = &saslWatch{}
		}
		opts = append(opts, kgo.WithHooks(a.sasl))
		if !t.On() && strings.EqualFold(s.Mechanism, "PLAIN") {
			a.log.Warn("kafka.sasl.mechanism PLAIN without kafka.tls sends the password in clear text; enable kafka.tls or use SCRAM")
		}
	}
	return opts, nil
}

func (t KafkaTLSConfig) config(c *Config) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if t.CAFile != "" {
		// Read here to fail at start with exit 2, and again for each
		// connection (tlsDialer).
		pool, err := readCAFile(t.CAFile)
		if err != nil {
			return nil, &ConfigError{Key: "kafka.tls.ca_file", Origin: c.origin["kafka.tls.ca_file"], Err: err}
		}
		tc.RootCAs = pool
	}
	if t.CertFile != "" {
		if _, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile); err != nil {
			return nil, &ConfigError{Key: "kafka.tls.cert_file", Origin: c.origin["kafka.tls.cert_file"],
				Msg: "load the client certificate and key (PEM)", Err: err}
		}
		// Loaded above to fail at start with exit 2, and from the files
		// again at each handshake: a renewed certificate (cert-manager,
		// a Strimzi KafkaUser) is presented by the next connection
		// without a restart. Files caught half way fail that handshake
		// only; the client connects again.
		certFile, keyFile := t.CertFile, t.KeyFile
		tc.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(certFile, keyFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.cert_file %s, key_file %s: %w", certFile, keyFile, err)
			}
			return &cert, nil
		}
	}
	return tc, nil
}

// readCAFile reads the CA certificates of kafka.tls.ca_file.
func readCAFile(path string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate; give the CA certificate(s) in PEM form", path)
	}
	return pool, nil
}

// tlsDialer dials the brokers with TLS as kgo.DialTLSConfig does (a clone
// of tc for each connection, ServerName from the broker's host unless
// set, franz-go's default 10 s dial timeout: kgo.DialTimeout, which
// tidemark does not set, would not reach a custom dialer), and with the CA
// file, when there is one, read again for each connection: a CA renewed in
// place (the brokers moving to certificates of a new CA) is trusted by the
// next connection without a restart, as renewed client certificates are
// (GetClientCertificate). A file caught half way fails that dial alone;
// the client dials again.
func tlsDialer(tc *tls.Config, caFile string) func(ctx context.Context, network, host string) (net.Conn, error) {
	d := &net.Dialer{Timeout: 10 * time.Second}
	return func(ctx context.Context, network, host string) (net.Conn, error) {
		c := tc.Clone()
		if caFile != "" {
			pool, err := readCAFile(caFile)
			if err != nil {
				return nil, fmt.Errorf("kafka.tls.ca_file: %w", err)
			}
			c.RootCAs = pool
		}
		if c.ServerName == "" {
			server, _, err := net.SplitHostPort(host)
			if err != nil {
				return nil, fmt.Errorf("split the broker address %q into host and port: %w", host, err)
			}
			c.ServerName = server
		}
		return (&tls.Dialer{NetDialer: d, Config: c}).DialContext(ctx, network, host)
	}
}

// describeKafkaSecurity is one line for check and status: how tidemark
// connects, with every secret redacted.
func (c *Config) describeKafkaSecurity() string {
	var parts []string
	t, s := c.Kafka.TLS, c.Kafka.SASL
	if t.On() {
		tl := "tls on"
		if t.CAFile != "" {
			tl += ", ca " + t.CAFile
		} else {
			tl += ", system roots"
		}
		if t.CertFile != "" {
			tl += ", client cert " + t.CertFile
		}
		if t.ServerName != "" {
			tl += ", server name " + t.ServerName
		}
		parts = append(parts, tl)
	} else {
		parts = append(parts, "tls off")
	}
	if s.Mechanism != "" {
		from := "env " + s.PasswordEnv
		if s.PasswordFile != "" {
			from = "file " + s.PasswordFile
		}
		parts = append(parts, fmt.Sprintf("sasl %s user %s password %s (from %s)", strings.ToUpper(s.Mechanism), s.Username, redacted, from))
	} else {
		parts = append(parts, "sasl off")
	}
	return strings.Join(parts, "; ")
}

// explainKafkaAccess turns Kafka authentication and authorization failures
// into configuration errors (exit 2) that say what to grant or fix. A retry
// cannot fix them, and nothing was committed: each is detected before or at
// the first write, which then aborts.
func (a *cli) explainKafkaAccess(err error) error {
	if err == nil || a.cfg == nil {
		return err
	}
	var ce *ConfigError
	if errors.As(err, &ce) {
		return err
	}
	k := a.cfg.Kafka
	user := "User:ANONYMOUS (no kafka.sasl)"
	if k.SASL.Mechanism != "" {
		user = "User:" + k.SASL.Username
	}
	topics := fmt.Sprintf("%s (data), %s (offsets), %s (ledger)", k.Topic, k.OffsetsTopic, k.LedgerTopic)
	var msg, key string
	switch {
	case errors.Is(err, kerr.SaslAuthenticationFailed), errors.Is(err, kerr.IllegalSaslState), errors.Is(err, kerr.UnsupportedSaslMechanism):
		key = "kafka.sasl"
		msg = fmt.Sprintf("Kafka rejected the SASL login of user %q with mechanism %s: check kafka.sasl.username, kafka.sasl.mechanism and the password in %s", k.SASL.Username, k.SASL.Mechanism, passwordSource(k.SASL))
	case a.sasl != nil && a.sasl.rejected.Load() && !errors.Is(err, context.Canceled):
		// Some brokers close the connection instead of answering a failed
		// SASLAuthenticate; the client then sees only EOF.
		key = "kafka.sasl"
		msg = fmt.Sprintf("Kafka rejected the SASL login of user %q with mechanism %s (the broker closed the connection during authentication): check kafka.sasl.username, kafka.sasl.mechanism and the password in %s", k.SASL.Username, k.SASL.Mechanism, passwordSource(k.SASL))
	case errors.Is(err, kerr.TransactionalIDAuthorizationFailed):
		key = "kafka ACLs"
		msg = fmt.Sprintf("%s may not use transactional id %q: grant DESCRIBE and WRITE on TransactionalId %s (see docs/operating.md, Kafka ACLs)", user, producer.TransactionalID(a.cfg.Name), producer.TransactionalID(a.cfg.Name))
	case errors.Is(err, kerr.TopicAuthorizationFailed):
		key = "kafka ACLs"
		missing := "an ACL on a topic (the operation is named below)"
		for _, m := range topicOps {
			if sub := m.re.FindStringSubmatch(err.Error()); sub != nil {
				missing = m.op + " on topic " + sub[1]
				break
			}
		}
		msg = fmt.Sprintf("%s lacks %s: grant it; the connector needs DESCRIBE, DESCRIBE_CONFIGS, READ and WRITE (and CREATE, unless the topics exist) on topics %s (see docs/operating.md, Kafka ACLs)", user, missing, topics)
	case errors.Is(err, kerr.ClusterAuthorizationFailed):
		key = "kafka ACLs"
		msg = fmt.Sprintf("%s is not authorized on the cluster: grant IDEMPOTENT_WRITE on the cluster (and CREATE if tidemark creates the topics), or create the topics beforehand (see docs/operating.md, Kafka ACLs)", user)
	case errors.Is(err, kerr.GroupAuthorizationFailed):
		key = "kafka ACLs"
		msg = fmt.Sprintf("%s is not authorized on a consumer group (named below): grant READ on it (see docs/operating.md, Kafka ACLs)", user)
	default:
		return err
	}
	return &ConfigError{Key: key, Msg: msg + "; a failed transaction is aborted, so nothing past the last committed checkpoint was written", Err: err, Credentials: key == "kafka.sasl"}
}

// saslWatch is a kgo hook noting a SASLAuthenticate exchange that failed
// to read a response.
type saslWatch struct{ rejected atomic.Bool }

var _ kgo.HookBrokerRead = (*saslWatch)(nil)

// OnBrokerRead implements kgo.HookBrokerRead.
func (w *saslWatch) OnBrokerRead(_ kgo.BrokerMetadata, key int16, _ int, _, _ time.Duration, err error) {
	switch {
	case key == int16(kmsg.SASLAuthenticate) && err != nil:
		w.rejected.Store(true)
	case err == nil && key != int16(kmsg.SASLAuthenticate) && key != int16(kmsg.SASLHandshake) && key != int16(kmsg.ApiVersions):
		// A request answered after the login proves a login went
		// through since: a refusal during a rotation must not label
		// every later error of the process.
		w.rejected.Store(false)
	}
}

// topicOps map the operations named in our error messages to the topic ACL
// they need.
var topicOps = []struct {
	re *regexp.Regexp
	op string
}{
	{regexp.MustCompile(`produce (\S+) key`), "WRITE"},
	{regexp.MustCompile(`create topic "([^"]+)"`), "CREATE"},
	{regexp.MustCompile(`describe configs of "([^"]+)"`), "DESCRIBE_CONFIGS"},
	{regexp.MustCompile(`describe topic "([^"]+)"`), "DESCRIBE"},
	{regexp.MustCompile(`(?:read|fetch|fold|scan)\S* (?:topic )?"?([a-zA-Z0-9._-]+)"?`), "READ"},
}

func passwordSource(s KafkaSASLConfig) string {
	if s.PasswordFile != "" {
		return "file " + s.PasswordFile
	}
	return "environment variable " + s.PasswordEnv
}

// postgresTLSWarning returns a warning when the DSN connects to a host that
// is not loopback (or a Unix socket) without sslmode=verify-full, or "".
// PGSSLMODE and PGHOST apply when the DSN does not set them, as in libpq.
func postgresTLSWarning(dsn string, env func(string) string) string {
	hosts, mode := postgresHostsAndSSLMode(dsn)
	if len(hosts) == 0 && env("PGHOST") != "" {
		hosts = strings.Split(env("PGHOST"), ",")
	}
	if mode == "" {
		mode = env("PGSSLMODE")
	}
	if mode == "" {
		mode = "prefer"
	}
	if mode == "verify-full" {
		return ""
	}
	var remote []string
	for _, h := range hosts {
		if !isLocalHost(h) {
			remote = append(remote, h)
		}
	}
	if len(remote) == 0 {
		return ""
	}
	return fmt.Sprintf("PostgreSQL connection to %s uses sslmode=%s: the server is not authenticated (and with disable/allow/prefer the traffic may be clear text); use sslmode=verify-full with sslrootcert for connections that leave the host",
		strings.Join(remote, ","), mode)
}

func isLocalHost(h string) bool {
	h = strings.TrimSpace(h)
	if hh, _, err := net.SplitHostPort(h); err == nil {
		h = hh
	}
	h = strings.Trim(h, "[]")
	if h == "" || strings.HasPrefix(h, "/") || strings.EqualFold(h, "localhost") {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}

// postgresHostsAndSSLMode extracts host(s) and sslmode from a DSN in URL or
// keyword form.
func postgresHostsAndSSLMode(dsn string) (hosts []string, mode string) {
	if urlFormRE.MatchString(dsn) {
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, ""
		}
		mode = u.Query().Get("sslmode")
		if h := u.Query().Get("host"); h != "" {
			return strings.Split(h, ","), mode
		}
		if u.Host != "" {
			hosts = strings.Split(u.Host, ",")
		}
		return hosts, mode
	}
	pairs, _ := postgres.ParseKeywordDSN(dsn)
	for _, kv := range pairs {
		switch kv.Key {
		case "host", "hostaddr":
			if kv.Value != "" && hosts == nil {
				hosts = strings.Split(kv.Value, ",")
			}
		case "sslmode":
			mode = kv.Value
		}
	}
	return hosts, mode
}
