package postgres_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// listen starts a Listener on channel for db, closed at cleanup, and takes
// the wake-up it sends on start.
func listen(t *testing.T, db *harness.DB, lc postgres.ListenConfig) *postgres.Listener {
	t.Helper()
	l, err := postgres.Listen(context.Background(), postgres.Config{DSN: db.URL}, lc)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(l.Close)
	if !woke(l, 5*time.Second) {
		t.Fatal("no wake-up on start")
	}
	return l
}

// woke waits up to d for a wake-up.
func woke(l *postgres.Listener, d time.Duration) bool {
	select {
	case <-l.Wake():
		return true
	case <-time.After(d):
		return false
	}
}

func notify(t *testing.T, db *harness.DB, channel string) {
	t.Helper()
	if _, err := db.Pool.Exec(context.Background(), "SELECT pg_notify($1, '')", channel); err != nil {
		t.Fatal(err)
	}
}

// waitFor polls cond every 10 ms for up to d.
func waitFor(d time.Duration, cond func() bool) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// TestListenerCoalesces: twenty notifications, each committed on its own,
// that arrive while nobody reads make one wake-up, not twenty.
func TestListenerCoalesces(t *testing.T) {
	db := harness.NewDB(t)
	l := listen(t, db, postgres.ListenConfig{Channel: "coalesce"})
	for range 20 {
		notify(t, db, "coalesce")
	}
	notify(t, db, "another_channel")
	if !waitFor(10*time.Second, func() bool { return l.Notifications() == 20 }) {
		t.Fatalf("received %d notifications, want 20", l.Notifications())
	}
	if !woke(l, time.Second) {
		t.Fatal("no wake-up after 20 notifications")
	}
	if woke(l, 200*time.Millisecond) {
		t.Fatal("a second wake-up for notifications that all arrived before the first was read")
	}
	notify(t, db, "coalesce")
	if !woke(l, 5*time.Second) {
		t.Fatal("no wake-up for a notification after the first was read")
	}
}

