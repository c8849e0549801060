package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/testcontainers/testcontainers-go"
)

// Postgres is a running PostgreSQL server.
type Postgres struct {
	// URL connects as a superuser to the server's default database.
	URL string

	dir  string // data dir of a throwaway cluster ("" when external)
	bin  string
	cred *syscall.Credential
	opts string                   // server options of a throwaway cluster
	ctr  testcontainers.Container // the container (containers backend)
}

var (
	pgOnce   sync.Once
	pgShared *Postgres
	pgErr    error
)

// Main runs a package's tests and stops the shared PostgreSQL afterwards.
// Use it from TestMain: func TestMain(m *testing.M) { harness.Main(m) }.
// With the containers backend it first checks that a Docker engine answers
// (backend.go), and ends the process with exit code 2 if none does.
func Main(m *testing.M) {
	Backend()
	code := m.Run()
	if pgShared != nil {
		pgShared.Stop()
	}
	os.Exit(code)
}

// PG returns the package's shared PostgreSQL, starting it on first use. It
// skips the test when no PostgreSQL is available, except under CI=true,
// where that is a failure. With the containers backend it is a postgres
// container shared by the package, and a failure to start it always fails.
func PG(t testing.TB) *Postgres {
	t.Helper()
	pgOnce.Do(func() { pgShared, pgErr = startPostgres() })
	if pgErr != nil && containers() {
		t.Fatalf("PostgreSQL container: %v", pgErr)
	}
	if pgErr != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", pgErr)
		}
		t.Skipf("no PostgreSQL available (set DATABASE_URL or install the server binaries): %v", pgErr)
	}
	return pgShared
}

// StartPostgres starts a dedicated throwaway cluster (not the shared one),
// for tests that restart or kill the server. It is stopped at cleanup. With
// the containers backend it is a container of its own, and a failure to
// start it always fails the test.
func StartPostgres(t testing.TB) *Postgres {
	t.Helper()
	if containers() {
		p, err := startPostgresContainer()
		if err != nil {
			t.Fatalf("PostgreSQL container: %v", err)
		}
		t.Cleanup(p.Stop)
		return p
	}
	p, err := startCluster()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PostgreSQL is required under CI=true: %v", err)
		}
		t.Skipf("cannot start a PostgreSQL cluster: %v", err)
	}
	t.Cleanup(p.Stop)
	return p
}

// StartCluster starts a throwaway cluster outside of a test (the demo and
// the benchmarks use it). The caller must Stop it. With the containers
// backend it is a container, and when that does not start the process ends
// with exit code 2 rather than let the caller skip (test/chaos calls it from
// TestMain).
func StartCluster() (*Postgres, error) {
	if containers() {
		p, err := startPostgresContainer()
		if err != nil {
			containerError(err)
		}
		return p, nil
	}
	return startCluster()
}

func startPostgres() (*Postgres, error) {
	if containers() {
		return startPostgresContainer()
	}
	if u := os.Getenv("DATABASE_URL"); u != "" {
		return &Postgres{URL: u}, nil
	}
	return startCluster()
}

func pgBinDir() (string, error) {
	out, err := exec.Command("pg_config", "--bindir").Output()
	if err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	return "", fmt.Errorf("initdb not found (pg_config --bindir, /usr/lib/postgresql/*/bin)")
}

// startCluster initdb's a cluster in a temp dir and starts it on a free
// loopback port. As root it runs the server as the postgres OS user, since
// PostgreSQL refuses to run as root.
func startCluster() (*Postgres, error) {
	bin, err := pgBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "tidemark-pg-")
	if err != nil {
		return nil, err
	}
	p := &Postgres{dir: dir, bin: bin}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the postgres OS user: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		p.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		_ = os.Chmod(dir, 0o700)
	}
	data := filepath.Join(dir, "data")
	if out, err := p.cmd("initdb", "-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync").CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb: %v: %s", err, out)
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	opts := fmt.Sprintf("-c listen_addresses=127.0.0.1 -p %d -k %s %s", port, dir, serverSettings)
	p.opts = opts
	if out, err := p.cmd("pg_ctl", "-D", data, "-o", opts, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "log"))
		os.RemoveAll(dir)
		return nil, fmt.Errorf("pg_ctl start: %v: %s\n%s", err, out, log)
	}
	p.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
	return p, nil
}

