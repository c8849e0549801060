// Package dockerengine tells whether a Docker engine answers, before the
// containers backend of the test harness (test/harness/containers.go) starts
// anything, and says plainly why not when none does. It uses only the
// standard library, so that `make test-containers` can run the same check
// (test/harness/enginecheck) quickly before it runs any suite.
package dockerengine

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultSocket is where a Docker engine listens when DOCKER_HOST is unset.
const DefaultSocket = "/var/run/docker.sock"

// Env is what the check looks at, read from the environment by FromEnviron
// and given explicitly by tests.
type Env struct {
	// DockerHost is DOCKER_HOST ("" = unset). When set it is the only
	// engine tried, as the docker CLI does: an explicit setting never falls
	// back to another engine.
	DockerHost string
	// TLSVerify and CertPath are DOCKER_TLS_VERIFY and DOCKER_CERT_PATH,
	// for a tcp:// DOCKER_HOST.
	TLSVerify string
	CertPath  string
	// Sockets are the unix sockets tried in order when DockerHost is
	// unset. Sockets[0] is the default one, always named in the message.
	Sockets []string
	// Timeout bounds each attempt; 0 means 5s.
	Timeout time.Duration
}

// FromEnviron reads DOCKER_HOST, DOCKER_TLS_VERIFY and DOCKER_CERT_PATH,
// and lists the default socket, then the rootless and Docker Desktop ones.
func FromEnviron() Env {
	e := Env{
		DockerHost: os.Getenv("DOCKER_HOST"),
		TLSVerify:  os.Getenv("DOCKER_TLS_VERIFY"),
		CertPath:   os.Getenv("DOCKER_CERT_PATH"),
		Sockets:    []string{DefaultSocket},
	}
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		e.Sockets = append(e.Sockets, filepath.Join(d, "docker.sock"))
	}
	if h, err := os.UserHomeDir(); err == nil {
		e.Sockets = append(e.Sockets, filepath.Join(h, ".docker", "run", "docker.sock"), filepath.Join(h, ".docker", "desktop", "docker.sock"))
	}
	return e
}

// Unreachable is the error of Check: no engine answered. Its message is the
// one `make test-containers` and the containers backend print.
type Unreachable struct {
	// Tried describes each place looked at, in order.
	Tried []string
}

func (u *Unreachable) Error() string {
	return "no Docker engine reachable (" + strings.Join(u.Tried, ", ") + "); make test-containers needs one"
}

// Check pings the engine (GET /_ping must answer 200 "OK") and returns its
// address in DOCKER_HOST form (unix:///path or tcp://host:port). With no
// engine it returns an *Unreachable.
func Check(ctx context.Context, e Env) (string, error) {
	if e.Timeout <= 0 {
		e.Timeout = 5 * time.Second
	}
	def := DefaultSocket
	if len(e.Sockets) > 0 {
		def = e.Sockets[0]
	}
	u := &Unreachable{}
	if e.DockerHost != "" {
		err := ping(ctx, e, e.DockerHost)
		if err == nil {
			return e.DockerHost, nil
		}
		u.Tried = append(u.Tried, fmt.Sprintf("DOCKER_HOST=%s did not answer: %s", e.DockerHost, reason(err, e.Timeout)))
		if _, serr := os.Stat(def); serr != nil {
			u.Tried = append(u.Tried, def+" missing")
		} else {
			u.Tried = append(u.Tried, def+" present but not tried because DOCKER_HOST is set")
		}
		return "", u
	}
	u.Tried = append(u.Tried, "DOCKER_HOST unset")
	for i, s := range e.Sockets {
		if _, serr := os.Stat(s); serr != nil {
			if i == 0 {
				u.Tried = append(u.Tried, s+" missing")
			}
			continue
		}
		host := "unix://" + s
		err := ping(ctx, e, host)
		if err == nil {
			return host, nil
		}
		u.Tried = append(u.Tried, fmt.Sprintf("%s did not answer: %s", s, reason(err, e.Timeout)))
	}
	return "", u
}

// errNotDocker is an HTTP answer that is not a Docker engine's.
type errNotDocker struct{ status int }

func (e errNotDocker) Error() string {
	return fmt.Sprintf("answered HTTP %d to /_ping, not a Docker engine", e.status)
}

// ping sends GET /_ping to host (DOCKER_HOST form).
func ping(ctx context.Context, e Env, host string) error {
	u, err := url.Parse(host)
	if err != nil {
		return err
	}
	tr := &http.Transport{DisableKeepAlives: true}
	base := "http://docker"
	d := &net.Dialer{Timeout: e.Timeout}
	switch u.Scheme {
	case "unix":
		path := u.Path
		if path == "" {
			path = u.Opaque
		}
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "unix", path)
		}
	case "tcp", "http", "https":
		tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", u.Host)
		}
		if u.Scheme == "https" || e.TLSVerify != "" || e.CertPath != "" {
			cfg, err := tlsConfig(e)
			if err != nil {
				return err
			}
			cfg.ServerName = u.Hostname()
			base = "https://docker"
			tr.DialTLSContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", u.Host)
			}
		}
	default:
		return fmt.Errorf("scheme %q is not supported here (use unix:// or tcp://)", u.Scheme)
	}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(ctx, e.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/_ping", nil)
	if err != nil {
		return err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	if resp.StatusCode != http.StatusOK || strings.TrimSpace(string(body)) != "OK" {
		return errNotDocker{resp.StatusCode}
	}
	return nil
}

// tlsConfig is DOCKER_TLS_VERIFY / DOCKER_CERT_PATH as the docker CLI reads
// them: ca.pem, cert.pem and key.pem in the cert path (~/.docker by
// default); the server is verified only with DOCKER_TLS_VERIFY set.
func tlsConfig(e Env) (*tls.Config, error) {
	dir := e.CertPath
	if dir == "" {
		h, err := os.UserHomeDir()
		if err != nil {
			return nil, err
		}
		dir = filepath.Join(h, ".docker")
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: e.TLSVerify == ""}
	if ca, err := os.ReadFile(filepath.Join(dir, "ca.pem")); err == nil {
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		cfg.RootCAs = pool
	} else if e.TLSVerify != "" {
		return nil, fmt.Errorf("DOCKER_TLS_VERIFY is set: %w", err)
	}
	if cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")); err == nil {
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// reason is err in a few words: the syscall error of a failed dial, a
// timeout, or the error itself.
func reason(err error, timeout time.Duration) string {
	var nd errNotDocker
	if errors.As(err, &nd) {
		return nd.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return fmt.Sprintf("no answer within %s", timeout)
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return err.Error()
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
