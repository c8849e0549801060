package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// stateCollector computes the time-relative gauges at scrape time. A gauge
// whose reference time is unknown (no watermark yet, no commit yet) is not
// exported, so that alerts on it do not fire on a fresh connector; use
// absent() to alert on its absence.
type stateCollector Metrics

var (
	descWatermarkLag = prometheus.NewDesc(Namespace+"_watermark_lag_seconds",
		"Now minus the committed watermark W. Grows on a quiet table; see caught_up_age_seconds.", nil, nil)
	descWatermark = prometheus.NewDesc(Namespace+"_watermark_timestamp_seconds",
		"The committed watermark W as a Unix time.", nil, nil)
	descCheckpointAge = prometheus.NewDesc(Namespace+"_checkpoint_age_seconds",
		"Now minus the commit time of the last committed checkpoint.", nil, nil)
	descLastCommit = prometheus.NewDesc(Namespace+"_last_commit_timestamp_seconds",
		"Commit time of the last committed checkpoint as a Unix time.", nil, nil)
	descCaughtUpAge = prometheus.NewDesc(Namespace+"_caught_up_age_seconds",
		"Now minus the last time a pass reached the end of the source.", nil, nil)
	descReady = prometheus.NewDesc(Namespace+"_ready",
		"1 when /readyz would answer 200 (using the last check results), else 0.", nil, nil)
	descCheckUp = prometheus.NewDesc(Namespace+"_check_up",
		"Result of the last readiness check run by name (source, kafka): 1 ok, 0 failed.", []string{"check"}, nil)
	descLastSweep = prometheus.NewDesc(Namespace+"_last_sweep_timestamp_seconds",
		"Completion time of the last sweep as a Unix time.", nil, nil)
	descLastVerify = prometheus.NewDesc(Namespace+"_last_verify_timestamp_seconds",
		"Completion time of the last verify run as a Unix time.", nil, nil)
	descVerifyOK = prometheus.NewDesc(Namespace+"_verify_last_ok",
		"1 when the last verify run passed, 0 when it failed.", nil, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descWatermarkLag, descWatermark, descCheckpointAge, descLastCommit,
		descCaughtUpAge, descReady, descCheckUp, descLastSweep, descLastVerify, descVerifyOK} {
		ch <- d
	}
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	m := (*Metrics)(c)
	results := m.lastResults()
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.cfg.Now()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if !m.watermark.IsZero() {
		gauge(descWatermarkLag, max(0, now.Sub(m.watermark).Seconds()))
		gauge(descWatermark, unix(m.watermark))
	}
	if !m.lastCommit.IsZero() {
		gauge(descCheckpointAge, max(0, now.Sub(m.lastCommit).Seconds()))
		gauge(descLastCommit, unix(m.lastCommit))
	}
	if !m.caughtUp.IsZero() {
		gauge(descCaughtUpAge, max(0, now.Sub(m.caughtUp).Seconds()))
	}
	ready := 0.0
	if len(m.notReadyLocked(results)) == 0 {
		ready = 1
	}
	gauge(descReady, ready)
	for name, err := range results {
		up := 1.0
		if err != nil {
			up = 0
		}
		gauge(descCheckUp, up, name)
	}
	if !m.lastSweep.IsZero() {
		gauge(descLastSweep, unix(m.lastSweep))
	}
	if !m.lastVerify.IsZero() {
		gauge(descLastVerify, unix(m.lastVerify))
		ok := 0.0
		if m.verifyOK {
			ok = 1
		}
		gauge(descVerifyOK, ok)
	}
}
