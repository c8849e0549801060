package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/metrics"
)

// Task mode at run time (docs/scale-out.md). The processes of one
// configuration with tables form the consumer group tidemark-<name> on the
// tasks topic, which has one partition per task: Kafka's group coordinator
// decides the membership and the cooperative-sticky balancer assigns the
// partitions, so each member runs exactly the tasks whose partitions it holds.
// Ownership is not what makes a task safe: a task's engine initialises its
// transactional producer before it reads its checkpoint, which fences every
// earlier owner (docs/design.md, "One writer"). The group only decides who
// should run what, and stops a task before its partition moves on.

// taskEnv is what the tasks of one process share: the Kafka connection
// options (and so one embedded broker), one PostgreSQL pool per DSN, and
// the member's metrics.
type taskEnv struct {
	opts  []kgo.Opt
	group *metrics.Group // nil without metrics.listen, and for the one-shot commands

	mu    sync.Mutex
	pools map[string]*pgxpool.Pool
	need  map[string]int // fixed once built
	// connecting serialises the first connect of each DSN, so that a
	// database that does not answer holds up only its own tasks.
	connecting map[string]chan struct{}
	closed     bool
}

// poolKey tells the pools apart: by DSN and password, or, with a password
// file, by DSN and file (its connections read the file themselves, and
// what a task read from it at its start changes with each rotation).
func poolKey(pc postgres.Config) string {
	if pc.PasswordFile != "" {
		return pc.DSN + "\x00file\x00" + pc.PasswordFile
	}
	return pc.DSN + "\x00" + pc.Password
}

// newTaskEnv opens what the tasks share; closeAll closes it after them.
func (a *cli) newTaskEnv() (*taskEnv, error) {
	opts, err := a.kafkaOpts()
	if err != nil {
		return nil, err
	}
	env := &taskEnv{opts: opts, pools: map[string]*pgxpool.Pool{}, need: map[string]int{}}
	// A task holds at most two connections at once (its pass's view or a
	// snapshot, and a catalog or clock query), plus its load workers.
	for _, t := range a.cfg.Tasks {
		pc, err := a.forTask(t, env).pgConfig()
		if err != nil {
			return nil, err
		}
		env.need[poolKey(pc)] += 2 + max(0, t.Cfg.Sync.LoadWorkers)
	}
	a.closers = append(a.closers, env.close)
	return env, nil
}

// pool returns the pool shared by the tasks that use pc's DSN.
func (e *taskEnv) pool(ctx context.Context, pc postgres.Config) (*pgxpool.Pool, error) {
	k := poolKey(pc)
	e.mu.Lock()
	if p := e.pools[k]; p != nil {
		e.mu.Unlock()
		return p, nil
	}
	if e.connecting == nil {
		e.connecting = map[string]chan struct{}{}
	}
	l := e.connecting[k]
	if l == nil {
		l = make(chan struct{}, 1)
		e.connecting[k] = l
	}
	need := e.need[k]
	e.mu.Unlock()

	// Wait for another task's connect to the same DSN, but no longer than
	// this task may: a revoke must not wait for a connect that hangs.
	select {
	case l <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-l }()
	e.mu.Lock()
	p := e.pools[k]
	e.mu.Unlock()
	if p != nil {
		return p, nil
	}
	p, err := postgres.Connect(ctx, pc, need)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		p.Close()
		return nil, errors.New("shutting down")
	}
	e.pools[k] = p
	return p, nil
}

func (e *taskEnv) close() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.closed = true
	for k, p := range e.pools {
		p.Close()
		delete(e.pools, k)
	}
}

// forTask returns the cli of one task: the command's flags, the task's
// configuration, a logger naming it, and the shared resources of env.
func (a *cli) forTask(t Task, env *taskEnv) *cli {
	return &cli{
		stdout: a.stdout, stderr: a.stderr, env: a.env, environ: a.environ,
		configPath: a.configPath, once: a.once, progress: a.progress, serve: a.serve, sasl: a.sasl,
		jsonOut: a.jsonOut, yes: a.yes, reason: a.reason, by: a.by, toWM: a.toWM, notifySQL: a.notifySQL, notifyTrig: a.notifyTrig,
		replicaDSN: a.replicaDSN, replicaSchema: a.replicaSchema, replicaTable: a.replicaTable,
		replicaPasswordEnv: a.replicaPasswordEnv, replicaPasswordFile: a.replicaPasswordFile,
		replica: a.replica, feed: a.feed,
		cfg: t.Cfg, log: a.log.With("task", t.Name), tasks: env, taskName: t.Name,
	}
}