// serverSettings are the server options of every throwaway server, local
// or in a container: speed over durability, room for many connections.
const serverSettings = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -c shared_buffers=256MB"

func (p *Postgres) cmd(name string, args ...string) *exec.Cmd {
	c := exec.Command(filepath.Join(p.bin, name), args...)
	c.Dir = p.dir
	if p.cred != nil {
		c.SysProcAttr = &syscall.SysProcAttr{Credential: p.cred}
	}
	return c
}

// Restart stops the server (fast shutdown: open connections are dropped)
// and starts it again on the same port. Only for dedicated clusters.
func (p *Postgres) Restart(t testing.TB) {
	t.Helper()
	if p.ctr != nil {
		p.restartContainer(t)
		return
	}
	if p.dir == "" {
		t.Fatal("Restart needs a throwaway cluster (StartPostgres)")
	}
	data := filepath.Join(p.dir, "data")
	// -l: without a log file the new server inherits this command's output
	// and CombinedOutput would wait until that server stops.
	if out, err := p.cmd("pg_ctl", "-D", data, "-l", filepath.Join(p.dir, "log"), "-m", "fast", "-w", "restart").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl restart: %v: %s", err, out)
	}
}

// StopServer stops a throwaway cluster's server (fast shutdown: open
// connections are dropped) and keeps its data, for outage tests; StartServer
// starts it again on the same port. Local clusters only: the containers
// backend skips the test.
func (p *Postgres) StopServer(t testing.TB) {
	t.Helper()
	p.needLocal(t)
	if out, err := p.cmd("pg_ctl", "-D", filepath.Join(p.dir, "data"), "-m", "fast", "-w", "stop").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl stop: %v: %s", err, out)
	}
}

// StartServer starts a server stopped by StopServer.
func (p *Postgres) StartServer(t testing.TB) {
	t.Helper()
	p.needLocal(t)
	data := filepath.Join(p.dir, "data")
	if out, err := p.cmd("pg_ctl", "-D", data, "-o", p.opts, "-l", filepath.Join(p.dir, "log"), "-w", "-t", "60", "start").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl start: %v: %s", err, out)
	}
}

// RequirePasswords makes every TCP login but the superuser's (postgres, as
// in URL) authenticate with a password (scram-sha-256), and reloads the
// server's configuration. Local throwaway clusters only: the containers
// backend skips the test.
func (p *Postgres) RequirePasswords(t testing.TB) {
	t.Helper()
	p.needLocal(t)
	hba := "local all all trust\nhost all postgres 127.0.0.1/32 trust\nhost all all 127.0.0.1/32 scram-sha-256\n"
	// The file exists (initdb wrote it) and keeps its owner when rewritten.
	if err := os.WriteFile(filepath.Join(p.dir, "data", "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := p.cmd("pg_ctl", "-D", filepath.Join(p.dir, "data"), "reload").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl reload: %v: %s", err, out)
	}
}

