package metrics

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"
)

// Group serves the metrics and readiness of a process that runs tasks of a
// configuration with tables (docs/scale-out.md): the runtime and build
// series, the group's own counters, and the series of every task it runs,
// each labelled task.
type Group struct {
	connector string
	version   string
	reg       *prometheus.Registry

	rebalances, assigned, revoked, lost prometheus.Counter
	taskStops                           prometheus.Counter

	mu     sync.Mutex
	joined bool
	tasks  map[string]*Metrics

	checks *Metrics // holds the process-wide checks (kafka) and their results
}

// NewGroup returns a Group with every series registered.
func NewGroup(connector, version string) *Group {
	if version == "" {
		version = "dev"
	}
	g := &Group{connector: connector, version: version, reg: prometheus.NewRegistry(), tasks: map[string]*Metrics{}}
	g.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r := prometheus.WrapRegistererWith(prometheus.Labels{"connector": connector}, g.reg)
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
		r.MustRegister(c)
		return c
	}
	g.rebalances = counter("group_rebalances_total", "Rebalances of the consumer group this member took part in (each assignment it received).")
	g.assigned = counter("group_tasks_assigned_total", "Tasks assigned to this member by the group.")
	g.revoked = counter("group_tasks_revoked_total", "Tasks this member gave up in a rebalance (stopped before the rebalance went on).")
	g.lost = counter("group_tasks_lost_total", "Tasks this member lost with its group membership (session expired, fenced from the group).")
	g.taskStops = counter("group_task_stops_total", "Tasks that stopped on their own (safety stop, fenced, fatal) while assigned; the others go on.")
	r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: Namespace, Name: "group_tasks_running",
		Help: "Tasks the group assigns to this member now, running or stopped on their own (see group_task_stops_total and /readyz)."}, func() float64 {
		g.mu.Lock()
		defer g.mu.Unlock()
		return float64(len(g.tasks))
	}))
	r.MustRegister(buildInfo(version))
	g.checks = &Metrics{cfg: Config{Connector: connector, CheckInterval: 5 * time.Second, CheckTimeout: 3 * time.Second, Now: time.Now}, started: true,
		failing: map[string]string{}, results: map[string]error{}}
	return g
}

// AddCheck registers a process-wide readiness check (see Metrics.AddCheck).
func (g *Group) AddCheck(name string, fn func(context.Context) error) { g.checks.AddCheck(name, fn) }

// Task returns the Metrics of a task that starts on this member; the Group
// serves them until RemoveTask.
func (g *Group) Task(name string, maxLag time.Duration) *Metrics {
	m := New(Config{Connector: g.connector, Task: name, Version: g.version, MaxLag: maxLag})
	g.mu.Lock()
	defer g.mu.Unlock()
	g.tasks[name] = m
	return m
}

// RemoveTask stops serving the series of a task this member gave up.
func (g *Group) RemoveTask(name string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.tasks, name)
}

// ObserveAssigned counts an assignment of n new tasks (a rebalance).
func (g *Group) ObserveAssigned(n int) {
	g.mu.Lock()
	g.joined = true
	g.mu.Unlock()
	g.rebalances.Inc()
	g.assigned.Add(float64(n))
}

// ObserveRevoked counts n tasks given up in a rebalance.
func (g *Group) ObserveRevoked(n int) { g.revoked.Add(float64(n)) }

// ObserveLost counts n tasks lost with the membership.
func (g *Group) ObserveLost(n int) {
	g.mu.Lock()
	g.joined = false
	g.mu.Unlock()
	g.lost.Add(float64(n))
}

// ObserveTaskStop counts a task that stopped on its own.
func (g *Group) ObserveTaskStop() { g.taskStops.Inc() }

// Ready reports whether the member is ready: it has joined the group, the
// process-wide checks pass, and every task it runs is ready; the reasons of
// a task are prefixed with its name.
func (g *Group) Ready(ctx context.Context) (bool, []string) {
	_, reasons := g.checks.Ready(ctx)
	g.mu.Lock()
	joined := g.joined
	tasks := maps.Clone(g.tasks)
	g.mu.Unlock()
	if !joined {
		reasons = append(reasons, "not a member of the group yet (joining, or the membership was lost)")
	}
	for _, name := range slices.Sorted(maps.Keys(tasks)) {
		_, rs := tasks[name].Ready(ctx)
		for _, r := range rs {
			reasons = append(reasons, fmt.Sprintf("task %s: %s", name, r))
		}
	}
	return len(reasons) == 0, reasons
}

// Gather implements prometheus.Gatherer: the group's series and those of
// every task it runs.
func (g *Group) Gather() ([]*dto.MetricFamily, error) {
	g.mu.Lock()
	gs := prometheus.Gatherers{g.reg}
	for _, name := range slices.Sorted(maps.Keys(g.tasks)) {
		gs = append(gs, g.tasks[name].reg)
	}
	g.mu.Unlock()
	return gs.Gather()
}

// Handler serves /metrics, /healthz and /readyz for the member.
func (g *Group) Handler() http.Handler { return handler(g, g.Ready) }

// Listen serves Handler on addr (see Metrics.Listen).
func (g *Group) Listen(addr string) (*Server, error) { return listen(addr, g.Handler()) }