// selectedTasks is every task, or the one --task names.
func (a *cli) selectedTasks() ([]Task, error) {
	if a.taskFlag == "" {
		return a.cfg.Tasks, nil
	}
	if len(a.cfg.Tasks) == 0 {
		return nil, usageErrorf("--task %q: this configuration has no tables: list, so it has no tasks; drop --task", a.taskFlag)
	}
	t, ok := a.cfg.task(a.taskFlag)
	if !ok {
		return nil, usageErrorf("--task %q: no such task; the tasks are %s", a.taskFlag, a.cfg.taskNames())
	}
	return []Task{t}, nil
}

// supervisor runs the tasks assigned to this member, each in its own
// goroutine; a task that stops on its own stops alone.
type supervisor struct {
	a     *cli
	env   *taskEnv
	ctx   context.Context // the process's: ends on SIGTERM
	mode  connector.Mode
	tasks []Task // partition i of the tasks topic is tasks[i]

	// owns reports whether the group coordinator assigns t to this member
	// (nil outside the group: always).
	owns func(context.Context, Task) bool

	mu      sync.Mutex
	running map[string]*runningTask

	runTask func(context.Context, Task) (bool, error) // tests: replaces runOnce
}

// taskPause is the unit of the pause before a task starts again: attempt
// n waits n units, at most 12.
var taskPause = 5 * time.Second

type runningTask struct {
	cancel context.CancelFunc
	done   chan struct{}
	err    error
	// stopping is set (under supervisor.mu) once stop cancelled it; it
	// stays listed until done, so that every stop waits for it.
	stopping bool
}

// start starts t unless it runs. A task still stopping (revoked and
// assigned back at once) is waited for first.
func (s *supervisor) start(t Task) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		rt := s.running[t.Name]
		if rt == nil {
			break
		}
		select {
		case <-rt.done: // it stopped on its own: a new assignment starts it again
		default:
			if !rt.stopping {
				return
			}
			s.mu.Unlock()
			<-rt.done
			s.mu.Lock()
			continue
		}
		break
	}
	ctx, cancel := context.WithCancel(s.ctx)
	rt := &runningTask{cancel: cancel, done: make(chan struct{})}
	s.running[t.Name] = rt
	go func() {
		defer close(rt.done)
		rt.err = s.run(ctx, t)
	}()
}

