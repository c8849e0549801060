package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/httpsrc"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/producer"
	"github.com/tidemark/tidemark/schemas"
)

func cmdRun(ctx context.Context, a *cli) (err error) {
	defer a.closeAll()
	a.serve = true            // metrics.listen applies to run only
	if len(a.cfg.Tasks) > 0 { // a tables: list (group.go)
		if a.once {
			return a.runTasksOnce(ctx)
		}
		if a.taskFlag != "" {
			return usageErrorf("--task runs one task once, with --once; `tidemark run` runs the tasks the group assigns to it")
		}
		return a.runGroup(ctx)
	}
	if a.taskFlag != "" {
		_, err := a.selectedTasks()
		return err
	}
	e, _, err := a.engine(ctx)
	if err != nil {
		return err
	}
	mode := connector.Continuous
	if a.once {
		mode = connector.Once
	}
	a.log.Info("starting", "connector", a.cfg.Name, "run_id", e.RunID(), "topic", a.cfg.Kafka.Topic,
		"source", RedactDSN(a.cfg.Source.DSN), "table", a.cfg.Source.Schema+"."+a.cfg.Source.Table, "once", a.once)
	c, err := e.Run(ctx, mode)
	if c != nil && (a.once || err == nil) {
		a.printCompletion("", c)
	}
	if a.obs != nil {
		a.obs.held(ctx, err) // metrics.hold_on_stop (serve.go)
	}
	return err
}

// printCompletion prints a run's completion record; task names the task of
// a configuration with tables, "" otherwise.
func (a *cli) printCompletion(task string, c *connector.Completion) {
	// A link cursor carries the endpoint's query (an api_key?).
	c.View.EndCursor, c.Termination = httpsrc.RedactCursor(c.View.EndCursor), redactText(c.Termination)
	b, _ := json.Marshal(c) // one line, as the README says
	a.outMu.Lock()
	defer a.outMu.Unlock()
	switch {
	case a.jsonOut && task != "":
		fmt.Fprintf(a.stdout, "{\"task\":%q,%s\n", task, b[1:])
	case a.jsonOut:
		fmt.Fprintln(a.stdout, string(b))
	default:
		if task != "" {
			fmt.Fprintf(a.stdout, "== task %s ==\n", task)
		}
		fmt.Fprint(a.stdout, c.Text())
		if a.once {
			fmt.Fprintf(a.stdout, "completion record: %s\n", b)
		}
	}
}

// engine opens the source, preflights it, ensures the topics and returns an
// engine on a fresh producer session.
func (a *cli) engine(ctx context.Context) (*connector.Engine, []kgo.Opt, error) {
	opts, err := a.kafkaOpts()
	if err != nil {
		return nil, nil, err
	}
	// Metrics server and progress start before the engine and stop after
	// it, in closeAll (serve.go).
	if a.obs, err = a.observe(ctx, opts); err != nil {
		return nil, nil, err
	}
	var src connector.Source
	if err := a.startup(ctx, "the source", "source", func() (err error) {
		src, err = a.source(ctx)
		return err
	}); err != nil {
		return nil, nil, err
	}
	if err := a.startup(ctx, "the source's preflight", "source", func() error { return a.preflight(ctx, src, nil) }); err != nil {
		return nil, nil, err
	}
	var wake <-chan struct{}
	if a.notifying() { // source.notify (notify.go)
		if err := a.startup(ctx, "the change notifications (LISTEN for source.notify)", "source", func() error {
			l, err := a.listen(ctx)
			if err == nil {
				wake = l.Wake()
				if a.obs.metrics != nil {
					a.obs.metrics.ObserveNotify(l.Notifications, l.Reconnects)
				}
			}
			return err
		}); err != nil {
			return nil, nil, err
		}
	}
	if err := a.startup(ctx, "Kafka (topics)", "kafka", func() error { return a.ensureTopics(ctx, opts, nil) }); err != nil {
		return nil, nil, err
	}
	var w *producer.Writer
	if err := a.startup(ctx, "Kafka (producer session)", "kafka", func() (err error) {
		w, err = a.writer(ctx, opts)
		return err
	}); err != nil {
		return nil, nil, err
	}
	cfg := a.engineConfig()
	cfg.Wake, cfg.MinPassGap = wake, a.cfg.Source.NotifyMinGap.Duration
	cfg.Topic = fold.Topic{Opts: opts, Topic: a.cfg.Kafka.Topic}
	cfg.Observer = a.obs.observer()
	e, err := connector.New(cfg, src, w, a.obs.store(a.store(opts)))
	if err != nil {
		return nil, nil, err
	}
	return e, opts, nil
}

