package main

// Sharp edges of the CLI (issue 14): secrets in DSN errors, exit codes and
// messages, flags and output. Tests that need no PostgreSQL or Kafka write
// configs that point at closed loopback ports: nothing is contacted before
// the failure under test.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"

	"github.com/tidemark/tidemark/feed"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/test/harness"
)

// edgeCLI runs the CLI in-process with env (nil: none) and returns the
// exit code and both outputs.
func edgeCLI(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var o, e harness.SyncBuffer
	a := func(k string) string { return env[k] }
	code := runEnv(context.Background(), args, &o, &e, a, func() []string {
		var kv []string
		for k, v := range env {
			kv = append(kv, k+"="+v)
		}
		return kv
	})
	return code, o.String(), e.String()
}

// writeEdgeConfig writes a postgres config whose DSN is dsn and whose
// brokers are never contacted.
func writeEdgeConfig(t *testing.T, dir, name, dsn, extra string) string {
	t.Helper()
	text := fmt.Sprintf("name: edge\nsource:\n  dsn: %q\n  table: items\n%skafka:\n  brokers: [127.0.0.1:1]\nlog:\n  format: text\n", dsn, extra)
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

const edgeSecret = "Pw-S3cret-9"

// Item 1: a DSN the driver cannot parse exits 2 naming the part that is
// wrong, and no output holds the password, for every command that opens a
// DSN: run, check, verify, sweep and feed serve (source.dsn), replica
// --target-dsn and verify --replica-dsn.
func TestDSNParseErrorsNeverPrintThePassword(t *testing.T) {
	dir := t.TempDir()
	key := filepath.Join(dir, "feed.key")
	if err := os.WriteFile(key, []byte("k7Qp2Zr9XvB4mN8sT1wY6cE3hJ5uL0aD"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := writeEdgeConfig(t, dir, "good.yaml", "postgres://u@127.0.0.1:1/db?sslmode=disable", "")
	for name, tc := range map[string]struct{ dsn, part string }{
		"spaces around =":  {"host=127.0.0.1 password = " + edgeSecret + " sslmode=bogus", `keyword "sslmode"`},
		"space after =":    {"host=127.0.0.1 password= " + edgeSecret + " sslmode=bogus", `keyword "sslmode"`},
		"quoted with \\'":  {`host=127.0.0.1 password='Pw-S3cret\'9' sslmode=bogus`, `keyword "sslmode"`},
		"unquoted space":   {"host=127.0.0.1 password=Pw S3cret-9 dbname=x", `keyword "password"`},
		"URL, unencoded @": {"postgres://u:Pw@S3cret-9@127.0.0.1/db", "user info"},
		"URL, bad sslmode": {"postgres://u:" + edgeSecret + "@127.0.0.1/db?sslmode=bogus", `"sslmode"`},
	} {
		t.Run(name, func(t *testing.T) {
			bad := writeEdgeConfig(t, dir, "bad.yaml", tc.dsn, "")
			for _, args := range [][]string{
				{"run", "--once", "--config", bad},
				{"check", "--config", bad},
				{"verify", "--config", bad},
				{"sweep", "--config", bad},
				{"feed", "serve", "--config", bad, "--listen", "127.0.0.1:0", "--hmac-key-file", key},
				{"replica", "--config", good, "--target-table", "r", "--target-dsn", tc.dsn},
				{"verify", "--config", good, "--replica-table", "r", "--replica-dsn", tc.dsn},
			} {
				code, out, errOut := edgeCLI(t, nil, args...)
				if code != exitConfig {
					t.Errorf("%v: exit %d, want %d\n%s", args, code, exitConfig, errOut)
				}
				for _, frag := range []string{"S3cret", "Pw-", "Pw@"} {
					if strings.Contains(out+errOut, frag) {
						t.Errorf("%v: the output holds the password (%q):\n%s%s", args, frag, out, errOut)
					}
				}
				if !strings.Contains(errOut, tc.part) {
					t.Errorf("%v: stderr does not name %s:\n%s", args, tc.part, errOut)
				}
			}
		})
	}
}

// The CLI: version without a configuration, one line and a hint for a bad
// flag or command, help per command.
func TestCLIVersionFlagsAndHelp(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}} {
		code, out, errOut := edgeCLI(t, nil, args...)
		if code != exitOK || out != "tidemark "+version+"\n" {
			t.Errorf("%v: exit %d, %q %q", args, code, out, errOut)
		}
	}
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db", "")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--config", cfg, "--onse"}, `unknown flag --onse (did you mean "once"?); run ` + "`tidemark run --help`"},
		{[]string{"run", "--config", cfg, "--source.tabel", "x"}, `did you mean "source.table"?`},
		{[]string{"stauts", "--config", cfg}, `unknown command "stauts" (did you mean "status"?)`},
	} {
		code, out, errOut := edgeCLI(t, nil, tc.args...)
		if code != exitConfig || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("%v: exit %d, stderr:\n%s", tc.args, code, errOut)
		}
		if n := strings.Count(strings.TrimSpace(errOut), "\n") + 1; n > 2 {
			t.Errorf("%v: %d lines on stderr, want one line and a hint:\n%s", tc.args, n, errOut)
		}
	}
	for _, args := range [][]string{{"replica", "--help"}, {"help", "replica"}, {"feed", "serve", "--help"}, {"help", "feed"}} {
		code, out, errOut := edgeCLI(t, nil, args...)
		if code != exitOK || errOut != "" {
			t.Errorf("%v: exit %d\n%s", args, code, errOut)
		}
		name := args[0]
		if name == "help" {
			name = args[1]
		}
		flags := map[string][]string{"replica": {"--target-table", "--target-dsn", "--from-beginning"}, "feed": {"--hmac-key-file", "--listen", "--public-url"}}[name]
		for _, f := range flags {
			if !strings.Contains(out, f) {
				t.Errorf("%v: help lacks %s:\n%s", args, f, out)
			}
		}
		if strings.Contains(out, "--sync.page_size") || strings.Count(out, "\n") > 40 {
			t.Errorf("%v: help lists the configuration keys as flags (%d lines):\n%s", args, strings.Count(out, "\n"), out)
		}
	}
}