// run runs one task until ctx ends or it stops on its own. A transient
// failure that outlasted sync.retry_timeout, or a fence, is retried after a
// pause; a safety stop or a configuration error stops the task until it is
// assigned again. Except a credentials error (a login refused, a password
// file missing) of a task that has started before, in this run or an
// earlier one: the credentials it started with worked, so they changed
// under it (a password being rotated), and it is retried after a pause, as
// such failures are mid-run.
func (s *supervisor) run(ctx context.Context, t Task) error {
	runOnce := s.runOnce
	if s.runTask != nil {
		runOnce = s.runTask
	}
	startedBefore := false
	for attempt := 0; ; attempt++ {
		started, err := runOnce(ctx, t)
		if ctx.Err() != nil || err == nil || s.mode == connector.Once {
			return err
		}
		startedBefore = startedBefore || started
		pause := min(time.Duration(attempt+1)*taskPause, 12*taskPause)
		xerr := s.a.explainKafkaAccess(err)
		switch code := exitCode(xerr); {
		case code == exitConfig && startedBefore && credentialsError(xerr):
			s.a.log.Warn("task that started before was refused its login (a password being rotated?); starting it again", "task", t.Name, "in", pause, "err", xerr.Error())
		case code == exitFailure:
			s.a.log.Warn("task failed after its retries; starting it again", "task", t.Name, "in", pause, "err", err.Error())
		case code == exitFenced:
			// Another writer of the task initialised its session: a
			// `tidemark sweep` or `reset`, a member with a different
			// tables: list, or one the group already counts as gone. The
			// group assigns the task here, so it starts again (and fences
			// that writer in turn); a member that lost the task stops it
			// through the group's callbacks first.
			if s.owns != nil && !s.owns(ctx, t) {
				// The coordinator assigns the task to another member: this
				// one was removed from the group without knowing it yet
				// (a long pause). Restarting would fence the rightful
				// owner; the group's callbacks tell this member soon.
				s.a.log.Warn("task was fenced by its new owner: the group assigns it to another member now; leaving it to the group", "task", t.Name)
				return err
			}
			s.a.log.Warn("task was fenced by another writer of it while the group assigns it here; starting it again", "task", t.Name, "in", pause)
		default:
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
	}
}

// runOnce runs the task once; started reports whether its engine started
// (its configuration, sources and producer session opened).
func (s *supervisor) runOnce(ctx context.Context, t Task) (started bool, err error) {
	c := s.a.forTask(t, s.env)
	defer c.closeAll()
	c.log.Info("task starting", "table", t.Cfg.Source.Schema+"."+t.Cfg.Source.Table, "topic", t.Cfg.Kafka.Topic,
		"transactional_id", "tidemark-"+t.Cfg.Name)
	e, _, err := c.engine(ctx)
	if err == nil {
		started = true
		var comp *connector.Completion
		comp, err = e.Run(ctx, s.mode)
		if comp != nil && s.mode == connector.Once {
			s.a.printCompletion(t.Name, comp)
		}
	}
	switch {
	case ctx.Err() != nil:
		c.log.Info("task stopped", "reason", "given up to the group or shutting down")
		return started, nil
	case err != nil:
		code := exitCode(c.explainKafkaAccess(err))
		c.log.Error("task stopped; the other tasks go on", "exit_code", code, "err", err.Error(), "action", errorAction(err, code))
		if s.env.group != nil {
			s.env.group.ObserveTaskStop()
		}
	}
	return started, err
}

// stop stops the named tasks and waits until each has ended (its open
// transaction aborted or committed, its producer closed), also when
// another stop (shutdown, and the group's revoke on the client's
// goroutine) is already stopping it.
func (s *supervisor) stop(names []string) {
	wait := map[string]*runningTask{}
	s.mu.Lock()
	for _, n := range names {
		if rt := s.running[n]; rt != nil {
			rt.cancel()
			rt.stopping = true
			wait[n] = rt
		}
	}
	s.mu.Unlock()
	for _, rt := range wait {
		<-rt.done
	}
	s.mu.Lock()
	for n, rt := range wait {
		if s.running[n] == rt {
			delete(s.running, n)
		}
	}
	s.mu.Unlock()
	if s.env.group != nil {
		for _, n := range names {
			s.env.group.RemoveTask(n)
		}
	}
}

// names maps assigned partitions of the tasks topic to task names.
func (s *supervisor) names(assigned map[string][]int32) []string {
	var out []string
	for _, ps := range assigned {
		for _, p := range ps {
			if int(p) < len(s.tasks) {
				out = append(out, s.tasks[p].Name)
			} else {
				s.a.log.Warn("group: a partition of the tasks topic names no task in this member's tables: list (a table was removed from the list, or the members run different lists); it runs nothing", "partition", p, "tasks", len(s.tasks))
			}
		}
	}
	slices.Sort(out)
	return out
}

// runGroup is `tidemark run` in task mode: join the group and run the
// assigned tasks until ctx ends, then stop them and leave.
func (a *cli) runGroup(ctx context.Context) error {
	env, err := a.newTaskEnv()
	if err != nil {
		return err
	}
	if a.cfg.Metrics.Listen != "" {
		env.group = metrics.NewGroup(a.cfg.Name, version)
		cl, err := kgo.NewClient(env.opts...)
		if err != nil {
			return err
		}
		a.closers = append(a.closers, cl.Close)
		env.group.AddCheck("kafka", func(ctx context.Context) error { return cl.Ping(ctx) })
		srv, err := env.group.Listen(a.cfg.Metrics.Listen)
		if err != nil {
			return &ConfigError{Key: "metrics.listen", Origin: a.cfg.origin["metrics.listen"], Err: err,
				Msg: "cannot serve metrics; choose a free address or set metrics.listen to \"\" to turn the server off"}
		}
		a.closers = append(a.closers, func() {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		})
		a.log.Info("serving /metrics, /healthz and /readyz", "addr", "http://"+srv.Addr())
	}
	topic := a.cfg.tasksTopic()
	if err := a.startup(ctx, "Kafka (the tasks topic "+topic+")", "kafka", func() error { return a.ensureTasksTopic(ctx, env.opts, topic) }); err != nil {
		return err
	}
	s := &supervisor{a: a, env: env, ctx: ctx, mode: connector.Continuous, tasks: a.cfg.Tasks, running: map[string]*runningTask{}}
	host, _ := os.Hostname()
	member := fmt.Sprintf("tidemark-%s@%s/%d/%04x", a.cfg.Name, host, os.Getpid(), rand.Uint32()>>16)
	cl, err := kgo.NewClient(append(append(slices.Clone(env.opts), groupTimeouts(a.cfg.Group)...), // tasks.go
		kgo.ClientID(member),
		kgo.ConsumerGroup(groupName(a.cfg.Name)),
		kgo.ConsumeTopics(topic),
		kgo.Balancers(kgo.CooperativeStickyBalancer()),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			names := s.names(m)
			a.log.Info("group: assigned tasks", "tasks", strings.Join(names, ","), "member", member)
			if env.group != nil {
				env.group.ObserveAssigned(len(names))
			}
			for _, n := range names {
				t, _ := a.cfg.task(n)
				s.start(t)
			}
		}),
		kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			names := s.names(m)
			if len(names) == 0 {
				return
			}
			a.log.Info("group: revoked tasks; stopping them before the rebalance goes on", "tasks", strings.Join(names, ","))
			s.stop(names)
			if env.group != nil {
				env.group.ObserveRevoked(len(names))
			}
			a.log.Info("group: revoked tasks stopped", "tasks", strings.Join(names, ","))
		}),
		kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
			names := s.names(m)
			a.log.Warn("group: membership lost; stopping its tasks (another member may already run them: its producer fenced these)", "tasks", strings.Join(names, ","))
			s.stop(names)
			if env.group != nil {
				env.group.ObserveLost(len(names))
			}
		}),
	)...)
	if err != nil {
		return err
	}
	s.owns = func(ctx context.Context, t Task) bool { return a.assignedHere(ctx, cl, topic, t) }
	a.log.Info("starting", "connector", a.cfg.Name, "tasks", len(a.cfg.Tasks), "group", groupName(a.cfg.Name), "tasks_topic", topic, "member", member)
	// Polling keeps the client's fetch buffers drained; the tasks topic
	// holds no records, and the group is managed in the background. The
	// client reports a failed join or heartbeat through the poll: one
	// that waiting cannot fix (a missing group ACL) stops the member with
	// its exit code; others are logged and retried by the client.
	pctx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	polled := make(chan struct{})
	var fatal error
	go func() {
		defer close(polled)
		for pctx.Err() == nil {
			cl.PollFetches(pctx).EachError(func(_ string, _ int32, err error) {
				var gs *kgo.ErrGroupSession
				if !errors.As(err, &gs) || fatal != nil {
					return
				}
				if e := a.explainKafkaAccess(gs.Err); exitCode(e) == exitConfig {
					fatal = e
					stopPolling()
					return
				}
				a.log.Warn("group: the group session failed; the client retries", "err", gs.Err.Error())
			})
		}
	}()
	<-pctx.Done()
	<-polled
	// Stop the tasks first, so that the others' new owners start on
	// finished transactions, then leave the group at once (no session
	// timeout to wait out). Close calls the revoke callback for what is
	// left.
	s.mu.Lock()
	var names []string
	for n := range s.running {
		names = append(names, n)
	}
	s.mu.Unlock()
	a.log.Info("stopping: stopping the tasks and leaving the group", "tasks", strings.Join(names, ","))
	s.stop(names)
	cl.Close()
	if fatal != nil {
		return fatal
	}
	a.log.Info("stopped: left the group")
	return nil
}

