package metrics

import (
	"context"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tidemark/tidemark/connector"
)

// Namespace prefixes every metric name.
const Namespace = "tidemark"

// Retry reasons (the bounded label set of tidemark_retries_total); any other
// reason the engine reports is counted as "other".
var RetryReasons = []string{"source", "kafka", "checkpoint", "other"}

// Stop kinds (the label set of tidemark_stops_total), as reported by
// connector.Observer.ObserveStop.
var StopKinds = []string{"safety_stop", "fenced", "fatal"}

// Config configures a Metrics.
type Config struct {
	// Connector is the connector name, the constant label connector on
	// every series. Required.
	Connector string
	// Task, when set, is the constant label task on every series: the
	// Metrics of one task of a configuration with tables, served by a
	// Group, which holds the runtime and build series.
	Task string
	// Version is reported by tidemark_build_info; default "dev".
	Version string
	// MaxLag, when positive, makes the connector unready while its lag
	// (see Metrics.Lag) exceeds it, and while the initial load has not yet
	// committed a watermark. Zero (default) means no lag bound.
	MaxLag time.Duration
	// CheckInterval is how long the result of the registered checks is
	// reused before /readyz runs them again; default 5s.
	CheckInterval time.Duration
	// CheckTimeout bounds one run of one check; default 3s.
	CheckTimeout time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Metrics records the engine's events as Prometheus metrics and decides
// readiness. It implements connector.Observer; all methods are safe for
// concurrent use.
type Metrics struct {
	cfg Config
	reg *prometheus.Registry

	rowsRead, rowsPublished, rowsDeduped, rowsTombstoned prometheus.Counter
	rowsReread, rowsFuture, schemaChanges                prometheus.Counter
	txCommitted, txAborted, passes, headPasses           prometheus.Counter
	txDuration, commitDuration, pageFetch, sourceToTopic prometheus.Histogram
	retries, stops                                       *prometheus.CounterVec
	sweeps, sweepTombstoned, sweepRepaired               prometheus.Counter
	verifyRuns                                           *prometheus.CounterVec
	verifyDiscrepancies                                  *prometheus.GaugeVec

	mu           sync.Mutex
	started      bool      // a page was fetched or a checkpoint loaded
	watermark    time.Time // zero: unknown or minus infinity
	lastCommit   time.Time // zero: no commit known
	caughtUp     time.Time // last time the end of the source was reached
	prevCaughtUp time.Time
	pendingEnd   bool   // caughtUp was set by an empty page not yet committed
	stopped      string // stop kind; "" while running
	failing      map[string]string
	lastSweep    time.Time
	lastVerify   time.Time
	verifyOK     bool

	checkMu   sync.Mutex // serialises check runs
	checks    []check
	checkedAt time.Time
	results   map[string]error
}

type check struct {
	name string
	fn   func(context.Context) error
}

var _ connector.Observer = (*Metrics)(nil)

// New returns a Metrics with every series registered (counters at zero, so
// that rate() and absent() work from the first scrape).
func New(cfg Config) *Metrics {
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.CheckInterval <= 0 {
		cfg.CheckInterval = 5 * time.Second
	}
	if cfg.CheckTimeout <= 0 {
		cfg.CheckTimeout = 3 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	m := &Metrics{cfg: cfg, reg: prometheus.NewRegistry(), failing: map[string]string{}, results: map[string]error{}}
	if cfg.Task == "" {
		m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	r := prometheus.WrapRegistererWith(m.labels(), m.reg)

	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Namespace: Namespace, Name: name, Help: help})
		r.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: Namespace, Name: name, Help: help, Buckets: buckets})
		r.MustRegister(h)
		return h
	}
	m.rowsRead = counter("rows_read_total", "Rows read from the source, re-reads included.")
	m.rowsPublished = counter("rows_published_total", "Rows published to the data topic in committed transactions (upserts and tombstones).")
	m.rowsDeduped = counter("rows_deduped_total", "Re-read rows skipped because the dedupe set showed them unchanged, counted as they are read.")
	m.schemaChanges = counter("schema_changes_total", "Changes of the source table's columns seen at the start of a pass (docs/schema-changes.md).")
	m.rowsFuture = counter("rows_future_dated_total", "Rows read with an updated_at after the source's clock at the start of their pass: published, but the watermark stops at the clock (a writer's clock or time zone is probably wrong).")
	m.rowsReread = counter("rows_reread_total", "Rows a pass read again from the window below the watermark it started from: the cost of the safety margin, counted as they are read.")
	m.rowsTombstoned = counter("rows_tombstoned_total", "Tombstones (deletes) published in committed transactions; a subset of rows_published_total.")
	m.txCommitted = counter("transactions_committed_total", "Kafka transactions committed (data and checkpoint together).")
	m.txAborted = counter("transactions_aborted_total", "Kafka transactions aborted or failed; the engine resumes from the last committed checkpoint.")
	m.passes = counter("passes_completed_total", "Passes that reached the end of the source and were committed.")
	m.headPasses = counter("head_passes_total", "Completed passes that a change notification started (or their follow-ups) and that read from the watermark less the lookback, not the margin below it (source.notify; docs/design.md, \"Head passes\"); included in passes_completed_total.")
	m.sweeps = counter("sweeps_total", "Hard-delete reconciliation sweeps completed.")
	m.sweepTombstoned = counter("sweep_tombstoned_total", "Tombstones published by sweeps for ids gone from the source.")
	m.sweepRepaired = counter("sweep_repaired_total", "Rows republished by sweeps because the topic lacked them.")

	m.pageFetch = histogram("page_fetch_duration_seconds", "Time to fetch one page from the source.",
		prometheus.ExponentialBuckets(0.001, 2.5, 12))
	m.txDuration = histogram("transaction_duration_seconds", "Time from a transaction's first page to its commit.",
		prometheus.ExponentialBuckets(0.005, 2.5, 11))
	m.commitDuration = histogram("commit_duration_seconds", "Time of the commit call: flush plus EndTransaction.",
		prometheus.ExponentialBuckets(0.001, 2.5, 12))
	m.sourceToTopic = histogram("source_to_topic_latency_seconds",
		"Per committed transaction: commit time minus the newest updated_at it published. Large during an initial load.",
		[]float64{0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 21600, 86400})

	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "retries_total",
		Help: "Transient failures retried from the last committed checkpoint, by reason (source, kafka, checkpoint, other)."}, []string{"reason"})
	m.stops = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "stops_total",
		Help: "Fatal stops by kind: safety_stop (needs an operator decision), fenced (another instance took over), fatal (permanent failure)."}, []string{"kind"})
	m.verifyRuns = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: Namespace, Name: "verify_runs_total",
		Help: "Verify runs by result (ok, failed)."}, []string{"result"})
	m.verifyDiscrepancies = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: Namespace, Name: "verify_discrepancies",
		Help: "Discrepancies found by the last verify run, by kind (missing, extra, mismatched)."}, []string{"kind"})
	r.MustRegister(m.retries, m.stops, m.verifyRuns, m.verifyDiscrepancies)
	for _, v := range RetryReasons {
		m.retries.WithLabelValues(v)
	}
	for _, v := range StopKinds {
		m.stops.WithLabelValues(v)
	}
	for _, v := range []string{"ok", "failed"} {
		m.verifyRuns.WithLabelValues(v)
	}

	r.MustRegister((*stateCollector)(m))
	if cfg.Task == "" {
		r.MustRegister(buildInfo(cfg.Version))
	}
	return m
}