// JSON logs write durations as Go duration strings, and a TIDEMARK_*
// variable that sets no key is warned about with the closest one.
func TestCLILogDurationsAndUnknownEnv(t *testing.T) {
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db?sslmode=disable&connect_timeout=1", "")
	env := map[string]string{"TIDEMARK_SYNC_PAGESIZE": "5", "TIDEMARK_LOG_FORMAT": "json", "TIDEMARK_FEED_HMAC_KEY": "x", "TIDEMARK_SYNC_ONCE_RETRY_TIMEOUT": "1s"}
	_, _, errOut := edgeCLI(t, env, "run", "--once", "--config", cfg)
	if !strings.Contains(errOut, "TIDEMARK_SYNC_PAGESIZE") || !strings.Contains(errOut, "TIDEMARK_SYNC_PAGE_SIZE") {
		t.Errorf("no warning with a suggestion for TIDEMARK_SYNC_PAGESIZE:\n%s", errOut)
	}
	if strings.Contains(errOut, "TIDEMARK_FEED_HMAC_KEY") {
		t.Errorf("a known variable is warned about:\n%s", errOut)
	}
	var buf harness.SyncBuffer
	log := newLogger(&buf, "info", "json")
	log.Info("waiting", "retry_in", 1500*time.Millisecond)
	if !strings.Contains(buf.String(), `"retry_in":"1.5s"`) {
		t.Errorf("duration in a JSON log: %s", buf.String())
	}
}

// getJSON GETs u and decodes its JSON body into v.
func getJSON(t *testing.T, u string, v any) *http.Response {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_ = json.NewDecoder(resp.Body).Decode(v)
	return resp
}

// startFeed runs `tidemark feed serve` until the test ends, when it must
// stop with exit 0, and returns its endpoint.
func startFeed(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut harness.SyncBuffer
	done := make(chan struct{})
	code := 0
	go func() {
		defer close(done)
		code = run(ctx, append([]string{"feed", "serve", "--listen", "127.0.0.1:0"}, args...), &out, &errOut)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
			if code != exitOK {
				t.Errorf("feed serve: exit %d on shutdown\n%s", code, errOut.String())
			}
		case <-time.After(15 * time.Second):
			t.Error("feed serve did not stop")
		}
	})
	re := regexp.MustCompile(`at (http://\S+)`)
	for deadline := time.Now().Add(20 * time.Second); ; {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m[1]
		}
		select {
		case <-done:
			t.Fatalf("feed serve exited %d:\n%s", code, errOut.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("feed serve did not start:\n%s", errOut.String())
		}
	}
}