func groupName(name string) string { return "tidemark-" + name }

// ensureTasksTopic creates the tasks topic with one partition per task, or
// adds partitions to it when tasks were added.
func (a *cli) ensureTasksTopic(ctx context.Context, opts []kgo.Opt, topic string) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	n := int32(len(a.cfg.Tasks))
	compact := "compact"
	resp, err := adm.CreateTopic(ctx, n, a.cfg.Kafka.ReplicationFactor, map[string]*string{"cleanup.policy": &compact}, topic)
	if err == nil {
		err = resp.Err
	}
	switch {
	case err == nil:
		a.log.Info("created the tasks topic", "topic", topic, "partitions", n)
		return nil
	case !errors.Is(err, kerr.TopicAlreadyExists):
		return fmt.Errorf("create the tasks topic %s: %w", topic, err)
	}
	td, err := adm.ListTopics(ctx, topic)
	if err != nil {
		return fmt.Errorf("describe the tasks topic %s: %w", topic, err)
	}
	have := int32(len(td[topic].Partitions))
	if have >= n {
		return nil
	}
	ur, err := adm.UpdatePartitions(ctx, int(n), topic)
	if err == nil {
		err = ur.Error()
	}
	if err != nil {
		return fmt.Errorf("grow the tasks topic %s from %d to %d partitions: %w", topic, have, n, err)
	}
	a.log.Info("grew the tasks topic for added tables", "topic", topic, "from", have, "to", n)
	return nil
}