// preflight checks the table (docs/design.md, Source table requirements). Failures stop with exit 2;
// warnings are logged, or with rep (check) reported there.
func (a *cli) preflight(ctx context.Context, src connector.Source, rep *checkReport) error {
	ps, ok := src.(*postgres.Source)
	if !ok {
		if rep == nil {
			return nil
		}
		// A changes API has no catalog to inspect: `check` asks for the
		// first page of a pass (one item) and reports what came back.
		p, err := src.Page(ctx, connector.PageRequest{Limit: 1})
		if err != nil {
			rep.add(postgres.Fail, "source", fmt.Sprintf("the first page request failed: %v", err))
			return fmt.Errorf("preflight: %w", err)
		}
		rep.add(postgres.OK, "source", fmt.Sprintf("the first page answered with %d item(s), end of list: %v", len(p.Rows), p.End))
		return nil
	}
	pr, err := ps.Check(ctx)
	if err != nil {
		return fmt.Errorf("preflight: %w", err)
	}
	if a.cfg.Source.Horizon {
		fs, err := ps.CheckHorizon(ctx)
		if err != nil {
			return fmt.Errorf("preflight horizon: %w", err)
		}
		pr.Findings = append(pr.Findings, fs...)
	}
	if a.cfg.Source.Notify != "" {
		fs, err := ps.CheckNotify(ctx, a.cfg.Source.Notify) // a warning without the trigger
		if err != nil {
			return fmt.Errorf("preflight notify: %w", err)
		}
		pr.Findings = append(pr.Findings, fs...)
	}
	for _, f := range pr.Findings {
		switch {
		case rep != nil:
			rep.add(f.Severity, f.Check, f.Message)
		case f.Severity == postgres.Warn:
			a.log.Warn("preflight: "+f.Message, "check", f.Check)
		case f.Severity == postgres.OK:
			a.log.Debug("preflight: "+f.Message, "check", f.Check)
		}
	}
	return pr.Err()
}

// ensureTopics creates or checks the topics; what it did is logged, or
// with rep (check) reported there.
func (a *cli) ensureTopics(ctx context.Context, opts []kgo.Opt, rep *checkReport) error {
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	lines, err := producer.EnsureTopics(ctx, cl, a.topics())
	for _, l := range lines {
		if rep != nil {
			rep.add(postgres.OK, "topic", l)
		} else {
			a.log.Info(l)
		}
	}
	return err
}

// checkReport is what `tidemark check` found. The text form prints each
// finding as it is found; `check --json` prints the whole report as one
// line of JSON at the end (with tables, one per task: perTask adds "task"
// and "member").
type checkReport struct {
	Connector string `json:"connector"`
	// Source and Kafka are the text's "source:" and "kafka:" lines.
	Source   string         `json:"source"`
	Kafka    string         `json:"kafka"`
	Findings []checkFinding `json:"findings"`
	// OK is true when check exits 0 (the text's "preflight passed").
	OK bool `json:"ok"`
	// Error is why it did not, redacted as on stderr.
	Error string `json:"error,omitempty"`

	out io.Writer // the text form's; nil with --json
}

