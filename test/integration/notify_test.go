package integration

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/rig"
)

// passCounter counts the passes the engine starts (a page request without
// a cursor is the first page of a pass), keeps their first requests, and
// can hold the first page of the next pass until released.
type passCounter struct {
	*postgres.Source
	mu     sync.Mutex
	passes int
	firsts []connector.PageRequest
	hold   chan struct{} // the next pass's first page waits for it to close
	// noSteps drops PageRequest.Steps, as a restart does: a full pass
	// then reads again what the head passes read.
	noSteps bool
	// slowBelow, when set, delays by slow the first page of every pass
	// that reads from before it (full passes, with a long margin).
	slowBelow time.Time
	slow      time.Duration
	// onPage, when set, runs before every page is read, in the engine's
	// goroutine; reqs are all the page requests, in order.
	onPage func(ctx context.Context, req connector.PageRequest)
	reqs   []connector.PageRequest
	// read counts the rows returned, by id.
	read map[string]int
}

func (p *passCounter) Page(ctx context.Context, req connector.PageRequest) (connector.Page, error) {
	p.mu.Lock()
	if p.noSteps {
		req.Steps = nil
	}
	p.reqs = append(p.reqs, req)
	onPage := p.onPage
	p.mu.Unlock()
	if onPage != nil {
		onPage(ctx, req)
	}
	// A pass's first page: no cursor, and not a later window of a full
	// pass (PageRequest.From).
	if req.Cursor == "" && req.From.IsZero() {
		p.mu.Lock()
		p.passes++
		p.firsts = append(p.firsts, req)
		hold := p.hold
		p.hold = nil
		slow := p.slow
		if p.slowBelow.IsZero() || !req.Since.Before(p.slowBelow) {
			slow = 0
		}
		p.mu.Unlock()
		if slow > 0 {
			select {
			case <-time.After(slow):
			case <-ctx.Done():
				return connector.Page{}, ctx.Err()
			}
		}
		if hold != nil {
			select {
			case <-hold:
			case <-ctx.Done():
				return connector.Page{}, ctx.Err()
			}
		}
	}
	page, err := p.Source.Page(ctx, req)
	p.mu.Lock()
	if p.read == nil {
		p.read = map[string]int{}
	}
	for _, r := range page.Rows {
		p.read[r.ID]++
	}
	p.mu.Unlock()
	return page, err
}

// times returns how many times the row id was read.
func (p *passCounter) times(id string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.read[id]
}

func (p *passCounter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.passes
}

// settled waits until no pass has started for quiet, and returns the count.
func (p *passCounter) settled(t *testing.T, quiet time.Duration) int {
	t.Helper()
	n, since := p.count(), time.Now()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if m := p.count(); m != n {
			n, since = m, time.Now()
		}
		if time.Since(since) >= quiet {
			return n
		}
	}
	t.Fatalf("passes kept starting for 30s (%d so far) with a poll interval of 1h", n)
	return 0
}

// notifyWorld is the rig's items table with the trigger NotifySQL prints
// installed, a Listener on its channel, and a continuous engine over a
// passCounter whose wake-ups come from the listener, polling once an hour.
type notifyWorld struct {
	r   *rig.Rig
	l   *postgres.Listener
	src *passCounter
}

func newNotifyWorld(t *testing.T) *notifyWorld {
	t.Helper()
	return newNotifyWorldWith(t, connector.Config{PollInterval: time.Hour})
}

// newNotifyWorldWith is newNotifyWorld with cfg's settings; Wake is
// added, and a MinPassGap of 20 ms unless cfg sets one.
func newNotifyWorldWith(t *testing.T, cfg connector.Config) *notifyWorld {
	t.Helper()
	r := itemsWithTrigger(t)
	ctx, cancel := context.WithCancel(context.Background())
	l, err := postgres.Listen(ctx, r.PG, postgres.ListenConfig{Channel: "items_changes", Logger: rig.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	w := &notifyWorld{r: r, l: l, src: &passCounter{Source: r.Src}}
	cfg.Wake = l.Wake()
	if cfg.MinPassGap == 0 {
		cfg.MinPassGap = 20 * time.Millisecond
	}
	e := r.Engine(w.src, cfg)
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("run: %v", err)
		}
		l.Close()
	})
	return w
}

// insert commits one row in a transaction of its own.
func (w *notifyWorld) insert(id int) {
	w.r.Exec(`INSERT INTO items (id, v) VALUES ($1, $2)`, id, fmt.Sprintf("v%d", id))
}

// waitPublished waits until every row of the table is in the topic.
func (w *notifyWorld) waitPublished(t *testing.T, d time.Duration) {
	t.Helper()
	want := w.r.Expected()
	for end := time.Now().Add(d); ; time.Sleep(20 * time.Millisecond) {
		diff := rig.Diff(w.r.Fold(), want)
		if len(diff) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the topic differs from the table %s after the last write: %v", d, diff)
		}
	}
}