// runTasksOnce is `tidemark run --once` in task mode: every task (or the
// one --task names) once, side by side, without the group; the error is the
// one with the highest exit code.
func (a *cli) runTasksOnce(ctx context.Context) error {
	tasks, env, err := a.tasksAndEnv()
	if err != nil {
		return err
	}
	s := &supervisor{a: a, env: env, ctx: ctx, mode: connector.Once, tasks: a.cfg.Tasks, running: map[string]*runningTask{}}
	errs := make([]error, len(tasks))
	var wg sync.WaitGroup
	for i, t := range tasks {
		wg.Go(func() { _, errs[i] = s.runOnce(ctx, t) })
	}
	wg.Wait()
	return worst(tasks, errs)
}

// worst is the task error with the highest exit code, naming its task.
func worst(tasks []Task, errs []error) error {
	var out error
	code := exitOK
	for i, err := range errs {
		if c := exitCode(err); c > code {
			code, out = c, fmt.Errorf("task %s: %w", tasks[i].Name, err)
		}
	}
	return out
}

// perTask runs a command that reads or checks one connector (status,
// check, ledger, verify, sweep) for every task of a configuration with
// tables, or the one --task names, each under a header line (with --json,
// each JSON line gains a "task" field); the error is the one with the
// highest exit code. Without tables it is the command itself.
func perTask(run func(context.Context, *cli) error) func(context.Context, *cli) error {
	return func(ctx context.Context, a *cli) error {
		if len(a.cfg.Tasks) == 0 {
			return withoutTasks(ctx, a, run)
		}
		defer a.closeAll()
		tasks, env, err := a.tasksAndEnv()
		if err != nil {
			return err
		}
		members := a.taskMembers(ctx, env.opts)
		errs := make([]error, len(tasks))
		for i, t := range tasks {
			c := a.forTask(t, env)
			var buf strings.Builder
			c.stdout = &buf
			errs[i] = run(ctx, c)
			c.closeAll()
			if errs[i] != nil {
				code := exitCode(c.explainKafkaAccess(errs[i]))
				c.log.Error("task: "+errs[i].Error(), "exit_code", code)
			}
			member := members[t.Name]
			if a.jsonOut {
				for line := range strings.Lines(buf.String()) {
					if strings.HasPrefix(line, "{") {
						line = fmt.Sprintf("{\"task\":%q,\"member\":%q,%s", t.Name, member, line[1:])
					}
					fmt.Fprint(a.stdout, line)
				}
				continue
			}
			fmt.Fprintf(a.stdout, "== task %s == (runs on: %s)\n%s", t.Name, orDash(member, "no member"), buf.String())
		}
		return worst(tasks, errs)
	}
}

// withoutTasks runs a command of a configuration without tables, where
// --task names nothing.
func withoutTasks(ctx context.Context, a *cli, run func(context.Context, *cli) error) error {
	if a.taskFlag != "" {
		_, err := a.selectedTasks()
		return err
	}
	return run(ctx, a)
}

