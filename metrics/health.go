package metrics

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"time"
)

// AddCheck registers a readiness check, run by /readyz at most once per
// Config.CheckInterval with Config.CheckTimeout. name should be a fixed
// word ("source", "kafka"): it is a label value of tidemark_check_up. Add
// checks before serving.
func (m *Metrics) AddCheck(name string, fn func(context.Context) error) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	m.checks = append(m.checks, check{name, fn})
}

// runChecks runs the registered checks unless their results are fresh.
func (m *Metrics) runChecks(ctx context.Context) {
	m.checkMu.Lock()
	defer m.checkMu.Unlock()
	if len(m.checks) == 0 || !m.checkedAt.IsZero() && m.cfg.Now().Sub(m.checkedAt) < m.cfg.CheckInterval {
		return
	}
	results := make(map[string]error, len(m.checks))
	for _, c := range m.checks {
		cctx, cancel := context.WithTimeout(ctx, m.cfg.CheckTimeout)
		err := c.fn(cctx)
		cancel()
		results[c.name] = err
	}
	m.checkedAt = m.cfg.Now()
	m.mu.Lock()
	m.results = results
	m.mu.Unlock()
}

func (m *Metrics) lastResults() map[string]error {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.results)
}

// Ready runs the checks (unless their results are fresh) and reports
// whether the connector is ready, and if not, why: it is not ready before
// it fetched a page or loaded a checkpoint, after any stop (safety stop,
// fenced, fatal), while a check fails or the last source, Kafka or
// checkpoint operation failed, and, with Config.MaxLag, while its lag
// exceeds MaxLag or no watermark is known yet.
func (m *Metrics) Ready(ctx context.Context) (ready bool, reasons []string) {
	m.runChecks(ctx)
	results := m.lastResults()
	m.mu.Lock()
	defer m.mu.Unlock()
	reasons = m.notReadyLocked(results)
	return len(reasons) == 0, reasons
}

func (m *Metrics) notReadyLocked(results map[string]error) []string {
	var reasons []string
	switch m.stopped {
	case "":
	case "safety_stop":
		reasons = append(reasons, "safety stop: the connector needs an operator decision (see its log)")
	case "fenced":
		reasons = append(reasons, "fenced: another instance with the same connector name took over")
	default:
		reasons = append(reasons, "stopped on a fatal error (see its log)")
	}
	if !m.started && m.stopped == "" {
		reasons = append(reasons, "starting: no checkpoint loaded and no page fetched yet")
	}
	for _, name := range slices.Sorted(maps.Keys(results)) {
		if err := results[name]; err != nil {
			reasons = append(reasons, fmt.Sprintf("%s check failed: %v", name, err))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(m.failing)) {
		reasons = append(reasons, name+": "+m.failing[name])
	}
	if m.cfg.MaxLag > 0 {
		lag, ok := m.lagLocked()
		switch {
		case !ok:
			reasons = append(reasons, "initial load in progress: no watermark committed yet")
		case lag > m.cfg.MaxLag:
			reasons = append(reasons, fmt.Sprintf("lag %s exceeds %s", lag.Round(time.Second), m.cfg.MaxLag))
		}
	}
	return reasons
}

func unix(t time.Time) float64 { return float64(t.UnixMicro()) / 1e6 }