// TestListenerHoldsWhileAWakeUpWaits: while the wake-up it sent waits for
// the engine, the listener leaves further notifications unread, and reads
// them in bulk once it is taken: under thousands of commits a second,
// reading each as it came cost a system call and a wake-up of tidemark
// per commit, a third of tidemark's CPU. The hold is bounded: a wake-up
// nobody takes does not leave the notifications unread for longer than
// MaxHold, since the server's notification queue, which every notifying
// commit writes to, is bounded too.
func TestListenerHoldsWhileAWakeUpWaits(t *testing.T) {
	db := harness.NewDB(t)
	l := listen(t, db, postgres.ListenConfig{Channel: "hold", MaxHold: time.Minute})
	notify(t, db, "hold")
	if !waitFor(10*time.Second, func() bool { return l.Notifications() == 1 }) {
		t.Fatalf("received %d notifications, want 1", l.Notifications())
	}
	// The listener holds now.
	time.Sleep(200 * time.Millisecond)
	// heldThenRead: what was sent since is left unread (the count stays
	// at before) while the wake-up waits, and read in full (after) once
	// it is taken.
	heldThenRead := func(before, after int64) {
		t.Helper()
		time.Sleep(300 * time.Millisecond)
		if n := l.Notifications(); n != before {
			t.Errorf("%d notifications read while a wake-up waited for the engine, want %d (the rest left unread until it is taken)", n, before)
		}
		if !woke(l, time.Second) {
			t.Fatal("no wake-up waiting")
		}
		if !waitFor(5*time.Second, func() bool { return l.Notifications() == after }) {
			t.Fatalf("received %d notifications after the wake-up was taken, want %d", l.Notifications(), after)
		}
	}
	for range 20 {
		notify(t, db, "hold")
	}
	heldThenRead(1, 21)
	if !woke(l, 5*time.Second) {
		t.Fatal("no wake-up for the notifications read after the first was taken")
	}

	// A backlog of many reads' worth (2,000 notifications of one
	// transaction, some 40 kB) is read in full once the wake-up is
	// taken, not a read's worth per wake-up (with a hold of a minute,
	// the rest would wait for the next).
	notify(t, db, "hold")
	if !waitFor(10*time.Second, func() bool { return l.Notifications() == 22 }) {
		t.Fatalf("received %d notifications, want 22", l.Notifications())
	}
	time.Sleep(200 * time.Millisecond)
	if _, err := db.Pool.Exec(context.Background(), "SELECT pg_notify('hold', g::text) FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	heldThenRead(22, 2022)

	// Bounded: nobody takes the wake-up, and still everything is read,
	// at least every MaxHold.
	b := listen(t, db, postgres.ListenConfig{Channel: "bounded", MaxHold: time.Second})
	start := time.Now()
	for range 20 {
		notify(t, db, "bounded")
		time.Sleep(100 * time.Millisecond)
	}
	if !waitFor(5*time.Second, func() bool { return b.Notifications() == 20 }) {
		t.Fatalf("received %d notifications in %s while nobody took the wake-up, want all 20 within about MaxHold of the last", b.Notifications(), time.Since(start).Round(time.Millisecond))
	}
	if !woke(b, time.Second) {
		t.Fatal("no wake-up after 20 notifications")
	}
	if woke(b, 200*time.Millisecond) {
		t.Fatal("a second wake-up for notifications that all arrived before the first was read")
	}
}

// TestListenerReconnects: the listening backend terminated with
// pg_terminate_backend comes back on a new backend, sends one wake-up
// without any notification (a pass follows), and notifications work again.
func TestListenerReconnects(t *testing.T) {
	db := harness.NewDB(t)
	l := listen(t, db, postgres.ListenConfig{Channel: "reconnect"})
	for round := 1; round <= 2; round++ {
		pid := l.PID()
		if pid == 0 {
			t.Fatal("no listening backend")
		}
		var ok bool
		if err := db.Pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", int64(pid)).Scan(&ok); err != nil || !ok {
			t.Fatalf("pg_terminate_backend(%d): %v %v", pid, ok, err)
		}
		if !woke(l, 10*time.Second) {
			t.Fatalf("round %d: no wake-up within 10s of the listening backend's termination", round)
		}
		if got := l.PID(); got == 0 || got == pid {
			t.Fatalf("round %d: listening backend %d after the termination of %d", round, got, pid)
		}
		if got := l.Reconnects(); got != int64(round) {
			t.Errorf("round %d: %d reconnections", round, got)
		}
		notify(t, db, "reconnect")
		if !woke(l, 5*time.Second) {
			t.Fatalf("round %d: a notification after the reconnection woke nothing", round)
		}
	}
}