// tasksAndEnv is the tasks a command acts on (every task, or --task) and
// what they share.
func (a *cli) tasksAndEnv() ([]Task, *taskEnv, error) {
	tasks, err := a.selectedTasks()
	if err != nil {
		return nil, nil, err
	}
	env, err := a.newTaskEnv()
	if err != nil {
		return nil, nil, err
	}
	return tasks, env, nil
}

// oneTask runs a command that acts on one connector (reset, replica): with
// tables, --task must name the task.
func oneTask(run func(context.Context, *cli) error) func(context.Context, *cli) error {
	return func(ctx context.Context, a *cli) error {
		if len(a.cfg.Tasks) == 0 {
			return withoutTasks(ctx, a, run)
		}
		if a.taskFlag == "" {
			return usageErrorf("this configuration has tables:, so name the task this acts on with --task (one of %s)", a.cfg.taskNames())
		}
		defer a.closeAll()
		tasks, env, err := a.tasksAndEnv()
		if err != nil {
			return err
		}
		c := a.forTask(tasks[0], env)
		defer c.closeAll()
		return run(ctx, c)
	}
}

// taskMembers maps each task to the member of the group running it (its
// client id: tidemark-<name>@<host>/<pid>/<random>), as the group coordinator
// describes the group; empty when the group has no members or cannot be
// described.
func (a *cli) taskMembers(ctx context.Context, opts []kgo.Opt) map[string]string {
	out := map[string]string{}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return out
	}
	defer cl.Close()
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	groups, err := kadm.NewClient(cl).DescribeGroups(dctx, groupName(a.cfg.Name))
	if err != nil {
		a.log.Warn("cannot describe the group to show which member runs which task", "group", groupName(a.cfg.Name), "err", err.Error())
		return out
	}
	topic := a.cfg.tasksTopic()
	for _, g := range groups {
		for _, m := range g.Members {
			c, ok := m.Assigned.AsConsumer()
			if !ok {
				continue
			}
			for _, t := range c.Topics {
				if t.Topic != topic {
					continue
				}
				for _, p := range t.Partitions {
					if int(p) < len(a.cfg.Tasks) {
						out[a.cfg.Tasks[p].Name] = m.ClientID
					}
				}
			}
		}
	}
	return out
}

// assignedHere reports whether the group coordinator, once the group is
// stable, assigns task t to this member (cl's member id). While the group
// rebalances or cannot be described (its coordinator loading or moving) it
// waits, and says no if ctx ends first; when it may not describe the group
// (no DESCRIBE ACL) it says yes, and fencing keeps a wrong guess safe.
func (a *cli) assignedHere(ctx context.Context, cl *kgo.Client, topic string, t Task) bool {
	idx := slices.IndexFunc(a.cfg.Tasks, func(x Task) bool { return x.Name == t.Name })
	adm := kadm.NewClient(cl)
	warned := false
	for ctx.Err() == nil {
		me, _ := cl.GroupMetadata()
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		groups, err := adm.DescribeGroups(dctx, groupName(a.cfg.Name))
		cancel()
		if err == nil {
			if g, ok := groups[groupName(a.cfg.Name)]; !ok {
				err = errors.New("the group is missing from the answer")
			} else {
				err = g.Err
			}
		}
		switch {
		case errors.Is(err, kerr.GroupAuthorizationFailed):
			// It will not pass (no DESCRIBE on the group): fencing keeps a
			// wrong guess safe.
			return true
		case err != nil:
			// A coordinator loading or moving: not knowing is not a yes,
			// or a removed member would fence the rightful owner. Its
			// heartbeats fail too, and the group's callbacks end ctx.
			if !warned {
				warned = true
				a.log.Warn("task was fenced, and the group cannot say yet whether it still assigns the task here; waiting for it", "task", t.Name, "err", err.Error())
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		g := groups[groupName(a.cfg.Name)]
		if g.State != "Stable" {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		for _, m := range g.Members {
			if m.MemberID != me {
				continue
			}
			c, ok := m.Assigned.AsConsumer()
			if !ok {
				return true
			}
			for _, at := range c.Topics {
				if at.Topic == topic && slices.Contains(at.Partitions, int32(idx)) {
					return true
				}
			}
			return false
		}
		return false // not a member: removed from the group
	}
	return false
}