// TestNotifyCoalescesPasses: fifty notifications that arrive while one
// pass runs start exactly one more pass, not fifty, and that one its
// follow-up (docs/design.md, "Follow-up passes"), which finds nothing and
// is the last; every row is published.
func TestNotifyCoalescesPasses(t *testing.T) {
	w := newNotifyWorld(t)
	w.src.settled(t, 500*time.Millisecond)
	hold := make(chan struct{})
	w.src.mu.Lock()
	w.src.hold = hold
	w.src.mu.Unlock()
	before := w.src.count()
	w.insert(1) // its notification starts a pass, which waits at its first page
	for end := time.Now().Add(10 * time.Second); w.src.count() == before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("a committed row's notification started no pass within 10s (poll interval 1h)")
		}
	}
	held := w.src.count()
	notes := w.l.Notifications()
	for id := 2; id <= 51; id++ {
		w.insert(id)
	}
	for end := time.Now().Add(10 * time.Second); w.l.Notifications() < notes+50; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of 50 notifications arrived within 10s", w.l.Notifications()-notes)
		}
	}
	close(hold)
	w.waitPublished(t, 10*time.Second)
	after := w.src.settled(t, 500*time.Millisecond)
	if extra := after - held; extra != 2 {
		t.Errorf("50 notifications during one pass started %d more passes, want 2 (one, and its follow-up)", extra)
	}
	rig.AssertNoDupes(t, w.r.Fold())
}

// TestNotifyFollowUpReadsACommitThatDidNotNotify: with the deferred
// trigger, a transaction whose trigger ran while another held the notify
// turn sends no notification
// (docs/design.md, "One notifier at a time"), and here it commits only
// after the pass that the holder's notification started has read the
// table. The follow-up of that pass publishes it, although the poll
// interval is an hour. (In the wild the two commits are a WAL flush apart;
// SET CONSTRAINTS ... IMMEDIATE runs the triggers early, to hold the
// moments apart.) The engine's wake-ups come from the test, one for the
// holder's notification: the listener may make a second one of a single
// notification (postgres.Listener), which would start a pass in place of
// the follow-up. A listener of its own counts the notifications.
func TestNotifyFollowUpReadsACommitThatDidNotNotify(t *testing.T) {
	const gap = 2 * time.Second // the follow-up starts this long after the woken pass
	r := itemsWithTriggerOf(t, postgres.NotifyDeferred)
	ctx := context.Background()
	l, err := postgres.Listen(ctx, r.PG, postgres.ListenConfig{Channel: "items_changes", Logger: rig.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	wake := make(chan struct{}, 1)
	src := &passCounter{Source: r.Src}
	startEngine(t, r, src, connector.Config{PollInterval: time.Hour, Wake: wake, MinPassGap: gap}, "")
	src.settled(t, 300*time.Millisecond)
	begin := func(id int) pgx.Tx {
		tx, err := r.DB.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if _, err := tx.Exec(ctx, `SET CONSTRAINTS `+postgres.NotifyTrigger+` IMMEDIATE`); err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO items (id, updated_at, v) VALUES ($1, clock_timestamp(), 'v')`, id); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	notes := l.Notifications()
	holder := begin(1)
	skipper := begin(2)
	if err := holder.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	wake <- struct{}{}
	waitFor(t, 10*time.Second, "the holder's row published", func() bool { return len(r.Fold().Live) == 1 })
	start := time.Now()
	if err := skipper.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the row that sent no notification published", func() bool { return len(r.Fold().Live) == 2 })
	t.Logf("the row that sent no notification was published %s after its commit", time.Since(start).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // the listener reads at least every 250 ms
	if n := l.Notifications() - notes; n != 1 {
		t.Errorf("%d notifications for the two commits, want 1: the test proves nothing", n)
	}
	rig.AssertNoDupes(t, r.Fold())
}

// TestNotifyListenerTerminated: the listener's backend terminated with
// pg_terminate_backend reconnects, and a pass follows without any write
// (it reads whatever was committed while nobody listened), and its
// follow-up; a row committed after that is published within seconds
// although the poll interval is an hour.
func TestNotifyListenerTerminated(t *testing.T) {
	w := newNotifyWorld(t)
	w.insert(1)
	w.waitPublished(t, 10*time.Second)
	for round := 1; round <= 2; round++ {
		before := w.src.settled(t, 500*time.Millisecond)
		pid := w.l.PID()
		var ok bool
		if err := w.r.DB.Pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
		}
		for end := time.Now().Add(10 * time.Second); w.l.PID() == 0 || w.l.PID() == pid; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("round %d: the listener did not reconnect within 10s of the termination of backend %d", round, pid)
			}
		}
		if n := w.src.settled(t, 500*time.Millisecond); n != before+2 {
			t.Fatalf("round %d: %d passes followed the reconnection, want 2 (one, and its follow-up)", round, n-before)
		}
		w.insert(round + 1)
		w.waitPublished(t, 10*time.Second)
	}
	rig.AssertNoDupes(t, w.r.Fold())
}

// itemsWithTrigger is the rig's items table with the statement-level
// trigger NotifySQL prints installed, notifying channel items_changes.
func itemsWithTrigger(t *testing.T) *rig.Rig {
	t.Helper()
	return itemsWithTriggerOf(t, postgres.NotifyStatement)
}

// itemsWithTriggerOf is itemsWithTrigger with the trigger of kind.
func itemsWithTriggerOf(t *testing.T, kind postgres.NotifyKind) *rig.Rig {
	t.Helper()
	r := newRig(t, "", "items")
	st, err := postgres.NotifySQL(r.DB.Schema, "items", "items_changes", kind)
	if err != nil {
		t.Fatal(err)
	}
	r.Exec(st.Install)
	return r
}
