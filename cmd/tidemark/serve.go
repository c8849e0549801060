package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/metrics"
	"github.com/tidemark/tidemark/schemas"
)

// MetricsConfig configures the HTTP server for /metrics, /healthz and
// /readyz (metrics.*).
type MetricsConfig struct {
	// Listen is the host:port of the HTTP server; "" (default) turns it off.
	// Use 127.0.0.1:9464 on a workstation and 0.0.0.0:9464 in a container.
	Listen string `yaml:"listen"`
	// ReadyMaxLag, when positive, makes /readyz answer 503 while the lag
	// (now minus the later of the watermark and the last time a pass
	// reached the end of the source) exceeds it, and during an initial load.
	// Default 0: no lag bound.
	ReadyMaxLag Duration `yaml:"ready_max_lag"`
	// HoldOnStop keeps the server up (with /readyz answering 503) for this
	// long after run stops on an error, so that the final state can be
	// scraped and probes see it, before the process exits. Default 0.
	HoldOnStop Duration `yaml:"hold_on_stop"`
}

func (c *Config) validateMetrics(p *problems) {
	m := c.Metrics
	if m.Listen != "" {
		_, port, err := net.SplitHostPort(m.Listen)
		n, perr := strconv.Atoi(port)
		if err != nil || perr != nil || n < 0 || n > 65535 {
			p.add("metrics.listen", "%q is not host:port; write e.g. 127.0.0.1:9464, or 0.0.0.0:9464 to serve on every interface", m.Listen)
		}
	}
	if m.ReadyMaxLag.Duration < 0 {
		p.add("metrics.ready_max_lag", "%s is negative; use 0s (no bound) or a positive duration such as 5m", m.ReadyMaxLag)
	}
	if m.HoldOnStop.Duration < 0 {
		p.add("metrics.hold_on_stop", "%s is negative; use 0s or a positive duration such as 30s", m.HoldOnStop)
	}
}

// observability is what run starts around the engine: the metrics server
// and the progress reporter, both fed by the engine's Observer.
type observability struct {
	a        *cli
	metrics  *metrics.Metrics // nil when metrics.listen is ""
	server   *metrics.Server
	progress *progress // nil when off
	kafka    *kgo.Client

	poolMu sync.Mutex
	pool   *pgxpool.Pool

	stopOnce sync.Once
}

// observe starts the metrics server (when configured, for run only: a
// verify next to a running connector must not contend for its port) and
// the progress reporter (on a terminal, or with --progress). Call before the engine
// starts; it registers its shutdown with closeAll, after the engine's
// resources.
func (a *cli) observe(ctx context.Context, opts []kgo.Opt) (*observability, error) {
	o := &observability{a: a}
	if a.tasks != nil {
		// A task of a configuration with tables: its series are served by
		// the member's server (group.go), labelled with the task.
		if a.tasks.group != nil {
			o.metrics = a.tasks.group.Task(a.taskName, a.cfg.Metrics.ReadyMaxLag.Duration)
		}
		a.closers = append(a.closers, o.stop)
		return o, nil
	}
	if a.serve && a.cfg.Metrics.Listen != "" {
		o.metrics = metrics.New(metrics.Config{Connector: a.cfg.Name, Version: version, MaxLag: a.cfg.Metrics.ReadyMaxLag.Duration})
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, err
		}
		o.kafka = cl
		o.metrics.AddCheck("kafka", func(ctx context.Context) error { return cl.Ping(ctx) })
		if a.isPostgres() {
			o.metrics.AddCheck("source", func(ctx context.Context) error {
				pool, err := o.pgPool(ctx)
				if err != nil {
					return err
				}
				return pool.Ping(ctx)
			})
		}
		srv, err := o.metrics.Listen(a.cfg.Metrics.Listen)
		if err != nil {
			cl.Close()
			return nil, &ConfigError{Key: "metrics.listen", Origin: a.cfg.origin["metrics.listen"], Err: err,
				Msg: "cannot serve metrics; choose a free address or set metrics.listen to \"\" to turn the server off"}
		}
		o.server = srv
		a.log.Info("serving /metrics, /healthz and /readyz", "addr", "http://"+srv.Addr())
	}
	if a.progress || isTerminal(a.stderr) {
		o.progress = newProgress(a.stderr, 5*time.Second)
		if a.isPostgres() {
			o.progress.estimate = func(ctx context.Context) (int64, error) { return o.estimateRows(ctx) }
		}
		o.progress.start(ctx)
	}
	a.closers = append(a.closers, o.stop)
	return o, nil
}

func (a *cli) isPostgres() bool { return a.cfg.Source.Kind == "postgres" || a.cfg.Source.Kind == "" }

// Addr is the metrics server's address, or "".
func (o *observability) Addr() string {
	if o.server == nil {
		return ""
	}
	return o.server.Addr()
}