// RequireClientCerts turns TLS on with the given server certificate and
// key (PEM) and makes every TCP login of user authenticate with a client
// certificate signed by ca (PEM) whose common name is user (hostssl, cert);
// the superuser (postgres, as in URL) still logs in as before. Called
// again, it replaces the files and reloads: the new certificate and CA
// hold for new connections, as soon as it returns. It replaces pg_hba.conf
// whole, so it does not combine with RequirePasswords. Local throwaway
// clusters only: the containers backend skips the test.
func (p *Postgres) RequireClientCerts(t testing.TB, user string, ca, cert, key []byte) {
	t.Helper()
	p.needLocal(t)
	data := filepath.Join(p.dir, "data")
	for name, b := range map[string][]byte{"tm_ca.crt": ca, "tm_server.crt": cert, "tm_server.key": key} {
		path := filepath.Join(data, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if p.cred != nil {
			if err := os.Chown(path, int(p.cred.Uid), int(p.cred.Gid)); err != nil {
				t.Fatal(err)
			}
		}
	}
	conf := "\nssl = on\nssl_ca_file = 'tm_ca.crt'\nssl_cert_file = 'tm_server.crt'\nssl_key_file = 'tm_server.key'\n"
	confPath := filepath.Join(data, "postgresql.conf")
	had, err := os.ReadFile(confPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(had), conf) { // once: the file names stay
		f, err := os.OpenFile(confPath, os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		_, err = f.WriteString(conf)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	hba := fmt.Sprintf("local all all trust\nhost all postgres 127.0.0.1/32 trust\nhostssl all %s 127.0.0.1/32 cert\n", user)
	if err := os.WriteFile(filepath.Join(data, "pg_hba.conf"), []byte(hba), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := confLoadTime(p.URL)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := p.cmd("pg_ctl", "-D", data, "reload").CombinedOutput(); err != nil {
		t.Fatalf("pg_ctl reload: %v: %s", err, out)
	}
	// pg_ctl reload only signals the server: wait until a new session
	// reports a later load of the configuration (the postmaster reloads
	// all of it, files and pg_hba.conf, before it starts new sessions).
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := confLoadTime(p.URL)
		if err == nil && after.After(before) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("RequireClientCerts: the server has not reloaded its configuration (%v)", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// confLoadTime is pg_conf_load_time() in a new session to url.
func confLoadTime(url string) (time.Time, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return time.Time{}, err
	}
	defer conn.Close(ctx)
	var at time.Time
	err = conn.QueryRow(ctx, "SELECT pg_conf_load_time()").Scan(&at)
	return at, err
}

func (p *Postgres) needLocal(t testing.TB) {
	t.Helper()
	if p.ctr != nil {
		t.Skip("stopping and starting the server needs a local throwaway cluster, not the containers backend")
	}
	if p.dir == "" {
		t.Fatal("needs a throwaway cluster (StartPostgres or StartCluster)")
	}
}

// Stop stops a throwaway cluster and removes its directory, or removes
// its container.
func (p *Postgres) Stop() {
	if p.ctr != nil {
		terminate(p.ctr)
		p.ctr = nil
		return
	}
	if p.dir == "" {
		return
	}
	_ = p.cmd("pg_ctl", "-D", filepath.Join(p.dir, "data"), "-m", "immediate", "-w", "stop").Run()
	os.RemoveAll(p.dir)
	p.dir = ""
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

var nonIdent = regexp.MustCompile(`[^a-z0-9_]+`)

// DB is a per-test database handle: a schema of its own on the shared
// server, dropped at cleanup.
type DB struct {
	Pool   *pgxpool.Pool
	Schema string
	// URL connects with search_path set to Schema.
	URL string
}

// NewDB creates a schema named after the test and returns a pool whose
// search_path is that schema.
func NewDB(t testing.TB) *DB {
	t.Helper()
	return NewDBOn(t, PG(t))
}

// NewDBOn is NewDB on a given server.
func NewDBOn(t testing.TB, pg *Postgres) *DB {
	t.Helper()
	ctx := context.Background()
	name := strings.ToLower(t.Name())
	name = nonIdent.ReplaceAllString(name, "_")
	if len(name) > 40 {
		name = name[len(name)-40:]
	}
	name = fmt.Sprintf("t_%s_%d", strings.Trim(name, "_"), time.Now().UnixNano()%1e6)
	admin, err := pgx.Connect(ctx, pg.URL)
	if err != nil {
		t.Fatalf("connect %s: %v", redact(pg.URL), err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	url := withSearchPath(pg.URL, name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatalf("pool: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		c, err := pgx.Connect(context.Background(), pg.URL)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{name}.Sanitize()+" CASCADE")
			c.Close(context.Background())
		}
	})
	return &DB{Pool: pool, Schema: name, URL: url}
}

func withSearchPath(url, schema string) string {
	sep := "?"
	if strings.Contains(url, "?") {
		sep = "&"
	}
	return url + sep + "search_path=" + schema
}

func redact(url string) string {
	return regexp.MustCompile(`(://[^:/@]+:)[^@]*@`).ReplaceAllString(url, "${1}REDACTED@")
}

// Exec runs SQL on the test's schema and fails the test on error.
func (d *DB) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	if _, err := d.Pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("exec %q: %v", sql, err)
	}
}