// checkFinding is one line of check's report: what was checked (table, id,
// updated_at, index, topic, checkpoint, ...), ok, warn or fail, and what
// was found.
type checkFinding struct {
	Check    string `json:"check"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

func (r *checkReport) add(sev postgres.Severity, check, msg string) {
	r.Findings = append(r.Findings, checkFinding{Check: check, Severity: sev.String(), Message: msg})
	if r.out != nil {
		fmt.Fprintf(r.out, "  %-5s %-10s %s\n", sev, check, msg)
	}
}

// notWaited marks a failure that `run` waits out at start-up (a server
// not answering) where check, a diagnostic, stopped at once: its exit hint
// says what could not be reached instead of "after retries" (hintFor).
type notWaited struct {
	what string
	err  error
}

func (e *notWaited) Error() string { return e.err.Error() }
func (e *notWaited) Unwrap() error { return e.err }

// notWaitedFor marks err unless waiting could not fix it (permanentStartup).
func (a *cli) notWaitedFor(what string, err error) error {
	if err == nil || permanentStartup(a.explainKafkaAccess(err)) {
		return err
	}
	return &notWaited{what: what, err: err}
}

// checkCommand is `tidemark check`: the preflight of the table or of each
// task, or with --print-notify-sql the trigger SQL, connecting to nothing.
func checkCommand(ctx context.Context, a *cli) error {
	if a.notifySQL {
		return cmdNotifySQL(a) // notify.go
	}
	return perTask(cmdCheck)(ctx, a)
}

// cmdCheck is the preflight of one connector: the source table, the
// topics and the checkpoint, printed as found (or with --json as one
// object). Unlike run, it does not wait for a server that does not answer.
func cmdCheck(ctx context.Context, a *cli) (err error) {
	defer a.closeAll()
	rep := &checkReport{Connector: a.cfg.Name, Kafka: a.cfg.describeKafkaSecurity(), Findings: []checkFinding{}}
	if a.isPostgres() {
		rep.Source = fmt.Sprintf("%s table %s.%s (dsn %s)", a.cfg.Source.Kind, a.cfg.Source.Schema, a.cfg.Source.Table, RedactDSN(a.cfg.Source.DSN))
	} else {
		rep.Source = fmt.Sprintf("%s endpoint %s", a.cfg.Source.Kind, RedactDSN(a.cfg.Source.DSN))
	}
	if a.jsonOut {
		defer func() {
			rep.OK = err == nil
			if err != nil {
				rep.Error = redactText(a.explainKafkaAccess(err).Error())
			}
			b, _ := json.Marshal(rep) // one line: perTask adds the task to it
			fmt.Fprintln(a.stdout, string(b))
		}()
	} else {
		rep.out = a.stdout
		fmt.Fprintf(a.stdout, "tidemark check: connector %q\n", a.cfg.Name)
		fmt.Fprintf(a.stdout, "  source: %s\n", rep.Source)
		fmt.Fprintf(a.stdout, "  kafka:  %s\n", rep.Kafka)
	}
	if err := a.check(ctx, rep); err != nil {
		return err
	}
	if !a.jsonOut {
		fmt.Fprintln(a.stdout, "preflight passed")
	}
	return nil
}

func (a *cli) check(ctx context.Context, rep *checkReport) error {
	const source = "the source (source.dsn)"
	kafka := "Kafka (kafka.brokers)"
	if len(a.cfg.Kafka.Brokers) == 0 {
		kafka = "the embedded broker"
	}
	src, err := a.source(ctx)
	if err != nil {
		return a.notWaitedFor(source, err)
	}
	perr := a.notWaitedFor(source, a.preflight(ctx, src, rep))
	opts, err := a.kafkaOpts()
	if err != nil {
		return err
	}
	if err := a.ensureTopics(ctx, opts, rep); err != nil {
		return a.notWaitedFor(kafka, err)
	}
	cp, err := a.store(opts).Load(a.asItStands(ctx))
	inconclusive := errors.Is(err, offsets.ErrAuditInconclusive)
	if err != nil && !inconclusive {
		return a.notWaitedFor(kafka, err)
	}
	if inconclusive {
		rep.add(postgres.Warn, "checkpoint", redactText(err.Error())+"; run check again once the transaction is resolved")
	}
	sum, fields := a.cfg.Fingerprint()
	switch {
	case cp == nil:
		rep.add(postgres.OK, "checkpoint", "none yet: the first run starts a fresh initial load")
	case cp.NeedsDecision != "":
		rep.add(postgres.Fail, "checkpoint", fmt.Sprintf("marked as needing an operator decision: %s; run would stop (exit 3)", redactText(cp.NeedsDecision)))
		if perr == nil {
			perr = &connector.StopError{
				Reason: "the checkpoint is marked as needing an operator decision: " + redactText(cp.NeedsDecision),
				Hint:   fmt.Sprintf("inspect with `tidemark status`, then `tidemark reset` (to scratch or to a stated watermark) for connector %q", a.cfg.Name),
			}
		}
	case cp.Fingerprint != sum:
		changes := strings.Join(DiffFingerprint(cp.FingerprintFields, fields), "; ")
		rep.add(postgres.Fail, "checkpoint", fmt.Sprintf("the configuration changed since the checkpoint: %s; run would stop (exit 3)", changes))
		if perr == nil {
			// Exit as run would: a gate on check must not pass a
			// configuration run refuses.
			perr = &connector.StopError{
				Reason: "the configuration changed since the checkpoint: " + changes,
				Hint:   fmt.Sprintf("restore the previous configuration, use a new connector name for a new data set, or run `tidemark reset --config FILE` to start connector %q over", a.cfg.Name),
			}
		}
	default:
		rep.add(postgres.OK, "checkpoint", fmt.Sprintf("seq %d, phase %s, watermark %s", cp.Seq, cp.Phase, orInf(cp.Watermark)))
	}
	return perr
}

// asItStands lets a read-only command read the offsets and ledger topics
// as they stand when a transaction is still open on them (a run killed in
// the middle of its commit leaves one until its name is initialised again
// or the broker's transaction timeout aborts it), after a short wait, and
// warns that what it shows may then be behind. The engine never reads that
// way (docs/design.md, "One writer").
func (a *cli) asItStands(ctx context.Context) context.Context {
	var mu sync.Mutex
	warned := map[string]bool{} // once per open transaction, however often it is read
	return fold.WithViewWait(ctx, fold.ViewWait{Timeout: 2 * time.Second, Report: func(o fold.OpenTxn) {
		mu.Lock()
		defer mu.Unlock()
		if warned[o.String()] {
			return
		}
		warned[o.String()] = true
		fmt.Fprintf(a.stderr, "warning: %s; a run killed in the middle of its commit leaves one until it is restarted or the broker's transaction timeout aborts it. "+
			"What follows is what was committed before it and may be behind: run again once it is resolved\n", o)
	}})
}

func cmdStatus(ctx context.Context, a *cli) (err error) {
	defer a.closeAll()
	opts, err := a.kafkaOpts()
	if err != nil {
		return err
	}
	if err := a.waitForKafka(ctx, opts); err != nil { // startup.go
		return err
	}
	cp, err := a.store(opts).Load(a.asItStands(ctx))
	if errors.Is(err, offsets.ErrAuditInconclusive) {
		// Another writer's open transaction cut the view of one topic:
		// show what is committed before it, and say so.
		fmt.Fprintf(a.stderr, "warning: %s; run status again once the transaction is resolved\n", redactText(err.Error()))
	} else if err != nil {
		return err
	}
	if cp != nil { // a link cursor carries the endpoint's query (an api_key?)
		cp.Cursor, cp.NeedsDecision = httpsrc.RedactCursor(cp.Cursor), redactText(cp.NeedsDecision)
	}
	if a.jsonOut {
		if cp == nil {
			fmt.Fprintln(a.stdout, "null")
			return nil
		}
		b, _ := json.MarshalIndent(cp, "", "  ")
		fmt.Fprintln(a.stdout, string(b))
		return nil
	}
	if cp == nil {
		fmt.Fprintf(a.stdout, "connector %q has no committed checkpoint in %s (never run, or reset to scratch)\n", a.cfg.Name, a.cfg.Kafka.OffsetsTopic)
		fmt.Fprintf(a.stdout, "kafka:        %s\n", a.cfg.describeKafkaSecurity())
		return nil
	}
	sum, fields := a.cfg.Fingerprint()
	fmt.Fprintf(a.stdout, "connector:    %s\n", cp.Connector)
	fmt.Fprintf(a.stdout, "kafka:        %s\n", a.cfg.describeKafkaSecurity())
	fmt.Fprintf(a.stdout, "committed:    seq %d at %s by run %s\n", cp.Seq, cp.CommittedAt, cp.RunID)
	fmt.Fprintf(a.stdout, "phase:        %s\n", cp.Phase)
	fmt.Fprintf(a.stdout, "watermark:    %s\n", orInf(cp.Watermark))
	switch {
	case cp.Phase == schemas.PhaseLoad && cp.Load != nil:
		printLoad(a.stdout, cp)
	case cp.Phase != schemas.PhaseIdle:
		fmt.Fprintf(a.stdout, "open pass:    %sfrom %s, cursor %q, max updated_at %s\n", map[bool]string{true: "head pass, "}[cp.PassHead], orInf(cp.PassLow), cp.Cursor, cp.PassMax)
	}
	if line := fullPassLine(cp, a.cfg.Sync.Margin.Duration); line != "" {
		fmt.Fprintf(a.stdout, "full pass:    %s\n", line)
	}
	segs := 0
	for _, u := range cp.Boundary.Units {
		segs += len(u.Offsets)
	}
	fmt.Fprintf(a.stdout, "dedupe set:   %d entries from %s, in %d segments of %s\n", cp.Boundary.Entries, orInf(cp.Boundary.Floor), segs, a.cfg.Kafka.OffsetsTopic)
	c := cp.Counters
	fmt.Fprintf(a.stdout, "counters:     %d transactions, %d pages, %d passes; rows %d read (%d re-read below the watermark), %d published (%d tombstones), %d deduplicated\n",
		c.Transactions, c.Pages, c.Passes, c.Raw, c.Reread, c.Published, c.Tombstones, c.Deduped)
	if cp.LastReset != nil {
		fmt.Fprintf(a.stdout, "last reset:   %s by %s to %s: %s\n", cp.LastReset.At, cp.LastReset.By, orInf(cp.LastReset.Watermark), cp.LastReset.Reason)
	}
	if cp.NeedsDecision != "" {
		fmt.Fprintf(a.stdout, "NEEDS DECISION: %s\n", cp.NeedsDecision)
	}
	if cp.Fingerprint == sum {
		fmt.Fprintf(a.stdout, "fingerprint:  %s (matches the configuration)\n", cp.Fingerprint)
	} else {
		fmt.Fprintf(a.stdout, "fingerprint:  %s DIFFERS from the configuration (%s): %s\n", cp.Fingerprint, sum, strings.Join(DiffFingerprint(cp.FingerprintFields, fields), "; "))
	}
	return nil
}

// printLoad describes an open initial load in key order: how many of its
// key ranges are done, and where each started one stands.
func printLoad(w io.Writer, cp *schemas.Checkpoint) {
	kind := "moving"
	if cp.Load.Consistent {
		kind = "consistent (one snapshot shared by its sessions)"
	}
	done, started := 0, 0
	for _, r := range cp.Load.Ranges {
		switch {
		case r.Done:
			done++
		case r.Cursor != "":
			started++
		}
	}
	fmt.Fprintf(w, "initial load: in key order, %s; %d of %d key ranges done, %d part way, %d not started; watermark after the load %s\n",
		kind, done, len(cp.Load.Ranges), started, len(cp.Load.Ranges)-done-started, cp.PassHorizon)
	for _, r := range cp.Load.Ranges {
		if r.Cursor != "" && !r.Done {
			fmt.Fprintf(w, "  range (%s, %s]: at id %s\n", orDash(r.Lo, "first"), orDash(r.Hi, "last"), strings.TrimPrefix(r.Cursor, "i:"))
		}
	}
}

func orDash(s, empty string) string {
	if s == "" {
		return empty
	}
	return s
}

// cmdReset records an operator decision: the next run starts from scratch
// (or from --to-watermark). It is committed as a checkpoint, transactionally,
// and it fences a running instance.
func cmdReset(ctx context.Context, a *cli) error {
	defer a.closeAll()
	wm := ""
	if a.toWM != "" {
		t, err := schemas.ParseTime(a.toWM)
		if err != nil {
			return &ConfigError{Key: "--to-watermark", Msg: err.Error() + "; give an RFC 3339 timestamp such as 2026-01-31T00:00:00Z"}
		}
		if t.After(time.Now().Add(time.Minute)) {
			// Every row changed before it would never be read again.
			return &ConfigError{Key: "--to-watermark", Msg: fmt.Sprintf("%s is in the future: no row changed before it would be read again; give a time no later than now, such as the watermark `tidemark status` shows", a.toWM)}
		}
		wm = schemas.FormatTime(t)
	}
	opts, err := a.kafkaOpts()
	if err != nil {
		return err
	}
	if err := a.waitForKafka(ctx, opts); err != nil { // startup.go
		return err
	}
	// A reset is the decision for a connector that cannot run, so it reads
	// the checkpoint without the fail-closed audit. This first read, for
	// the question, takes the topic as it stands; the reset itself follows
	// the strict read made once its producer session has fenced the
	// connector (below).
	store := offsets.NewStore(opts, a.cfg.Kafka.OffsetsTopic, a.cfg.Name)
	// A checkpoint this build cannot read stops every run, whose hint is
	// this command: the reset replaces it, with no seq, counters or dedupe
	// segments to carry over.
	load := func(ctx context.Context) (*schemas.Checkpoint, error) {
		cp, err := store.Load(ctx)
		if errors.Is(err, offsets.ErrUnreadableCheckpoint) {
			fmt.Fprintf(a.stdout, "the current checkpoint cannot be read (%s); the reset replaces it\n", printable(redactText(err.Error())))
			return nil, nil
		}
		return cp, err
	}
	old, err := load(a.asItStands(ctx))
	if err != nil {
		return err
	}
	what := "from scratch (a full initial load: every row is published again; records already in the topic stay)"
	if wm != "" {
		what = "from watermark " + wm + " (rows with updated_at < " + wm + " minus the margin are NOT read again)"
	}
	fmt.Fprintf(a.stdout, "reset connector %q %s\n", a.cfg.Name, what)
	if old != nil {
		fmt.Fprintf(a.stdout, "current checkpoint: seq %d, phase %s, watermark %s\n", old.Seq, old.Phase, orInf(old.Watermark))
	}
	if !a.yes {
		fmt.Fprint(a.stdout, "type 'yes' to confirm: ")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		if strings.TrimSpace(line) != "yes" {
			return usageErrorf("not confirmed; nothing changed (use --yes to skip the question)")
		}
	}
	by := a.by
	if by == "" {
		by = "unknown"
		if u, err := user.Current(); err == nil {
			by = u.Username
		}
		if h, err := os.Hostname(); err == nil {
			by += "@" + h
		}
	}
	if err := a.ensureTopics(ctx, opts, nil); err != nil {
		return err
	}
	w, err := a.writer(ctx, opts)
	if err != nil {
		return err
	}
	// The session fenced the connector and resolved its last transaction:
	// read the checkpoint the reset follows (its seq, counters and dedupe
	// segments) from a complete view (docs/design.md, "One writer").
	shown := old
	if old, err = load(ctx); err != nil {
		return fmt.Errorf("read the checkpoint again after fencing the connector: %w", err)
	}
	if (old == nil) != (shown == nil) || old != nil && old.Seq != shown.Seq {
		seq := "none"
		if old != nil {
			seq = fmt.Sprint(old.Seq)
		}
		fmt.Fprintf(a.stdout, "the checkpoint read after fencing is seq %s (the first read stopped short of it); the reset follows it\n", seq)
	}
	sum, fields := a.cfg.Fingerprint()
	cp := &schemas.Checkpoint{
		Version: schemas.CheckpointVersion, Connector: a.cfg.Name, Fingerprint: sum, FingerprintFields: fields,
		Phase: schemas.PhaseIdle, Watermark: wm, RunID: schemas.ResetRunID,
		CommittedAt: schemas.FormatTime(time.Now()),
		LastReset:   &schemas.Reset{At: schemas.FormatTime(time.Now()), By: by, Reason: a.reason, Watermark: wm},
	}
	if old != nil {
		cp.Seq, cp.Counters = old.Seq, old.Counters
	}
	cp.Seq++
	cp.Counters.Transactions++
	b, err := schemas.EncodeCheckpoint(cp)
	if err != nil {
		return err
	}
	led, err := schemas.EncodeLedgerEntry(&schemas.LedgerEntry{
		Version: schemas.LedgerVersion, Connector: a.cfg.Name, Kind: schemas.LedgerReset, RunID: schemas.ResetRunID,
		Seq: cp.Seq, At: cp.LastReset.At, Watermark: wm, Counters: cp.Counters, By: by, Why: a.reason,
		Detail: what,
	})
	if err != nil {
		return err
	}
	// The old checkpoint's dedupe-set segments are no longer needed:
	// tombstone them in the same transaction, so compaction removes them.
	var state []connector.StateRecord
	if old != nil {
		for _, u := range old.Boundary.Units {
			for i := range u.Offsets {
				state = append(state, connector.StateRecord{Key: schemas.BoundaryKey(a.cfg.Name, u.Seq, i)})
			}
		}
	}
	if err := w.Begin(ctx); err != nil {
		return err
	}
	if err := w.Commit(ctx, &connector.Commit{State: state, Ledger: led, Checkpoint: func([]int64) ([]byte, error) { return b, nil }}); err != nil {
		return fmt.Errorf("commit the reset: %w", err)
	}
	a.log.Warn("operator reset committed", "connector", a.cfg.Name, "watermark", orInf(wm), "by", by, "reason", a.reason, "seq", cp.Seq)
	fmt.Fprintf(a.stdout, "reset committed (checkpoint seq %d)\n", cp.Seq)
	return nil
}

// fullPassLine is status's line about the next full pass while head passes
// have run since the last one (docs/design.md, "Head passes"), or "".
func fullPassLine(cp *schemas.Checkpoint, margin time.Duration) string {
	if !cp.HeadsSinceFull {
		return ""
	}
	from := "-infinity"
	if w, err := schemas.ParseTime(cp.FullWatermark); err == nil {
		from = schemas.FormatTime(w.Add(-max(margin, 0)))
	}
	return fmt.Sprintf("due; head passes have run since the last one, which left the watermark at %s: the next reads from %s, and rows committed late below the watermark wait for it (at most sync.poll_interval)",
		orInf(cp.FullWatermark), from)
}

func orInf(ts string) string {
	if ts == "" {
		return "-infinity"
	}
	return ts
}