func buildInfo(version string) prometheus.Gauge {
	info := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: Namespace, Name: "build_info",
		Help: "Always 1; labels give the version.", ConstLabels: prometheus.Labels{"version": version, "goversion": runtime.Version()}})
	info.Set(1)
	return info
}

// labels are the constant labels of every series: connector, and task for
// a task's Metrics.
func (m *Metrics) labels() prometheus.Labels {
	if m.cfg.Task != "" {
		return prometheus.Labels{"connector": m.cfg.Connector, "task": m.cfg.Task}
	}
	return prometheus.Labels{"connector": m.cfg.Connector}
}

// Registry returns the registry holding every tidemark series plus the Go
// runtime and process collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveNotify exports the counters of the change-notification listener
// (source.notify): notifications received and connections re-established.
// Call it at most once.
func (m *Metrics) ObserveNotify(notifications, reconnects func() int64) {
	r := prometheus.WrapRegistererWith(m.labels(), m.reg)
	r.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "notify_notifications_total",
			Help: "Change notifications received on source.notify's channel (each wakes the engine; wake-ups coalesce)."},
			func() float64 { return float64(notifications()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: Namespace, Name: "notify_reconnects_total",
			Help: "Times the LISTEN connection was lost and re-established (each followed by a pass)."},
			func() float64 { return float64(reconnects()) }),
	)
}

// ObserveSchemaChange implements connector.SchemaObserver.
func (m *Metrics) ObserveSchemaChange() { m.schemaChanges.Inc() }

// ObserveFutureDated implements connector.FutureObserver.
func (m *Metrics) ObserveFutureDated(rows int) { m.rowsFuture.Add(float64(rows)) }

// ObserveReread implements connector.RereadObserver.
func (m *Metrics) ObserveReread(reread, deduped int) {
	m.rowsReread.Add(float64(reread))
	m.rowsDeduped.Add(float64(deduped))
}

// ObservePage implements connector.Observer. A page with no rows is the end
// of the source (docs/design.md, "The walk" and "Watermark"): the connector is caught up.
func (m *Metrics) ObservePage(fetch time.Duration, rows int) {
	m.pageFetch.Observe(fetch.Seconds())
	m.rowsRead.Add(float64(rows))
	m.mu.Lock()
	defer m.mu.Unlock()
	m.started = true
	delete(m.failing, "source")
	if rows == 0 {
		if !m.pendingEnd {
			m.prevCaughtUp = m.caughtUp
		}
		m.caughtUp = m.cfg.Now()
		m.pendingEnd = true
	} else {
		m.pendingEnd = false
	}
}