// observer returns the Observer to give the engine.
func (o *observability) observer() connector.Observer {
	var obs multiObserver
	if o.metrics != nil {
		obs = append(obs, o.metrics)
	}
	if o.progress != nil {
		obs = append(obs, o.progress)
	}
	if len(obs) == 0 {
		return nil
	}
	return obs
}

// store wraps the checkpoint store so that the checkpoint the engine loads
// seeds the watermark and checkpoint-age gauges and the progress estimate.
func (o *observability) store(s connector.CheckpointStore) connector.CheckpointStore {
	return observedStore{CheckpointStore: s, o: o}
}

// held keeps serving after a failed run, for metrics.hold_on_stop, unless
// ctx ends first.
func (o *observability) held(ctx context.Context, err error) {
	d := o.a.cfg.Metrics.HoldOnStop.Duration
	if err == nil || o.server == nil || d <= 0 {
		return
	}
	o.a.log.Info("metrics.hold_on_stop: serving /readyz (503) before exiting", "for", d)
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

func (o *observability) stop() {
	o.stopOnce.Do(func() {
		if o.progress != nil {
			o.progress.stop()
		}
		if o.server != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_ = o.server.Shutdown(ctx)
			cancel()
		}
		if o.kafka != nil {
			o.kafka.Close()
		}
		o.poolMu.Lock()
		if o.pool != nil {
			o.pool.Close()
		}
		o.poolMu.Unlock()
	})
}

// pgPool is a one-connection pool of its own for the readiness check and
// the row estimate, so that they never share the engine's connections.
func (o *observability) pgPool(ctx context.Context) (*pgxpool.Pool, error) {
	o.poolMu.Lock()
	defer o.poolMu.Unlock()
	if o.pool != nil {
		return o.pool, nil
	}
	pc, err := o.a.pgConfig()
	if err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(pc.DSN)
	if err != nil {
		return nil, errors.New("parse source.dsn (see the configuration check)")
	}
	postgres.SetCredentials(cfg, pc)
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["application_name"] = "tidemark-" + o.a.cfg.Name + "-probe"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	o.pool = pool
	return pool, nil
}

// estimateRows is PostgreSQL's cheap row estimate of the source table
// (pg_class.reltuples, kept by ANALYZE and autovacuum); -1 when unknown.
func (o *observability) estimateRows(ctx context.Context) (int64, error) {
	pool, err := o.pgPool(ctx)
	if err != nil {
		return -1, err
	}
	s := o.a.cfg.Source
	var n float64
	err = pool.QueryRow(ctx, `SELECT c.reltuples::float8 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = $2`,
		s.Schema, s.Table).Scan(&n)
	if err != nil {
		return -1, fmt.Errorf("estimate rows: %w", err)
	}
	if n < 0 {
		return -1, nil // never analyzed
	}
	return int64(n), nil
}

// observedStore reports each checkpoint the engine loads.
type observedStore struct {
	connector.CheckpointStore
	o *observability
}

func (s observedStore) Load(ctx context.Context) (*schemas.Checkpoint, error) {
	cp, err := s.CheckpointStore.Load(ctx)
	if err != nil {
		return cp, err
	}
	var w, at time.Time
	if cp != nil {
		w, _ = schemas.ParseTime(cp.Watermark)
		at, _ = schemas.ParseTime(cp.CommittedAt)
	}
	if s.o.metrics != nil {
		s.o.metrics.ObserveCheckpoint(w, at)
	}
	if s.o.progress != nil {
		s.o.progress.checkpoint(cp)
	}
	return cp, nil
}

// multiObserver fans the engine's events out.
type multiObserver []connector.Observer

func (m multiObserver) ObservePage(d time.Duration, rows int) {
	for _, o := range m {
		o.ObservePage(d, rows)
	}
}

func (m multiObserver) ObserveSchemaChange() {
	for _, o := range m {
		if s, ok := o.(connector.SchemaObserver); ok {
			s.ObserveSchemaChange()
		}
	}
}

func (m multiObserver) ObserveFutureDated(rows int) {
	for _, o := range m {
		if f, ok := o.(connector.FutureObserver); ok {
			f.ObserveFutureDated(rows)
		}
	}
}

func (m multiObserver) ObserveReread(reread, deduped int) {
	for _, o := range m {
		if r, ok := o.(connector.RereadObserver); ok {
			r.ObserveReread(reread, deduped)
		}
	}
}

func (m multiObserver) ObserveCommit(c connector.CommitInfo) {
	for _, o := range m {
		o.ObserveCommit(c)
	}
}

func (m multiObserver) ObserveAbort() {
	for _, o := range m {
		o.ObserveAbort()
	}
}

func (m multiObserver) ObserveRetry(reason string) {
	for _, o := range m {
		o.ObserveRetry(reason)
	}
}

func (m multiObserver) ObserveStop(kind string) {
	for _, o := range m {
		o.ObserveStop(kind)
	}
}

func (m multiObserver) ObserveSweep(r connector.SweepResult) {
	for _, o := range m {
		o.ObserveSweep(r)
	}
}