// TestListenerSurvivesRestart: the server stopped for a while and started
// again: the listener logs the loss and each failed attempt, comes back
// once the server does, logs that, sends one wake-up and delivers again.
func TestListenerSurvivesRestart(t *testing.T) {
	pg := harness.StartPostgres(t)
	db := harness.NewDBOn(t, pg)
	var logs harness.SyncBuffer
	l := listen(t, db, postgres.ListenConfig{Channel: "restart", MaxBackoff: 500 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	pid := l.PID()
	pg.StopServer(t)
	time.Sleep(1500 * time.Millisecond) // some attempts fail meanwhile
	if woke(l, 50*time.Millisecond) {
		t.Fatal("a wake-up while the server is down")
	}
	pg.StartServer(t)
	if !woke(l, 30*time.Second) {
		t.Fatalf("no wake-up within 30s of the server's start\n%s", logs.String())
	}
	if l.PID() == 0 || l.PID() == pid || l.Reconnects() != 1 {
		t.Errorf("backend %d -> %d, %d reconnections", pid, l.PID(), l.Reconnects())
	}
	notify(t, db, "restart")
	if !woke(l, 5*time.Second) {
		t.Fatal("a notification after the restart woke nothing")
	}
	out := logs.String()
	t.Log(out)
	for _, want := range []string{"LISTEN connection was lost", "reconnecting failed", "LISTEN re-established"} {
		if !strings.Contains(out, want) {
			t.Errorf("the log does not say %q:\n%s", want, out)
		}
	}
}

// TestListenerHeartbeat: a connection checked by heartbeats many times
// over (each a timed-out wait and a round trip) still delivers.
func TestListenerHeartbeat(t *testing.T) {
	db := harness.NewDB(t)
	l := listen(t, db, postgres.ListenConfig{Channel: "heartbeat", Heartbeat: 20 * time.Millisecond})
	pid := l.PID()
	for range 5 {
		time.Sleep(100 * time.Millisecond)
		notify(t, db, "heartbeat")
		if !woke(l, 5*time.Second) {
			t.Fatal("no wake-up for a notification between heartbeats")
		}
	}
	if l.PID() != pid || l.Reconnects() != 0 {
		t.Errorf("the heartbeats replaced the connection: backend %d -> %d, %d reconnections", pid, l.PID(), l.Reconnects())
	}
}

// TestListenerStops: cancelling the context ends the listener and its
// backend.
func TestListenerStops(t *testing.T) {
	db := harness.NewDB(t)
	ctx, cancel := context.WithCancel(context.Background())
	l, err := postgres.Listen(ctx, postgres.Config{DSN: db.URL}, postgres.ListenConfig{Channel: "stops"})
	if err != nil {
		t.Fatal(err)
	}
	pid := l.PID()
	cancel()
	done := make(chan struct{})
	go func() { l.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return within 5s of the cancel")
	}
	if !waitFor(5*time.Second, func() bool {
		var n int
		_ = db.Pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int64(pid)).Scan(&n)
		return n == 0
	}) {
		t.Errorf("backend %d still there after the listener stopped", pid)
	}
}

// TestListenRefusesBadChannels: channel names that cannot be listened on
// as given are refused with a message that says why.
func TestListenRefusesBadChannels(t *testing.T) {
	for ch, want := range map[string]string{
		"":                           "empty",
		strings.Repeat("c", 64):      "at most 63 bytes",
		"line\nbreak":                "control character",
		"nul\x00":                    "control character",
		"bad utf8 \xff":              "UTF-8",
		"esc \x1b[31m red":           "control character",
		strings.Repeat("é", 31) + "": "", // 62 bytes: fine
	} {
		err := postgres.CheckChannel(ch)
		if want == "" {
			if err != nil {
				t.Errorf("%q refused: %v", ch, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: error %v, want one saying %q", ch, err, want)
		}
		if _, err := postgres.Listen(context.Background(), postgres.Config{DSN: "postgres://127.0.0.1:1/x"}, postgres.ListenConfig{Channel: ch}); !errors.Is(err, postgres.ErrBadConfig) {
			t.Errorf("Listen(%q): %v, want ErrBadConfig", ch, err)
		}
	}
}

// TestNotifySQLHostileNames: the printed SQL installs on tables whose
// names hold quotes, dollar quotes, spaces and a line break followed by
// SQL, for a channel that holds quotes, a backslash, a dollar-quote tag
// and SQL; the trigger then notifies exactly that channel, nothing else
// runs, and the removal statements remove it.
func TestNotifySQLHostileNames(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, `CREATE TABLE canary (x int)`)
	for k, kind := range []postgres.NotifyKind{postgres.NotifyStatement, postgres.NotifyDeferred} {
		for i, table := range []string{
			`we"ird ta'ble $$ $tidemark$`,
			"x\nDROP TABLE canary; --",
			"y\rDROP TABLE canary; --",       // PostgreSQL ends a -- comment at \r too
			strings.Repeat("long name é", 6), // the function name is cut and digested
		} {
			hostileNotifySQL(t, db, kind, postgres.NotifyKinds[k]+" "+table, i)
		}
	}
	var n int
	if err := db.Pool.QueryRow(ctx, `SELECT count(*) FROM canary`).Scan(&n); err != nil {
		t.Fatalf("the canary table is gone: %v", err)
	}
	if _, err := postgres.NotifySQL(db.Schema, "t", "bad\nchannel", postgres.NotifyStatement); !errors.Is(err, postgres.ErrBadConfig) || !strings.Contains(err.Error(), "control character") {
		t.Errorf("a channel with a line break: %v", err)
	}
}

// hostileNotifySQL installs the trigger of kind on a table named table
// (i picks the channel), checks what it notifies, and removes it.
func hostileNotifySQL(t *testing.T, db *harness.DB, kind postgres.NotifyKind, table string, i int) {
	t.Helper()
	ctx := context.Background()
	{
		// With a backslash the literal takes the E'...' form; without one
		// the plain form. Both hold what would end a naive quote or tag.
		channel := `ch'an"nel $tidemark$ \'); DROP TABLE canary; --`
		if i%2 == 1 {
			channel = `it's $$ $tidemark$ '); DROP TABLE canary; --`
		}
		ident := pgx.Identifier{db.Schema, table}.Sanitize()
		db.Exec(t, `CREATE TABLE `+ident+` (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now(), v text)`)
		st, err := postgres.NotifySQL(db.Schema, table, channel, kind)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Pool.Exec(ctx, st.Install); err != nil {
			t.Fatalf("table %q: the printed SQL does not install: %v\n%s", table, err, st.Install)
		}
		// Installing twice replaces, it does not fail; and the literal
		// means the same with standard_conforming_strings off.
		if _, err := db.Pool.Exec(ctx, "SET standard_conforming_strings = off;\n"+st.Install+"RESET standard_conforming_strings;"); err != nil {
			t.Fatalf("table %q: installing again, with standard_conforming_strings off: %v", table, err)
		}
		src := open(t, postgres.Config{DSN: db.URL, Schema: db.Schema, Table: table})
		fs, err := src.CheckNotify(ctx, channel)
		if err != nil || len(fs) != 1 || fs[0].Severity != postgres.OK || !strings.Contains(fs[0].Message, map[postgres.NotifyKind]string{postgres.NotifyStatement: "statement-level", postgres.NotifyDeferred: "one notifying commit at a time"}[kind]) {
			t.Errorf("table %q: CheckNotify after the install: %v %v", table, fs, err)
		}
		l := listen(t, db, postgres.ListenConfig{Channel: channel})
		// The writer's session reads the function body with its own
		// standard_conforming_strings: off, a backslash escapes in a
		// plain literal, which the E'...' form survives.
		wc, err := pgx.ParseConfig(db.URL)
		if err != nil {
			t.Fatal(err)
		}
		wc.RuntimeParams["standard_conforming_strings"] = "off"
		writer, err := pgx.ConnectConfig(ctx, wc)
		if err != nil {
			t.Fatal(err)
		}
		defer writer.Close(ctx)
		for i, stmt := range []string{
			`INSERT INTO ` + ident + ` (id, v) VALUES (1, 'a'), (2, 'b')`,
			`UPDATE ` + ident + ` SET v = 'c'`,
			`DELETE FROM ` + ident + ` WHERE id = 1`,
		} {
			if _, err := writer.Exec(ctx, stmt); err != nil {
				t.Fatalf("table %q: %s: %v", table, stmt, err)
			}
			if !woke(l, 5*time.Second) {
				t.Fatalf("table %q: statement %d (%s) woke nothing", table, i, stmt)
			}
		}
		// A statement that changes no row: the statement-level trigger
		// fires for it too, the deferred one is never queued.
		if _, err := writer.Exec(ctx, `UPDATE `+ident+` SET v = 'd' WHERE false`); err != nil {
			t.Fatal(err)
		}
		want := int64(3)
		if kind == postgres.NotifyStatement {
			want = 4
		}
		if !waitFor(5*time.Second, func() bool { return l.Notifications() == want }) {
			t.Errorf("table %q: %d notifications for 3 statements that changed rows and one that changed none, want %d", table, l.Notifications(), want)
		}
		if woke(l, 300*time.Millisecond) != (want == 4) { // and take its wake-up
			t.Errorf("table %q: the statement that changed no row woke the listener: %v, want %v", table, want == 3, want == 4)
		}
		if _, err := db.Pool.Exec(ctx, st.Remove); err != nil {
			t.Fatalf("table %q: the removal statements fail: %v\n%s", table, err, st.Remove)
		}
		db.Exec(t, `INSERT INTO `+ident+` (id) VALUES (3)`)
		if woke(l, 300*time.Millisecond) {
			t.Errorf("table %q: a notification after the removal", table)
		}
		fs, err = src.CheckNotify(ctx, channel)
		if err != nil || len(fs) != 1 || fs[0].Severity != postgres.Warn || !strings.Contains(fs[0].Message, "--print-notify-sql") {
			t.Errorf("table %q: CheckNotify after the removal: %v %v", table, fs, err)
		}
	}
}

// TestNotifyTriggerOneNotifierAtATime: the deferred trigger notifies when
// a transaction that changed rows commits, unless another transaction is
// notifying the channel at that moment (docs/design.md, "One notifier at
// a time"). A transaction holds that turn from its trigger, which runs at
// commit, until it ends; with SET CONSTRAINTS ... IMMEDIATE the trigger
// runs at the statement's end, which holds the moment open here. Commits
// meanwhile send nothing; the turn ends with the holder, committed or
// rolled back. A long transaction that changed rows and has not begun to
// commit holds no turn: commits beside it notify.
func TestNotifyTriggerOneNotifierAtATime(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL DEFAULT now())`)
	st, err := postgres.NotifySQL(db.Schema, "items", "items_changes", postgres.NotifyDeferred)
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(t, st.Install)
	src := open(t, config(db, "items"))
	if fs, err := src.CheckNotify(ctx, "items_changes"); err != nil || fs[0].Severity != postgres.OK || !strings.Contains(fs[0].Message, "one notifying commit at a time") {
		t.Errorf("CheckNotify: %v %v", fs, err)
	}
	l := listen(t, db, postgres.ListenConfig{Channel: "items_changes"})
	heard := func(want int64, what string) {
		t.Helper()
		if !waitFor(5*time.Second, func() bool { return l.Notifications() >= want }) {
			t.Fatalf("%s: %d notifications, want %d", what, l.Notifications(), want)
		}
		time.Sleep(300 * time.Millisecond) // and no more
		if n := l.Notifications(); n != want {
			t.Fatalf("%s: %d notifications, want %d", what, n, want)
		}
	}
	begin := func(immediate bool) pgx.Tx {
		t.Helper()
		tx, err := db.Pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Before the schema is dropped at the end, which would wait for it.
		t.Cleanup(func() { _ = tx.Rollback(ctx) })
		if immediate {
			if _, err := tx.Exec(ctx, `SET CONSTRAINTS `+postgres.NotifyTrigger+` IMMEDIATE`); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := tx.Exec(ctx, `INSERT INTO items (id) SELECT coalesce(max(id), 0) + 1000 FROM items`); err != nil {
			t.Fatal(err)
		}
		return tx
	}
	n := l.Notifications()
	for _, end := range []string{"COMMIT", "ROLLBACK"} {
		holder := begin(true)
		// Two commits while the holder holds the turn: neither notifies.
		db.Exec(t, `INSERT INTO items (id) SELECT coalesce(max(id), 0) + 1 FROM items WHERE id < 1000`)
		db.Exec(t, `UPDATE items SET updated_at = now() WHERE id < 1000`)
		heard(n, "two commits while another transaction notifies")
		if end == "COMMIT" {
			err, n = holder.Commit(ctx), n+1 // the holder's own
		} else {
			err = holder.Rollback(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		heard(n, "the holder's "+end)
		// With the holder gone, a commit notifies again.
		db.Exec(t, `DELETE FROM items WHERE id < 1000`)
		n++
		heard(n, "a commit after the holder's "+end)
	}
	long := begin(false)
	for i := range 3 {
		db.Exec(t, `INSERT INTO items (id) VALUES ($1)`, i+1)
		n++
		heard(n, "a commit beside an open transaction that changed rows")
	}
	if err := long.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	n++
	heard(n, "the long transaction's commit")
	// One transaction, many rows and statements: one notification, and
	// the trigger function ran once (the WHEN clause queues it once).
	c, err := db.Pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release()
	var calls int64
	if _, err := c.Exec(ctx, `SET track_functions = 'pl'`); err != nil {
		t.Fatal(err)
	}
	tx, err := c.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SET CONSTRAINTS ` + postgres.NotifyTrigger + ` IMMEDIATE`, // so that the calls show before the commit
		`INSERT INTO items (id) SELECT g FROM generate_series(5000, 5999) g`,
		`UPDATE items SET updated_at = now() WHERE id >= 5000`,
		`DELETE FROM items WHERE id >= 5500`,
	} {
		if _, err := tx.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if err := tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_catalog.pg_stat_xact_user_functions WHERE funcid = $1::regproc`, st.Function).Scan(&calls); err != nil {
		t.Fatal(err)
	}
	if calls != 1 {
		t.Errorf("the trigger function ran %d times in a transaction of 2,500 row changes, want 1", calls)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	n++
	heard(n, "a transaction of three statements")
	// A value of the trigger's setting for the session does not silence
	// it: the mark is the transaction's own id.
	setting := strings.Split(strings.Split(st.Install, "current_setting('")[1], "'")[0]
	if _, err := c.Exec(ctx, `SELECT pg_catalog.set_config($1, '1', false)`, setting); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Exec(ctx, `INSERT INTO items (id) VALUES (7000)`); err != nil {
		t.Fatal(err)
	}
	n++
	heard(n, "a commit in a session that set the trigger's setting")
}

// TestCheckNotifyDisabledAndPartial: a disabled trigger, and one that
// misses DELETE, are warned about.
func TestCheckNotifyDisabledAndPartial(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	st, err := postgres.NotifySQL(db.Schema, "items", "items_changes", postgres.NotifyStatement)
	if err != nil {
		t.Fatal(err)
	}
	db.Exec(t, st.Install)
	src := open(t, config(db, "items"))
	db.Exec(t, `ALTER TABLE items DISABLE TRIGGER tidemark_notify`)
	if fs, err := src.CheckNotify(ctx, "items_changes"); err != nil || fs[0].Severity != postgres.Warn || !strings.Contains(fs[0].Message, "disabled") {
		t.Errorf("disabled: %v %v", fs, err)
	}
	db.Exec(t, `DROP TRIGGER tidemark_notify ON items`)
	db.Exec(t, `CREATE TRIGGER mine AFTER INSERT OR UPDATE ON items FOR EACH ROW EXECUTE FUNCTION `+st.Function+`()`)
	if fs, err := src.CheckNotify(ctx, "items_changes"); err != nil || fs[0].Severity != postgres.Warn || !strings.Contains(fs[0].Message, "not on every one") {
		t.Errorf("no DELETE: %v %v", fs, err)
	}
	if fs, err := src.CheckNotify(ctx, "other"); err != nil || fs[0].Severity != postgres.Warn || !strings.Contains(fs[0].Message, "no trigger") {
		t.Errorf("another channel: %v %v", fs, err)
	}
	// Triggers of the operator's own. One deferred to commit without the
	// turn: every transaction notifies, at commit.
	db.Exec(t, `DROP TRIGGER mine ON items`)
	db.Exec(t, `CREATE FUNCTION at_commit() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN PERFORM pg_notify('items_changes', ''); RETURN NULL; END$$`)
	db.Exec(t, `CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT OR UPDATE OR DELETE ON items DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
		WHEN (current_setting('x.y', true) IS DISTINCT FROM set_config('x.y', txid_current()::text, true)) EXECUTE FUNCTION at_commit()`)
	if fs, err := src.CheckNotify(ctx, "items_changes"); err != nil || fs[0].Severity != postgres.OK || !strings.Contains(fs[0].Message, "deferred to commit: every writing transaction notifies") {
		t.Errorf("a deferred trigger without the turn: %v %v", fs, err)
	}
	// One that takes the turn at its statement: it holds it to the end of
	// the transaction, which silences the others.
	db.Exec(t, `DROP TRIGGER at_commit ON items`)
	db.Exec(t, `CREATE FUNCTION at_statement() RETURNS trigger LANGUAGE plpgsql AS $$BEGIN
		IF pg_try_advisory_xact_lock(1, 2) THEN PERFORM pg_notify('items_changes', ''); END IF; RETURN NULL; END$$`)
	db.Exec(t, `CREATE TRIGGER at_statement AFTER INSERT OR UPDATE OR DELETE ON items FOR EACH STATEMENT EXECUTE FUNCTION at_statement()`)
	if fs, err := src.CheckNotify(ctx, "items_changes"); err != nil || fs[0].Severity != postgres.Warn || !strings.Contains(fs[0].Message, "not deferred to commit") || !strings.Contains(fs[0].Message, "--notify-trigger deferred") {
		t.Errorf("a trigger that takes the turn at its statement: %v %v", fs, err)
	}
}

// TestListenErrorsHideThePassword: what Listen returns for a server that
// does not answer, or a DSN that does not parse, never holds the password.
func TestListenErrorsHideThePassword(t *testing.T) {
	const pw = "Sup3r-S3cret-pw"
	for _, dsn := range []string{
		"postgres://u:" + pw + "@127.0.0.1:1/d?connect_timeout=2",
		"postgres://u:" + pw + "@x@127.0.0.1:1/d",
		"host=127.0.0.1 port=1 user=u password = " + pw + " dbname=d connect_timeout=2",
	} {
		_, err := postgres.Listen(context.Background(), postgres.Config{DSN: dsn}, postgres.ListenConfig{Channel: "c"})
		if err == nil || strings.Contains(err.Error(), pw) {
			t.Errorf("Listen error %v: want an error without the password", err)
		}
	}
	_, err := postgres.Listen(context.Background(), postgres.Config{DSN: "postgres://u@127.0.0.1:1/d?connect_timeout=2", Password: pw}, postgres.ListenConfig{Channel: "c"})
	if err == nil || strings.Contains(err.Error(), pw) {
		t.Errorf("Listen error %v: want an error without the password", err)
	}
}

// TestNotifySQLDoesNotQueueBehindLongQueries: installing the trigger takes
// a lock on the table that queues behind a long write transaction and,
// while it waits, blocks every other write on the table. The printed SQL gives up
// after a few seconds instead (lock_timeout, local to its transaction), to
// be run again at a quieter moment.
func TestNotifySQLDoesNotQueueBehindLongQueries(t *testing.T) {
	db := harness.NewDB(t)
	ctx := context.Background()
	db.Exec(t, `CREATE TABLE t (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	st, err := postgres.NotifySQL(db.Schema, "t", "ch", postgres.NotifyDeferred)
	if err != nil {
		t.Fatal(err)
	}
	long, err := db.Pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = long.Rollback(ctx) }()
	// A writer's open transaction (a long batch job, an idle-in-transaction
	// session): its lock conflicts with the trigger's.
	if _, err := long.Exec(ctx, `INSERT INTO t VALUES (1, now())`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := db.Pool.Exec(ctx, st.Install); done <- err }()
	select {
	case err := <-done:
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != "55P03" {
			t.Errorf("installing behind a long query: %v; want lock_not_available (55P03)", err)
		}
	case <-time.After(15 * time.Second):
		_ = long.Rollback(ctx)
		<-done
		t.Fatal("installing the trigger still waited for the table's lock after 15 s")
	}
	if err := long.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Pool.Exec(ctx, st.Install); err != nil {
		t.Fatalf("installing once the query ended: %v", err)
	}
}

// TestListenerReconnectDoesNotHangOnASilentServer: a reconnection that
// reaches something that accepts the connection and never answers (a
// pooler or proxy hung, a half-dead host) gives up after the heartbeat and
// tries again, so notifications come back once the server answers; an
// attempt without a time limit waited for ever and notifications never
// came back until a restart.
func TestListenerReconnectDoesNotHangOnASilentServer(t *testing.T) {
	db := harness.NewDB(t)
	u, err := url.Parse(db.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := newSilentProxy(t, u.Host)
	u.Host = p.addr
	l, err := postgres.Listen(context.Background(), postgres.Config{DSN: u.String()}, postgres.ListenConfig{Channel: "silent", Heartbeat: 300 * time.Millisecond, MaxBackoff: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(l.Close)
	if !woke(l, 5*time.Second) {
		t.Fatal("no wake-up on start")
	}
	p.freeze() // the connection drops; new ones are accepted and never answered
	time.Sleep(time.Second)
	p.thaw()
	if !waitFor(10*time.Second, func() bool { return l.Reconnects() == 1 }) {
		t.Fatalf("%d reconnections 10 s after the server answered again", l.Reconnects())
	}
	notify(t, db, "silent")
	if !woke(l, 5*time.Second) {
		t.Fatal("a notification after the reconnection woke nothing")
	}
}

// silentProxy forwards TCP connections to a target; frozen, it drops the
// ones it forwards and accepts new ones without ever answering.
type silentProxy struct {
	addr   string
	target string
	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
}

func newSilentProxy(t *testing.T, target string) *silentProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &silentProxy{addr: ln.Addr().String(), target: target}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			p.conns = append(p.conns, c)
			frozen := p.frozen
			p.mu.Unlock()
			if frozen {
				continue // accepted, never answered
			}
			go p.forward(c)
		}
	}()
	return p
}

func (p *silentProxy) forward(c net.Conn) {
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, s)
	p.mu.Unlock()
	go func() { _, _ = io.Copy(s, c); s.Close() }()
	_, _ = io.Copy(c, s)
	c.Close()
}

func (p *silentProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *silentProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = false
}
