package main

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// TestStopWaitsForAStoppingTask: the group's revoke callback runs on the
// client's goroutine while shutdown may already be stopping the same task;
// it must not acknowledge the revoke (and let another member start the
// task) before the task has ended.
func TestStopWaitsForAStoppingTask(t *testing.T) {
	s := &supervisor{env: &taskEnv{}, running: map[string]*runningTask{}}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &runningTask{cancel: cancel, done: make(chan struct{})}
	s.running["a"] = rt
	stopped := make(chan time.Time, 1)
	go func() {
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // its transaction commits or aborts
		stopped <- time.Now()
		close(rt.done)
	}()
	go s.stop([]string{"a"}) // shutdown
	time.Sleep(20 * time.Millisecond)
	s.stop([]string{"a"}) // the revoke callback
	acked := time.Now()
	if st := <-stopped; acked.Before(st) {
		t.Fatalf("revoke acknowledged %v before the task stopped", st.Sub(acked))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.running) != 0 {
		t.Errorf("stopped tasks still listed: %v", s.running)
	}
}

// TestGroupACLMissing: a member the broker refuses to let join the group
// (no READ on it) stops with exit 2 naming the grant, instead of retrying
// the join forever with only "membership lost" in its log.
func TestGroupACLMissing(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.ControlKey(int16(kmsg.JoinGroup), func(r kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		resp := r.(*kmsg.JoinGroupRequest).ResponseKind().(*kmsg.JoinGroupResponse)
		resp.ErrorCode = kerr.GroupAuthorizationFailed.Code
		return resp, nil, true
	})
	path := writeConfig(t, `name: shop
source:
  dsn: "postgres://u@127.0.0.1:1/db?sslmode=disable"
kafka:
  brokers: [`+strings.Join(c.ListenAddrs(), ",")+`]
tables:
  - orders
`)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"run", "--config", path}, &out, &errb)
	if code != exitConfig || !strings.Contains(errb.String(), "grant READ") || ctx.Err() != nil {
		t.Fatalf("missing group ACL: exit %d (context %v), want 2 naming the grant; stderr:\n%s", code, ctx.Err(), errb.String())
	}
}

// TestSignalWhileWaitingAtStartUp: `run` started while Kafka does not
// answer waits for it; a signal then is a clean shutdown (exit 0), with a
// single table and in task mode.
func TestSignalWhileWaitingAtStartUp(t *testing.T) {
	for _, tables := range []string{"source:\n  dsn: \"postgres://u@127.0.0.1:1/db?sslmode=disable\"\n  table: orders\n",
		"source:\n  dsn: \"postgres://u@127.0.0.1:1/db?sslmode=disable\"\ntables:\n  - orders\n"} {
		path := writeConfig(t, "name: shop\nkafka:\n  brokers: [\"127.0.0.1:1\"]\n"+tables)
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		var out, errb bytes.Buffer
		code := run(ctx, []string{"run", "--config", path}, &out, &errb)
		cancel()
		if code != exitOK || !strings.Contains(errb.String(), "stopped by a signal") {
			t.Errorf("%s: exit %d, want 0; stderr:\n%s", tables, code, errb.String())
		}
	}
}

// silentListener is a loopback server that accepts connections and never
// answers (a database that hangs).
func silentListener(t *testing.T) net.Listener {
	t.Helper()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	return silent
}

// TestPoolsConnectIndependently: the tasks of a member share one pool per
// DSN; a database that does not answer (a connect that hangs) must not
// hold up the tasks of the others.
func TestPoolsConnectIndependently(t *testing.T) {
	db := harness.NewDB(t)
	silent := silentListener(t)
	env := &taskEnv{pools: map[string]*pgxpool.Pool{}, need: map[string]int{}}
	defer env.close()
	hung, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		_, _ = env.pool(hung, postgres.Config{DSN: "postgres://u@" + silent.Addr().String() + "/db?sslmode=disable"})
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if _, err := env.pool(context.Background(), postgres.Config{DSN: db.URL}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a pool for a healthy database took %s behind a hanging connect", d.Round(time.Millisecond))
	}
}

// TestPoolWaitEndsWithItsContext: a task that waits for another task's
// first connect to the same DSN (one that hangs) stops waiting when its own
// context ends, so a revoke of it is not held up for the connect's
// timeout (and the member evicted past rebalance_timeout).
func TestPoolWaitEndsWithItsContext(t *testing.T) {
	silent := silentListener(t)
	env := &taskEnv{pools: map[string]*pgxpool.Pool{}, need: map[string]int{}}
	defer env.close()
	pc := postgres.Config{DSN: "postgres://u@" + silent.Addr().String() + "/db?sslmode=disable"}
	hung, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() { _, _ = env.pool(hung, pc) }()
	time.Sleep(200 * time.Millisecond)
	revoked, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	start := time.Now()
	if _, err := env.pool(revoked, pc); err == nil {
		t.Fatal("a pool from a database that does not answer")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("the second task waited %s for the first one's connect after its context ended", d.Round(time.Millisecond))
	}
}

// TestSignalStopsAOneShotCommandTruthfully: a one-shot command that a
// signal stops while it waits at start-up exits 1 (it did not do its
// job), saying so, not "runtime failure after retries".
func TestSignalStopsAOneShotCommandTruthfully(t *testing.T) {
	path := writeConfig(t, "name: shop\nkafka:\n  brokers: [\"127.0.0.1:1\"]\nsource:\n  dsn: \"postgres://u@127.0.0.1:1/db?sslmode=disable\"\n  table: orders\n")
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	var out, errb bytes.Buffer
	code := run(ctx, []string{"status", "--config", path}, &out, &errb)
	if code != exitFailure || !strings.Contains(errb.String(), "stopped by a signal") || strings.Contains(errb.String(), "after retries") {
		t.Errorf("exit %d; stderr:\n%s\nstdout:\n%s", code, errb.String(), out.String())
	}
}

