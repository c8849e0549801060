package main

// source.notify: change notifications wake `tidemark run` (docs/operating.md,
// "Change notifications"). The operator installs the trigger printed by
// `tidemark check --print-notify-sql`; tidemark never creates it, and only
// LISTENs.

import (
	"context"
	"fmt"
	"time"

	"github.com/tidemark/tidemark/connector/postgres"
)

// validateNotify checks source.notify, source.notify_min_gap and
// source.notify_lookback. With source.kind http all are refused through
// postgresOnly.
func (c *Config) validateNotify(p *problems) {
	s := &c.Source
	if s.Kind != "postgres" {
		return
	}
	if s.Notify != "" {
		if err := postgres.CheckChannel(s.Notify); err != nil {
			p.add("source.notify", "%q %v", s.Notify, err)
		}
	}
	if s.NotifyMinGap.Duration < 0 {
		p.add("source.notify_min_gap", "%s is negative; use 0s or more (default %s)", s.NotifyMinGap, defaults["source.notify_min_gap"])
	}
	if s.NotifyLookback.Duration < 0 {
		p.add("source.notify_lookback", "%s is negative; use 0s (none) or more (default %s)", s.NotifyLookback, defaults["source.notify_lookback"])
	}
}

// notifyWarnings are the notify settings that are allowed but do nothing.
func (c *Config) notifyWarnings() []string {
	s := &c.Source
	var w []string
	// Set to its default (a copy of tidemark.example.yaml) it changes
	// nothing either way: no warning.
	def, _ := time.ParseDuration(defaults["source.notify_min_gap"])
	if _, set := c.origin["source.notify_min_gap"]; set && s.Notify == "" && s.Kind == "postgres" && s.NotifyMinGap.Duration != def {
		w = append(w, "source.notify_min_gap is set but source.notify is not: it has no effect without change notifications")
	}
	lookback, _ := time.ParseDuration(defaults["source.notify_lookback"])
	_, lookbackSet := c.origin["source.notify_lookback"]
	if lookbackSet && s.Notify == "" && s.Kind == "postgres" && s.NotifyLookback.Duration != lookback {
		w = append(w, "source.notify_lookback is set but source.notify is not: it has no effect without change notifications")
	}
	if lookbackSet && s.Notify != "" && s.NotifyLookback.Duration > c.Sync.Margin.Duration {
		w = append(w, fmt.Sprintf("source.notify_lookback %s is more than sync.margin %s: passes started by notifications read from at most sync.margin below the watermark", s.NotifyLookback, c.Sync.Margin))
	}
	if s.Notify != "" && s.NotifyMinGap.Duration >= c.Sync.PollInterval.Duration && c.Sync.PollInterval.Duration > 0 {
		w = append(w, fmt.Sprintf("source.notify_min_gap %s is not below sync.poll_interval %s: a notification never starts a pass sooner than the poll would", s.NotifyMinGap, c.Sync.PollInterval))
	}
	return w
}

// cmdNotifySQL is `tidemark check --print-notify-sql`: the trigger of the
// table, or with tables of every task (or the one --task names), each
// after a comment line naming it, so that the output stays one SQL script.
// It connects to nothing, so it does not go through perTask, which opens
// what the tasks share and asks the group who runs each.
func cmdNotifySQL(a *cli) error {
	if len(a.cfg.Tasks) == 0 {
		if a.taskFlag != "" {
			_, err := a.selectedTasks()
			return err
		}
		return a.printNotifySQL()
	}
	tasks, err := a.selectedTasks()
	if err != nil {
		return err
	}
	for _, t := range tasks {
		fmt.Fprintf(a.stdout, "-- task %s\n", t.Name)
		if err := a.forTask(t, nil).printNotifySQL(); err != nil {
			return fmt.Errorf("task %s: %w", t.Name, err)
		}
	}
	return nil
}

// printNotifySQL is `tidemark check --print-notify-sql`: the trigger and
// function that make the table notify source.notify, for the table's
// owner to run. It connects to nothing.
func (a *cli) printNotifySQL() error {
	if !a.isPostgres() {
		return &ConfigError{Key: "source.kind", Origin: a.cfg.origin["source.kind"],
			Msg: fmt.Sprintf("--print-notify-sql needs source.kind postgres (it is %s): change notifications come from a trigger on the table", a.cfg.Source.Kind)}
	}
	s := a.cfg.Source
	if s.Notify == "" {
		return &ConfigError{Key: "source.notify", Msg: "is not set: --print-notify-sql prints the trigger for that channel; " +
			"set it in the configuration (source.notify: orders_changes), the same one `tidemark run` reads"}
	}
	st, err := postgres.NotifySQL(s.Schema, s.Table, s.Notify, a.notifyTrig)
	if err != nil {
		return &ConfigError{Key: "source.notify", Origin: a.cfg.origin["source.notify"], Err: err}
	}
	fmt.Fprint(a.stdout, st.Install)
	return nil
}

// notifying reports whether this command listens for notifications: `run`
// continuously with source.notify set (run --once never waits for a poll).
func (a *cli) notifying() bool {
	return a.serve && !a.once && a.isPostgres() && a.cfg.Source.Notify != ""
}

// listen starts the listener whose wake-ups become the engine's
// connector.Config.Wake. It holds a connection of its own and is closed by
// closeAll, after the engine.
func (a *cli) listen(ctx context.Context) (*postgres.Listener, error) {
	pc, err := a.pgConfig()
	if err != nil {
		return nil, err
	}
	l, err := postgres.Listen(ctx, pc, postgres.ListenConfig{Channel: a.cfg.Source.Notify, Logger: a.log})
	if err != nil {
		return nil, openError("source.dsn", pc.DSN, "LISTEN for source.notify at", err)
	}
	a.closers = append(a.closers, l.Close)
	a.log.Info("listening for change notifications: each starts a pass at once, polling stays as the safety net",
		"channel", a.cfg.Source.Notify, "min_gap", a.cfg.Source.NotifyMinGap.Duration, "poll_interval", a.cfg.Sync.PollInterval.Duration)
	return l, nil
}