// `tidemark feed serve`: a cursor minted for schema "S.a" table "b" is
// foreign to schema "S" table "a.b" (item 4); --public-url makes the next
// link (item 6); idle connections are closed and connections bounded
// (item 3); a low-entropy key is refused (item 10).
func TestCLIFeedServeHardening(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	weak := write("weak.key", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n")
	if code, _, errOut := edgeCLI(t, nil, "feed", "serve", "--config", writeEdgeConfig(t, dir, "e.yaml", "postgres://u@127.0.0.1:1/db", ""),
		"--hmac-key-file", weak); code != exitConfig || !strings.Contains(errOut, "entropy") || !strings.Contains(errOut, "--hmac-key-file") {
		t.Errorf("a key of 32 times 'a': exit %d\n%s", code, errOut)
	}
	good := write("good.key", "k7Qp2Zr9XvB4mN8sT1wY6cE3hJ5uL0aD\n")
	for _, path := range []string{"changes", "/a b", "/{id}"} {
		if code, _, errOut := edgeCLI(t, nil, "feed", "serve", "--config", writeEdgeConfig(t, dir, "e.yaml", "postgres://u@127.0.0.1:1/db", ""),
			"--hmac-key-file", good, "--path", path); code != exitConfig || !strings.Contains(errOut, "--path") || !strings.Contains(errOut, "/changes") {
			t.Errorf("--path %q: exit %d, want 2 naming --path and an example\n%s", path, code, errOut)
		}
	}

	db := harness.NewDB(t)
	dotted := db.Schema + ".a"
	db.Exec(t, fmt.Sprintf(`CREATE SCHEMA %q`, dotted))
	t.Cleanup(func() { db.Exec(t, fmt.Sprintf(`DROP SCHEMA %q CASCADE`, dotted)) })
	for _, tbl := range []string{fmt.Sprintf(`%q."b"`, dotted), fmt.Sprintf(`%q."a.b"`, db.Schema)} {
		db.Exec(t, `CREATE TABLE `+tbl+` (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
		db.Exec(t, `INSERT INTO `+tbl+` SELECT i, now() FROM generate_series(1, 5) i`)
	}
	key := write("feed.key", "k7Qp2Zr9XvB4mN8sT1wY6cE3hJ5uL0aD\n")
	cfgA := write("a.yaml", fmt.Sprintf("name: a\nsource:\n  dsn: %q\n  schema: %q\n  table: b\n", db.URL, dotted))
	cfgB := write("b.yaml", fmt.Sprintf("name: b\nsource:\n  dsn: %q\n  schema: %q\n  table: a.b\n", db.URL, db.Schema))
	a := startFeed(t, "--config", cfgA, "--hmac-key-file", key, "--public-url", "https://feed.example.com/v1/changes",
		"--idle-timeout", "300ms", "--read-header-timeout", "300ms", "--max-conns", "3")
	b := startFeed(t, "--config", cfgB, "--hmac-key-file", key)

	var page feed.Response
	resp := getJSON(t, a+"?limit=2", &page)
	if resp.StatusCode != 200 || page.NextCursor == nil {
		t.Fatalf("first page: %d %+v", resp.StatusCode, page)
	}
	if link := resp.Header.Get("Link"); !strings.HasPrefix(link, "<https://feed.example.com/v1/changes?cursor=") {
		t.Errorf("Link %q is not built on --public-url", link)
	}
	var eb feed.ErrorBody
	if resp = getJSON(t, b+"?cursor="+url.QueryEscape(*page.NextCursor), &eb); resp.StatusCode != 400 || eb.Error.Code != feed.CodeCursorForeign {
		t.Errorf("a cursor of %s.b served by %s.\"a.b\": %d %+v, want 400 %s", dotted, db.Schema, resp.StatusCode, eb, feed.CodeCursorForeign)
	}

	// Past --max-conns a connection gets 503; an idle keep-alive connection
	// and silent ones are closed by the timeouts.
	http.DefaultClient.CloseIdleConnections()
	host := strings.SplitN(strings.TrimPrefix(a, "http://"), "/", 2)[0]
	var conns []net.Conn
	for i := range 3 {
		c, err := net.Dial("tcp", host)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if i == 0 {
			fmt.Fprint(c, "GET /changes?limit=1 HTTP/1.1\r\nHost: x\r\n\r\n")
			r, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil || r.StatusCode != 200 {
				t.Fatalf("keep-alive request: %v %v", r, err)
			}
		}
		conns = append(conns, c)
	}
	over, err := net.Dial("tcp", host)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, _ := bufio.NewReader(over).ReadString('\n'); !strings.Contains(line, "503") {
		t.Errorf("a connection past --max-conns 3: %q, want 503", line)
	}
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := io.Copy(io.Discard, c); err != nil {
			t.Errorf("an idle connection was not closed within 5s by the 300ms timeouts (%d bytes): %v", n, err)
		}
	}
}

// Item 11: configuration problems exit 2 with the fix, not 1 with "run
// again to resume": a database that does not exist, sweep and verify with
// the HTTP source, replica of an HTTP config without --target-dsn.
func TestCLIConfigurationProblemsExit2(t *testing.T) {
	db := harness.NewDB(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Path = "/no_such_database_tm"
	dir := t.TempDir()
	nodb := writeEdgeConfig(t, dir, "nodb.yaml", u.String(), "")
	httpCfg := filepath.Join(dir, "http.yaml")
	if err := os.WriteFile(httpCfg, []byte("name: h\nsource:\n  kind: http\n  dsn: http://127.0.0.1:1/changes\nkafka:\n  brokers: [127.0.0.1:1]\n  topic: t\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "--once", "--config", nodb}, []string{"source.dsn", "does not exist", "dbname"}},
		{[]string{"check", "--config", nodb}, []string{"source.dsn", "does not exist"}},
		{[]string{"sweep", "--config", httpCfg}, []string{"source.kind", "http"}},
		{[]string{"verify", "--config", httpCfg}, []string{"source.kind", "http"}},
		{[]string{"replica", "--config", httpCfg, "--target-table", "r"}, []string{"--target-dsn", "source.kind http"}},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		var o, e harness.SyncBuffer
		code := run(ctx, tc.args, &o, &e)
		cancel()
		if code != exitConfig {
			t.Errorf("%v: exit %d, want %d\n%s", tc.args, code, exitConfig, e.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(e.String(), w) {
				t.Errorf("%v: stderr does not say %q:\n%s", tc.args, w, e.String())
			}
		}
		if strings.Contains(e.String(), "run again to resume") {
			t.Errorf("%v: stderr says to run again:\n%s", tc.args, e.String())
		}
	}
}

// fakePostgres accepts connections, asks each for a clear-text password,
// sends what it got on the channel and refuses the login (28P01).
func fakePostgres(t *testing.T) (port string, got <-chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan string, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				be := pgproto3.NewBackend(c, c)
				msg, err := be.ReceiveStartupMessage()
				if _, ok := msg.(*pgproto3.SSLRequest); ok {
					_, _ = c.Write([]byte("N"))
					msg, err = be.ReceiveStartupMessage()
				}
				if _, ok := msg.(*pgproto3.StartupMessage); !ok || err != nil {
					return
				}
				be.Send(&pgproto3.AuthenticationCleartextPassword{})
				if be.Flush() != nil || be.SetAuthType(pgproto3.AuthTypeCleartextPassword) != nil {
					return
				}
				m, err := be.Receive()
				if pm, ok := m.(*pgproto3.PasswordMessage); ok && err == nil {
					ch <- pm.Password
				}
				be.Send(&pgproto3.ErrorResponse{Severity: "FATAL", Code: "28P01", Message: `password authentication failed for user "u"`})
				_ = be.Flush()
			}()
		}
	}()
	_, port, _ = net.SplitHostPort(ln.Addr().String())
	return port, ch
}

// wantPassword checks that the first password fakePostgres got (from the
// command labelled what, which exited code) is want.
func wantPassword(t *testing.T, got <-chan string, what, want string, code int, errOut string) {
	t.Helper()
	select {
	case pw := <-got:
		if pw != want {
			t.Errorf("%s: the server got password %q, want %q", what, pw, want)
		}
	default:
		t.Errorf("%s: no password reached the server (exit %d)\n%s", what, code, errOut)
	}
}

// Item 13: replica sends the password of --target-password-env or
// --target-password-file, or, reusing the source DSN, source.password_env
// or source.password_file; verify --replica-dsn likewise. Nobody has to put
// a password on a command line. A refused password exits 2.
func TestCLIReplicaPasswords(t *testing.T) {
	port, got := fakePostgres(t)
	dir := t.TempDir()
	pwFile := filepath.Join(dir, "pw")
	if err := os.WriteFile(pwFile, []byte("file-S3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dsn := "host=127.0.0.1 port=" + port + " user=u dbname=d sslmode=disable connect_timeout=5"
	fromEnv := writeEdgeConfig(t, dir, "env.yaml", dsn, "  password_env: SRC_PW\n")
	fromFile := writeEdgeConfig(t, dir, "file.yaml", dsn, "  password_file: "+pwFile+"\n")
	plain := writeEdgeConfig(t, dir, "plain.yaml", "postgres://u@127.0.0.1:1/db", "")
	env := map[string]string{"SRC_PW": "env-S3cret", "TGT_PW": "target-S3cret"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"replica", "--config", fromEnv, "--target-table", "r", "--infer", "--once"}, "env-S3cret"},
		{[]string{"replica", "--config", fromFile, "--target-table", "r", "--infer", "--once"}, "file-S3cret"},
		{[]string{"replica", "--config", plain, "--target-table", "r", "--infer", "--once", "--target-dsn", dsn, "--target-password-env", "TGT_PW"}, "target-S3cret"},
		{[]string{"replica", "--config", plain, "--target-table", "r", "--infer", "--once", "--target-dsn", "postgres://u@127.0.0.1:" + port + "/d?sslmode=disable", "--target-password-file", pwFile}, "file-S3cret"},
		{[]string{"replica", "--config", fromEnv, "--target-table", "r", "--infer", "--once", "--target-password-file", pwFile}, "file-S3cret"},
	} {
		code, out, errOut := edgeCLI(t, env, tc.args...)
		wantPassword(t, got, fmt.Sprint(tc.args), tc.want, code, errOut)
		if code != exitConfig || !strings.Contains(errOut, "refused the password") {
			t.Errorf("%v: exit %d, want %d saying the password was refused\n%s", tc.args, code, exitConfig, errOut)
		}
		if strings.Contains(out+errOut, "S3cret") {
			t.Errorf("%v: the output holds the password:\n%s%s", tc.args, out, errOut)
		}
		for len(got) > 0 {
			<-got
		}
	}
	if code, _, errOut := edgeCLI(t, env, "replica", "--config", plain, "--target-table", "r", "--target-dsn", dsn,
		"--target-password-env", "TGT_PW", "--target-password-file", pwFile); code != exitConfig || !strings.Contains(errOut, "--target-password-file") {
		t.Errorf("both password flags: exit %d\n%s", code, errOut)
	}
}

func TestWithPassword(t *testing.T) {
	for _, tc := range []struct{ dsn, pw string }{
		{"host=h dbname=d", `a b'c\d`},
		{"postgres://u@h/d", "p@ss/w?rd&x=1 %"},
		{"postgres://u@h/d?sslmode=disable", "é'"},
	} {
		got := withPassword(tc.dsn, tc.pw)
		pc, err := pgconn.ParseConfig(got)
		if err != nil {
			t.Errorf("withPassword(%q, %q) = %q does not parse", tc.dsn, tc.pw, got)
			continue
		}
		if pc.Password != tc.pw {
			t.Errorf("withPassword(%q, %q) = %q: parsed password %q", tc.dsn, tc.pw, got, pc.Password)
		}
		if strings.Contains(RedactDSN(got), tc.pw) {
			t.Errorf("RedactDSN(%q) shows the password", got)
		}
	}
}

// Item 14: the README's loop (run, replica, verify the replica, verify the
// topic), its commands read from README.md verbatim, on a source table
// outside the DSN's current schema: every step exits 0.
func TestREADMELoopVerbatim(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "## The whole loop")
	if !ok {
		t.Fatal("README.md has no section \"The whole loop\"")
	}
	_, block, _ = strings.Cut(block, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	var steps [][]string
	for _, line := range strings.Split(block, "\n") {
		line, _, _ = strings.Cut(line, "#")
		f := strings.Fields(line)
		if len(f) > 0 && f[0] == "tidemark" {
			steps = append(steps, f[1:])
		}
	}
	if len(steps) < 4 {
		t.Fatalf("found %d commands in the README's loop:\n%s", len(steps), block)
	}

	db := harness.NewDB(t)
	kafka := harness.NewKafka(t)
	db.Exec(t, `CREATE TABLE orders (id bigint PRIMARY KEY, status text, total numeric, updated_at timestamptz NOT NULL, deleted_at timestamptz);
		CREATE INDEX ON orders (updated_at, id);
		INSERT INTO orders SELECT i, 'new', i * 1.5, now() - i * interval '1 second', NULL FROM generate_series(1, 25) i`)
	// The DSN's current schema is public; the table is in the test's schema.
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Del("search_path")
	u.RawQuery = q.Encode()
	t.Cleanup(func() { db.Exec(t, `DROP TABLE IF EXISTS public.orders_replica`) }) // where it went before
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tidemark.yaml"), []byte(fmt.Sprintf(`name: readme-loop
source:
  dsn: %q
  schema: %s
  table: orders
  deleted_at_column: deleted_at
kafka:
  brokers: [%s]
log:
  level: warn
  format: text
`, u.String(), db.Schema, strings.Join(kafka.Brokers, ", "))), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(dir)
	for _, args := range steps {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var o, e harness.SyncBuffer
		code := run(ctx, args, &o, &e)
		cancel()
		if code != exitOK {
			t.Fatalf("tidemark %s: exit %d\n%s\n%s", strings.Join(args, " "), code, o.String(), e.String())
		}
	}
}

// Item 15: the sslmode warning for a connection that leaves the host comes
// from every command that opens one: feed serve and replica (source.dsn or
// --target-dsn) and verify --replica-dsn too, before anything connects (here
// the missing CA file stops each one first).
func TestCLISSLModeWarningEverywhere(t *testing.T) {
	dir := t.TempDir()
	remote := "host=db.example.com dbname=d sslmode=require sslrootcert=" + filepath.Join(dir, "missing-ca.pem")
	cfg := writeEdgeConfig(t, dir, "remote.yaml", remote, "")
	local := writeEdgeConfig(t, dir, "local.yaml", "postgres://u@127.0.0.1:1/db?sslmode=disable", "")
	key := filepath.Join(dir, "feed.key")
	if err := os.WriteFile(key, []byte("k7Qp2Zr9XvB4mN8sT1wY6cE3hJ5uL0aD"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"feed", "serve", "--config", cfg, "--listen", "127.0.0.1:0", "--hmac-key-file", key},
		{"replica", "--config", cfg, "--target-table", "r"},
		{"replica", "--config", local, "--target-table", "r", "--target-dsn", remote},
		{"verify", "--config", local, "--replica-table", "r", "--replica-dsn", remote},
		{"check", "--config", cfg},
	} {
		code, _, errOut := edgeCLI(t, nil, args...)
		if !strings.Contains(errOut, "PostgreSQL connection to db.example.com uses sslmode=require") {
			t.Errorf("%v: no sslmode warning:\n%s", args, errOut)
		}
		if code != exitConfig || !strings.Contains(errOut, "missing-ca.pem") {
			t.Errorf("%v: exit %d, want %d naming the CA file\n%s", args, code, exitConfig, errOut)
		}
	}
}

// Item 2: with link pagination the cursors are URLs that carry the
// endpoint's query (here an api_key). The completion record, the ledger,
// the logs and errors print them with the secret redacted.
func TestCLILinkCursorsRedacted(t *testing.T) {
	w := newHTTPWorld(t, 14)
	srv, err := feed.New(feed.Config{Table: w.table, Key: []byte("k7Qp2Zr9XvB4mN8sT1wY6cE3hJ5uL0aD"), Collection: w.db.Schema + ".items"})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	const secret = "Api-K3y-S3cret"
	cfg := w.httpConfig(hs.URL+"/changes?api_key="+secret, "    pagination: link")
	ctx := context.Background()
	for _, args := range [][]string{
		{"run", "--once", "--log-level", "info", "--log-format", "json"},
		{"run", "--once", "--json", "--log-level", "debug"},
		{"ledger"}, {"ledger", "--json"}, {"status", "--json"},
	} {
		code, out, errOut := w.cli(ctx, secret, append(args, "--config", cfg)...) // fails the test on the secret
		if code != exitOK {
			t.Fatalf("%v: exit %d\n%s", args, code, errOut)
		}
		if args[0] == "run" && !strings.Contains(out, "api_key=REDACTED") {
			t.Errorf("%v: the completion record does not show the end cursor redacted:\n%s", args, out)
		}
		if len(args) > 2 && args[2] == "--json" {
			var c map[string]any
			if strings.Count(out, "\n") != 1 || json.Unmarshal([]byte(out), &c) != nil {
				t.Errorf("run --json printed more than one JSON line:\n%s", out)
			}
		}
		if args[0] == "ledger" && !strings.Contains(out, "api_key=REDACTED") {
			t.Errorf("%v: the ledger does not show its cursors redacted:\n%s", args, out)
		}
	}
	w.assertTopic()
}

// CLI output: check names the HTTP source's endpoint (redacted) and every
// topic's real cleanup.policy (the ledger's is delete); replica prints its
// positions as partition=offset, not a Go map.
func TestCLICheckAndReplicaOutput(t *testing.T) {
	w := newCLIWorld(t)
	cfg := w.config("tidemark.yaml", "items", "")
	ctx := context.Background()
	code, out, errOut := w.cli(ctx, "check", "--config", cfg)
	if code != exitOK {
		t.Fatalf("check: exit %d\n%s", code, errOut)
	}
	for _, want := range []string{"topic items-topic: created, 6 partitions, cleanup.policy=compact", "topic tidemark-offsets: created, 1 partitions, cleanup.policy=compact",
		"topic tidemark-ledger: created, 1 partitions, cleanup.policy=delete"} {
		if !strings.Contains(out, want) {
			t.Errorf("check does not say %q:\n%s", want, out)
		}
	}
	if code, out, _ = w.cli(ctx, "check", "--config", cfg); !strings.Contains(out, "topic tidemark-ledger: exists, 1 partitions, cleanup.policy=delete") {
		t.Errorf("second check (exit %d):\n%s", code, out)
	}
	if code, out, errOut = w.cli(ctx, "run", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("run: exit %d\n%s", code, errOut)
	}
	code, out, errOut = w.cli(ctx, "replica", "--config", cfg, "--target-table", "items_replica", "--once")
	if code != exitOK || !regexp.MustCompile(`positions 0=\d+ 1=\d+ 2=\d+ 3=\d+ 4=\d+ 5=\d+\n`).MatchString(out) || strings.Contains(out, "map[") {
		t.Errorf("replica summary (exit %d):\n%s\n%s", code, out, errOut)
	}

	httpCfg := filepath.Join(w.dir, "http.yaml")
	feedURL := "http://127.0.0.1:1/changes?api_key=K3y-S3cret"
	if err := os.WriteFile(httpCfg, []byte(fmt.Sprintf("name: h\nsource:\n  kind: http\n  dsn: %s\n  http:\n    max_retries: 1\nkafka:\n  brokers: [%s]\n  topic: t\n", feedURL, w.kafka.Brokers[0])), 0o600); err != nil {
		t.Fatal(err)
	}
	_, out, errOut = w.cli(ctx, "check", "--config", httpCfg)
	if !strings.Contains(out, "source: http endpoint http://127.0.0.1:1/changes?api_key=REDACTED") || strings.Contains(out, "table") || strings.Contains(out+errOut, "S3cret") {
		t.Errorf("check of an HTTP source:\n%s\n%s", out, errOut)
	}
}

// Terminal detection asks the terminal, not the file type: /dev/null and
// pipes are character devices or not, but never terminals.
func TestIsTerminal(t *testing.T) {
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	for name, f := range map[string]*os.File{"/dev/null": null, "a pipe": w} {
		if isTerminal(f) {
			t.Errorf("%s counts as a terminal", name)
		}
	}
	if isTerminal(&harness.SyncBuffer{}) {
		t.Error("a buffer counts as a terminal")
	}
}

// A misspelt TIDEMARK_* variable is named with the closest one also when
// the configuration fails to load (the misspelt key was required).
func TestCLIUnknownEnvInLoadError(t *testing.T) {
	env := map[string]string{"TIDEMARK_NAME": "t", "TIDEMARK_SOURCE_DSN": "host=h dbname=d", "TIDEMARK_SOURCE_TABEL": "orders"}
	code, out, errOut := edgeCLI(t, env, "check")
	if code != exitConfig || !strings.Contains(errOut, "source.table: required") ||
		!strings.Contains(errOut, "TIDEMARK_SOURCE_TABEL") || !strings.Contains(errOut, `did you mean "TIDEMARK_SOURCE_TABLE"?`) {
		t.Errorf("exit %d, stderr does not name the misspelt variable:\n%s%s", code, out, errOut)
	}
}

// Help for every command, including version and help; feed --help; no
// usage error ends in a stray ": usage".
func TestCLIHelpEdges(t *testing.T) {
	for _, args := range [][]string{{"help", "version"}, {"help", "help"}, {"feed", "--help"}, {"feed", "-h"}} {
		code, out, errOut := edgeCLI(t, nil, args...)
		if code != exitOK || errOut != "" || out == "" {
			t.Errorf("%v: exit %d\n%s%s", args, code, out, errOut)
		}
		if strings.Contains(errOut, "did you mean") {
			t.Errorf("%v: %s", args, errOut)
		}
	}
	if _, out, _ := edgeCLI(t, nil, "help", "version"); !strings.Contains(out, "tidemark version") {
		t.Errorf("help version:\n%s", out)
	}
	if _, out, _ := edgeCLI(t, nil, "feed", "--help"); !strings.Contains(out, "--hmac-key-file") {
		t.Errorf("feed --help does not show the feed's flags:\n%s", out)
	}
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db", "")
	for _, args := range [][]string{
		{"run", "--config", cfg, "--onse"},
		{"run", "--config", cfg, "stray"},
		{"feed", "--config", cfg},
		{"status", "--config", cfg, "--task", "x"},
	} {
		code, _, errOut := edgeCLI(t, nil, args...)
		if code != exitConfig || strings.Contains(errOut, ": usage") {
			t.Errorf("%v: exit %d, want 2 without a stray \": usage\":\n%s", args, code, errOut)
		}
	}
}

// Boolean configuration keys are flags that take no value (--key), or
// --key=false; they do not swallow the next argument.
func TestCLIBoolKeyFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db", "")
	a := &cli{stdout: io.Discard, stderr: io.Discard, env: func(string) string { return "" }}
	if err := a.parse("run", []string{"--config", cfg, "--kafka.allow_non_compacted", "--once", "--source.horizon=false"}); err != nil {
		t.Fatalf("parse: %v", err)
	}
	if !a.cfg.Kafka.AllowNonCompacted || !a.once || a.cfg.Source.Horizon {
		t.Errorf("allow_non_compacted %v, once %v, horizon %v; want true, true, false", a.cfg.Kafka.AllowNonCompacted, a.once, a.cfg.Source.Horizon)
	}
	a = &cli{stdout: io.Discard, stderr: io.Discard, env: func(string) string { return "" }}
	if err := a.parse("run", []string{"--config", cfg, "--source.horizon", "--kafka.allow_non_compacted=true"}); err != nil {
		t.Fatalf("parse: %v", err)
	}
	if !a.cfg.Source.Horizon || !a.cfg.Kafka.AllowNonCompacted {
		t.Errorf("horizon %v, allow_non_compacted %v; want both true", a.cfg.Source.Horizon, a.cfg.Kafka.AllowNonCompacted)
	}
	if _, _, errOut := edgeCLI(t, nil, "run", "--config", cfg, "--source.horizon=maybe"); !strings.Contains(errOut, "source.horizon") {
		t.Errorf("--source.horizon=maybe: %s", errOut)
	}
}

// verify's --replica-* flags without --replica-table are a usage error,
// not silently ignored.
func TestCLIVerifyReplicaFlagsNeedTable(t *testing.T) {
	dir := t.TempDir()
	cfg := writeEdgeConfig(t, dir, "c.yaml", "postgres://u@127.0.0.1:1/db", "")
	for _, flags := range [][]string{
		{"--replica-dsn", "postgres://u@127.0.0.1:1/r"},
		{"--replica-schema", "s"},
		{"--replica-password-env", "PW"},
		{"--replica-password-file", "/nonexistent"},
	} {
		args := append([]string{"verify", "--config", cfg}, flags...)
		code, _, errOut := edgeCLI(t, nil, args...)
		if code != exitConfig || !strings.Contains(errOut, "--replica-table") || !strings.Contains(errOut, flags[0]) {
			t.Errorf("%v: exit %d, want 2 naming --replica-table\n%s", args, code, errOut)
		}
	}
}

// redactText keeps the punctuation after a URL out of it: "URL: error"
// stays "URL: error", with the URL's secrets redacted.
func TestRedactTextTrailingPunctuation(t *testing.T) {
	for in, want := range map[string]string{
		"get https://api.example.com/changes?api_key=s3cr3t: connection refused": "get https://api.example.com/changes?api_key=REDACTED: connection refused",
		"see https://api.example.com/changes?cursor=7.":                          "see https://api.example.com/changes?cursor=7.",
		"(at https://u:pw@api.example.com/x), then":                              "(at https://u:REDACTED@api.example.com/x), then",
		"https://en.example.org/wiki/A_(b)":                                      "https://en.example.org/wiki/A_(b)",
	} {
		if got := redactText(in); got != want {
			t.Errorf("redactText(%q)\n = %q\nwant %q", in, got, want)
		}
	}
}

// The README, the example configuration and the code agree: the Go
// version of go.mod, the id column types check accepts, and `make test`
// running every test against a real PostgreSQL (CI=true: the harness
// fails instead of skipping without one).
func TestDocsAgreeWithCode(t *testing.T) {
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join("..", "..", p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	gomod, readme, example := read("go.mod"), read("README.md"), read("tidemark.example.yaml")
	goVer := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(gomod)
	if goVer == nil || !strings.Contains(readme, "Go "+goVer[1]+" or later") {
		t.Errorf("README does not say Go %v or later", goVer)
	}
	ids := regexp.MustCompile(`\s+#?\s*`).ReplaceAllString(strings.Join(regexp.MustCompile(`(?s)# Row id column.*?id_column:`).FindAllString(example, 1), ""), " ")
	for _, ty := range []string{"bigint", "integer", "smallint", "text", "varchar", "uuid"} {
		if !strings.Contains(ids, ty) {
			t.Errorf("tidemark.example.yaml's id_column comment lacks %s: %s", ty, ids)
		}
	}
	mk := read("Makefile")
	recipe := regexp.MustCompile(`(?m)^test:.*\n((?:\t.*\n)+)`).FindStringSubmatch(mk)
	if recipe == nil || !strings.Contains(recipe[1], "CI=true") {
		t.Errorf("the Makefile's test target does not set CI=true:\n%v", recipe)
	}
	if !strings.Contains(readme, "`make test` sets `CI=true`") {
		t.Errorf("README does not say that make test sets CI=true")
	}
}

// TestTopicRefusalsAreConfiguration: a topic tidemark or the broker refuses
// (not compacted, an offsets topic of several partitions, a replication
// factor the cluster cannot give) needs a change of configuration or of the
// topic: exit 2, not exit 1 and "run again to resume", which a restart
// policy would loop on.
func TestTopicRefusalsAreConfiguration(t *testing.T) {
	err := fmt.Errorf("ensure topics: %w", fmt.Errorf("data topic %q has cleanup.policy=delete: %w", "t", producer.ErrTopicConfig))
	if code := exitCode(err); code != exitConfig {
		t.Errorf("a refused topic: exit %d, want %d", code, exitConfig)
	}
}

// A TIDEMARK_* variable that the configuration names as a password's or an
// auth value's (source.password_env, as the compose demo does) is not
// "ignored": no warning names it.
func TestCLIPasswordEnvIsNotUnknown(t *testing.T) {
	env := map[string]string{"TIDEMARK_NAME": "t", "TIDEMARK_SOURCE_DSN": "host=127.0.0.1 port=1 dbname=d user=u", "TIDEMARK_SOURCE_TABLE": "orders",
		"TIDEMARK_SOURCE_PASSWORD_ENV": "TIDEMARK_PG_PASSWORD", "TIDEMARK_PG_PASSWORD": "pw", "TIDEMARK_SOURCE_TABEL": "x"}
	_, out, errOut := edgeCLI(t, env, "check")
	if strings.Contains(out+errOut, "TIDEMARK_PG_PASSWORD sets no configuration key") || !strings.Contains(out+errOut, "TIDEMARK_SOURCE_TABEL") {
		t.Errorf("the password variable is reported as unknown, or the misspelt one is not:\n%s%s", out, errOut)
	}
}

// verify --replica-dsn logs in to the replica database with the replica's
// password (--replica-password-env or --replica-password-file, else the
// DSN's or none), never with source.password_file's, which is read again
// for every connection of the source alone.
func TestCLIVerifyReplicaPasswordIsTheReplicas(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL, v text); CREATE INDEX ON items (updated_at, id)`)
	port, got := fakePostgres(t)
	dir := t.TempDir()
	write := func(name, v string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	srcFile, tgtFile := write("source-pw", "source-S3cret"), write("target-pw", "target-file-S3cret")
	cfg := writeEdgeConfig(t, dir, "c.yaml", db.URL, "  schema: "+db.Schema+"\n  password_file: "+srcFile+"\n")
	replicaDSN := "host=127.0.0.1 port=" + port + " user=u dbname=d sslmode=disable connect_timeout=5"
	env := map[string]string{"TGT_PW": "target-env-S3cret"}
	for _, tc := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--replica-password-env", "TGT_PW"}, "target-env-S3cret"},
		{[]string{"--replica-password-file", tgtFile}, "target-file-S3cret"},
		{[]string{"--replica-dsn", replicaDSN + " password=in-the-dsn"}, "in-the-dsn"},
	} {
		args := append([]string{"verify", "--config", cfg, "--replica-table", "r", "--replica-dsn", replicaDSN}, tc.flags...)
		code, _, errOut := edgeCLI(t, env, args...)
		wantPassword(t, got, fmt.Sprint(tc.flags), tc.want, code, errOut)
		for len(got) > 0 {
			<-got
		}
	}
}