// TestAssignedHereWaitsWhileTheGroupCannotBeDescribed: a fenced task asks
// the group whether it is still assigned here before it starts again; a
// coordinator that cannot answer yet (loading, moving) is not a yes, or the
// fenced member would fence the rightful owner in turn. Only a refusal
// that will not pass (no DESCRIBE on the group) leaves it to fencing.
func TestAssignedHereWaitsWhileTheGroupCannotBeDescribed(t *testing.T) {
	for _, tc := range []struct {
		code int16
		want bool
	}{
		{kerr.CoordinatorLoadInProgress.Code, false},
		{kerr.NotCoordinator.Code, false},
		{kerr.GroupAuthorizationFailed.Code, true},
	} {
		c, err := kfake.NewCluster(kfake.NumBrokers(1))
		if err != nil {
			t.Fatal(err)
		}
		c.ControlKey(int16(kmsg.DescribeGroups), func(r kmsg.Request) (kmsg.Response, error, bool) {
			c.KeepControl()
			req := r.(*kmsg.DescribeGroupsRequest)
			resp := req.ResponseKind().(*kmsg.DescribeGroupsResponse)
			for _, g := range req.Groups {
				rg := kmsg.NewDescribeGroupsResponseGroup()
				rg.Group, rg.ErrorCode = g, tc.code
				resp.Groups = append(resp.Groups, rg)
			}
			return resp, nil, true
		})
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
		if err != nil {
			t.Fatal(err)
		}
		a := &cli{cfg: &Config{Name: "shop", Tasks: []Task{{Name: "orders"}}}, log: slog.New(slog.DiscardHandler)}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		got := a.assignedHere(ctx, cl, "tidemark-tasks.shop", Task{Name: "orders"})
		timedOut := ctx.Err() != nil
		cancel()
		cl.Close()
		c.Close()
		if got != tc.want || timedOut == tc.want {
			t.Errorf("%s: assignedHere = %v (waited until the deadline: %v), want %v", kerr.ErrorForCode(tc.code), got, timedOut, tc.want)
		}
	}
}

// TestPoolKeyIgnoresThePasswordReadFromItsFile: a task started again after
// source.password_file was rotated reads a new password from it; it must
// still share the pool of the tasks on the same DSN (whose connections read
// the file themselves), not open one more pool per rotation, sized with
// none of the need the member counted.
func TestPoolKeyIgnoresThePasswordReadFromItsFile(t *testing.T) {
	db := harness.NewDB(t)
	env := &taskEnv{pools: map[string]*pgxpool.Pool{}, need: map[string]int{}}
	defer env.close()
	file := filepath.Join(t.TempDir(), "pw")
	if err := os.WriteFile(file, []byte("second\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := env.pool(context.Background(), postgres.Config{DSN: db.URL, Password: "first", PasswordFile: file})
	if err != nil {
		t.Fatal(err)
	}
	after, err := env.pool(context.Background(), postgres.Config{DSN: db.URL, Password: "second", PasswordFile: file})
	if err != nil {
		t.Fatal(err)
	}
	if before != after {
		t.Errorf("a rotated password file gave a task a pool of its own (%d pools for one DSN)", len(env.pools))
	}
}

// A task that started before and now fails on a credentials error
// (source.password_file missing while it is rotated, a login refused in
// between) is started again after a pause, as such a failure mid-run is
// retried; it does not stay stopped until the next rebalance. Any other
// configuration error (a lacking grant or ACL among them), and a
// credentials error of a task that never started, still stop it.
func TestTaskStartedAgainRetriesACredentialsError(t *testing.T) {
	defer func(d time.Duration) { taskPause = d }(taskPause)
	taskPause = time.Millisecond
	var logs bytes.Buffer
	refused := &ConfigError{Key: "source.password_file", Msg: "read password file /run/secrets/pg: no such file or directory", Credentials: true}
	filter := &ConfigError{Key: "source.filter", Msg: "the filter fails on a row"}
	acl := &ConfigError{Key: "kafka ACLs", Msg: "User:tm lacks WRITE on topic orders"}
	transient := errors.New("transient failure outlasted sync.retry_timeout")
	type start struct {
		started bool
		err     error
	}
	for _, tc := range []struct {
		name   string
		starts []start // what each start returns
		want   error
	}{
		{"started before", []start{{true, transient}, {false, refused}, {false, refused}, {true, nil}}, nil},
		{"refused mid-run", []start{{true, refused}, {true, nil}}, nil},
		{"first start", []start{{false, refused}}, refused},
		{"never started", []start{{false, transient}, {false, refused}}, refused},
		{"not about credentials", []start{{true, transient}, {false, filter}}, filter},
		{"a lacking ACL", []start{{true, transient}, {true, acl}}, acl},
	} {
		calls := 0
		s := &supervisor{a: &cli{log: slog.New(slog.NewTextHandler(&logs, nil))}, running: map[string]*runningTask{}, mode: connector.Continuous,
			runTask: func(context.Context, Task) (bool, error) {
				calls++
				return tc.starts[calls-1].started, tc.starts[calls-1].err
			}}
		if err := s.run(context.Background(), Task{Name: "orders"}); err != tc.want || calls != len(tc.starts) {
			t.Errorf("%s: run returned %v after %d starts; want %v after %d", tc.name, err, calls, tc.want, len(tc.starts))
		}
	}
	if !strings.Contains(logs.String(), "refused its login") {
		t.Errorf("no warning for the start that was refused:\n%s", logs.String())
	}
}
