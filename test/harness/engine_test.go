package harness_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tidemark/tidemark/test/harness"
	"github.com/tidemark/tidemark/test/harness/dockerengine"
)

// The containers backend and `make test-containers` must say plainly that
// no Docker engine is reachable, and fail. These tests point the check at
// closed loopback ports, missing sockets and fake engines on loopback; they
// never reach a real engine.

// closedPort returns a loopback port that nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return port
}

// fakeEngine serves /_ping on l the way a Docker engine does (status 200,
// body OK), or with status when it is not 200.
func fakeEngine(t *testing.T, l net.Listener, status int) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/_ping" || status != http.StatusOK {
			http.Error(w, "not found", max(status, http.StatusNotFound))
			return
		}
		w.Header().Set("Api-Version", "1.47")
		fmt.Fprint(w, "OK")
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
}

func unixListener(t *testing.T, path string) net.Listener {
	t.Helper()
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestEngineCheckWithoutEngine(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "docker.sock")
	port := closedPort(t)

	// A socket file whose server is gone.
	stale := filepath.Join(dir, "stale.sock")
	l := unixListener(t, stale)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	l.Close()

	// A loopback server that accepts and never answers.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()

	// A loopback HTTP server that is not a Docker engine.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fakeEngine(t, other, http.StatusNotFound)

	const tail = "); make test-containers needs one"
	for _, c := range []struct {
		name string
		env  dockerengine.Env
		want string
	}{
		{"DOCKER_HOST at a closed loopback port",
			dockerengine.Env{DockerHost: fmt.Sprintf("tcp://127.0.0.1:%d", port), Sockets: []string{missing}},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=tcp://127.0.0.1:%d did not answer: connect: connection refused, %s missing", port, missing) + tail},
		{"DOCKER_HOST at a missing socket",
			dockerengine.Env{DockerHost: "unix://" + missing, Sockets: []string{missing}},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=unix://%s did not answer: connect: no such file or directory, %s missing", missing, missing) + tail},
		{"DOCKER_HOST unset, no socket",
			dockerengine.Env{Sockets: []string{missing, filepath.Join(dir, "rootless.sock")}},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST unset, %s missing", missing) + tail},
		{"DOCKER_HOST unset, a stale socket",
			dockerengine.Env{Sockets: []string{missing, stale}},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST unset, %s missing, %s did not answer: connect: connection refused", missing, stale) + tail},
		{"DOCKER_HOST set, default socket present",
			dockerengine.Env{DockerHost: fmt.Sprintf("tcp://127.0.0.1:%d", port), Sockets: []string{stale}},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=tcp://127.0.0.1:%d did not answer: connect: connection refused, %s present but not tried because DOCKER_HOST is set", port, stale) + tail},
		{"a server that never answers",
			dockerengine.Env{DockerHost: "tcp://" + silent.Addr().String(), Sockets: []string{missing}, Timeout: 300 * time.Millisecond},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=tcp://%s did not answer: no answer within 300ms, %s missing", silent.Addr(), missing) + tail},
		{"an HTTP server that is not Docker",
			dockerengine.Env{DockerHost: "tcp://" + other.Addr().String(), Sockets: []string{missing}},
			fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=tcp://%s did not answer: answered HTTP 404 to /_ping, not a Docker engine, %s missing", other.Addr(), missing) + tail},
		{"an unsupported scheme",
			dockerengine.Env{DockerHost: "ssh://user@127.0.0.1", Sockets: []string{missing}},
			fmt.Sprintf(`no Docker engine reachable (DOCKER_HOST=ssh://user@127.0.0.1 did not answer: scheme "ssh" is not supported here (use unix:// or tcp://), %s missing`, missing) + tail},
	} {
		t.Run(c.name, func(t *testing.T) {
			host, err := dockerengine.Check(context.Background(), c.env)
			var u *dockerengine.Unreachable
			if !errors.As(err, &u) {
				t.Fatalf("Check = %q, %v; want *Unreachable", host, err)
			}
			if err.Error() != c.want {
				t.Errorf("message\n got: %s\nwant: %s", err, c.want)
			}
		})
	}
}

// TestEngineCheckFindsEngine: the check is not a constant "no": a fake
// engine on loopback, over tcp or a unix socket, is found.
func TestEngineCheckFindsEngine(t *testing.T) {
	dir := t.TempDir()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fakeEngine(t, l, http.StatusOK)
	tcp := "tcp://" + l.Addr().String()
	if host, err := dockerengine.Check(context.Background(), dockerengine.Env{DockerHost: tcp}); err != nil || host != tcp {
		t.Errorf("tcp: Check = %q, %v; want %q", host, err, tcp)
	}

	sock := filepath.Join(dir, "desktop.sock")
	fakeEngine(t, unixListener(t, sock), http.StatusOK)
	env := dockerengine.Env{Sockets: []string{filepath.Join(dir, "docker.sock"), sock}}
	if host, err := dockerengine.Check(context.Background(), env); err != nil || host != "unix://"+sock {
		t.Errorf("unix: Check = %q, %v; want %q", host, err, "unix://"+sock)
	}
}

// childEnv is this process's environment without the variables the
// children get from the test.
func childEnv(extra ...string) []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch k {
		case "DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH", harness.BackendEnv, "MAKEFLAGS", "MFLAGS", "MAKELEVEL":
			continue
		}
		out = append(out, kv)
	}
	return append(out, extra...)
}

// run runs cmd in its own process group, killed whole after timeout, and
// returns its exit code and combined output.
func run(t *testing.T, cmd *exec.Cmd, timeout time.Duration) (int, string) {
	t.Helper()
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", cmd.Args, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(timeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		t.Fatalf("%v still ran after %s: it must stop at the engine check; output:\n%s", cmd.Args, timeout, out.String())
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// TestContainersBackendFailsWithoutEngine runs this package's own test
// binary with the containers backend and DOCKER_HOST at a closed loopback
// port: it must fail with the one message, neither skip nor pass.
func TestContainersBackendFailsWithoutEngine(t *testing.T) {
	port := closedPort(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestPostgresStarts$", "-test.v")
	cmd.Env = childEnv(harness.BackendEnv+"="+harness.BackendContainers, fmt.Sprintf("DOCKER_HOST=tcp://127.0.0.1:%d", port))
	code, out := run(t, cmd, 2*time.Minute)
	want := fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=tcp://127.0.0.1:%d did not answer: connect: connection refused, ", port)
	if code != 2 || !strings.Contains(out, want) || !strings.Contains(out, "make test-containers needs one\n") {
		t.Errorf("exit %d, output:\n%s\nwant exit 2 and %q ... %q", code, out, want, "make test-containers needs one")
	}
	for _, s := range []string{"=== RUN", "SKIP", "PASS"} {
		if strings.Contains(out, s) {
			t.Errorf("output has %q: a test ran without an engine:\n%s", s, out)
		}
	}

	cmd = exec.Command(os.Args[0], "-test.run=^TestPostgresStarts$")
	cmd.Env = childEnv(harness.BackendEnv + "=kubernetes")
	code, out = run(t, cmd, 2*time.Minute)
	if code != 2 || !strings.Contains(out, `TIDEMARK_TEST_BACKEND="kubernetes": want "local" (or unset) or "containers"`) {
		t.Errorf("an unknown backend: exit %d, output:\n%s", code, out)
	}
}

// TestMakeTestContainersRefusesWithoutEngine runs `make test-containers`
// with DOCKER_HOST at a closed loopback port: it must print the message
// and exit 2 before it runs any suite.
func TestMakeTestContainersRefusesWithoutEngine(t *testing.T) {
	makeBin, err := exec.LookPath("make")
	if err != nil {
		t.Skip("make is not installed")
	}
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	port := closedPort(t)
	cmd := exec.Command(makeBin, "-C", root, "test-containers")
	cmd.Env = childEnv(fmt.Sprintf("DOCKER_HOST=tcp://127.0.0.1:%d", port))
	code, out := run(t, cmd, 5*time.Minute)
	want := fmt.Sprintf("no Docker engine reachable (DOCKER_HOST=tcp://127.0.0.1:%d did not answer: connect: connection refused, ", port)
	if code != 2 || !strings.Contains(out, want) || !strings.Contains(out, "make test-containers needs one\n") {
		t.Errorf("exit %d, output:\n%s\nwant exit 2 and %q ... %q", code, out, want, "make test-containers needs one")
	}
	if strings.Contains(out, "go test") {
		t.Errorf("make went on to the suites without an engine:\n%s", out)
	}
}