// ObserveCommit implements connector.Observer.
func (m *Metrics) ObserveCommit(c connector.CommitInfo) {
	m.txCommitted.Inc()
	m.rowsPublished.Add(float64(c.Published))
	m.rowsTombstoned.Add(float64(c.Tombstones))
	m.commitDuration.Observe(c.Took.Seconds())
	if c.Span > 0 {
		m.txDuration.Observe(c.Span.Seconds())
	}
	if c.PassEnded {
		m.passes.Inc()
		if c.HeadPass {
			m.headPasses.Inc()
		}
	}
	at := c.CommittedAt
	if at.IsZero() {
		at = m.cfg.Now()
	}
	if !c.NewestUpdatedAt.IsZero() {
		m.sourceToTopic.Observe(max(0, at.Sub(c.NewestUpdatedAt).Seconds()))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.started = true
	m.lastCommit = at
	if !c.Watermark.IsZero() {
		m.watermark = c.Watermark
	}
	m.pendingEnd = false
	delete(m.failing, "kafka")
	delete(m.failing, "checkpoint")
}

// ObserveAbort implements connector.Observer. An end of source seen in the
// aborted transaction does not count as caught up.
func (m *Metrics) ObserveAbort() {
	m.txAborted.Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.undoPendingEnd()
}

func (m *Metrics) undoPendingEnd() {
	if m.pendingEnd {
		m.caughtUp, m.pendingEnd = m.prevCaughtUp, false
	}
}

// ObserveRetry implements connector.Observer. Until the next success of the
// same kind (a page for source, a commit for kafka and checkpoint) the
// connector is not ready.
func (m *Metrics) ObserveRetry(reason string) {
	switch reason {
	case "source", "kafka", "checkpoint":
	default:
		reason = "other"
	}
	m.retries.WithLabelValues(reason).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.undoPendingEnd()
	if reason != "other" {
		m.failing[reason] = "the last " + reason + " operation failed; retrying from the last committed checkpoint"
	}
}

// ObserveStop implements connector.Observer. After any stop the connector is
// never ready again in this process.
func (m *Metrics) ObserveStop(kind string) {
	switch kind {
	case "safety_stop", "fenced":
	default:
		kind = "fatal"
	}
	m.stops.WithLabelValues(kind).Inc()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.undoPendingEnd()
	m.stopped = kind
}

// ObserveCheckpoint reports the committed checkpoint the engine loaded (or
// any committed checkpoint read later): its watermark (zero = minus
// infinity) and commit time. It seeds the lag and age gauges on a resumed
// connector before its first commit.
func (m *Metrics) ObserveCheckpoint(watermark, committedAt time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.started = true
	delete(m.failing, "checkpoint")
	if !watermark.IsZero() && watermark.After(m.watermark) {
		m.watermark = watermark
	}
	if committedAt.After(m.lastCommit) {
		m.lastCommit = committedAt
	}
}

// ObserveSweep implements connector.Observer.
func (m *Metrics) ObserveSweep(r connector.SweepResult) {
	m.SweepResult(int(r.Tombstoned), int(r.Repaired))
}

// SweepResult records a completed hard-delete sweep: tombstoned ids gone
// from the source, repaired ids the topic lacked.
func (m *Metrics) SweepResult(tombstoned, repaired int) {
	m.sweeps.Inc()
	m.sweepTombstoned.Add(float64(max(0, tombstoned)))
	m.sweepRepaired.Add(float64(max(0, repaired)))
	m.mu.Lock()
	m.lastSweep = m.cfg.Now()
	m.mu.Unlock()
}

// VerifyResult records a verify run: whether it passed and what it found.
func (m *Metrics) VerifyResult(ok bool, missing, extra, mismatched int) {
	result := "failed"
	if ok {
		result = "ok"
	}
	m.verifyRuns.WithLabelValues(result).Inc()
	m.verifyDiscrepancies.WithLabelValues("missing").Set(float64(missing))
	m.verifyDiscrepancies.WithLabelValues("extra").Set(float64(extra))
	m.verifyDiscrepancies.WithLabelValues("mismatched").Set(float64(mismatched))
	m.mu.Lock()
	m.lastVerify, m.verifyOK = m.cfg.Now(), ok
	m.mu.Unlock()
}

// Lag is how far behind the source the topic may be: now minus the later of
// the watermark W and the last time a pass reached the end of the source.
// (On a quiet table W stands still while the connector stays caught up;
// now - W alone is exported as tidemark_watermark_lag_seconds.) ok is false
// when neither is known yet (an initial load in progress).
func (m *Metrics) Lag() (lag time.Duration, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lagLocked()
}

func (m *Metrics) lagLocked() (time.Duration, bool) {
	ref := m.watermark
	if m.caughtUp.After(ref) {
		ref = m.caughtUp
	}
	if ref.IsZero() {
		return 0, false
	}
	return max(0, m.cfg.Now().Sub(ref)), true
}
