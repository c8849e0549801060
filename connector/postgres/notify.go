package postgres

// Change notifications (source.notify; docs/operating.md, "Change
// notifications"). A trigger, installed by the operator from
// NotifyStatements, calls pg_notify on a channel when a transaction that
// inserted, updated or deleted rows commits (every such transaction, or
// one notifying commit at a time: NotifyKind); a Listener LISTENs on that
// channel over a connection of its own and turns each notification into a
// coalesced wake-up for the engine (connector.Config.Wake). Polling stays
// the safety net: a lost notification costs at most one poll interval.

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// maxChannelBytes is the longest channel name PostgreSQL keeps: LISTEN
// truncates a longer identifier (NAMEDATALEN - 1) and pg_notify refuses it,
// so the two would not meet.
const maxChannelBytes = 63

// CheckChannel reports what is wrong with a notification channel name, or
// nil. Any text of 1..63 bytes of valid UTF-8 without control characters
// is a channel: it is always quoted (an identifier for LISTEN, a literal
// for pg_notify), never interpreted as SQL.
func CheckChannel(channel string) error {
	switch {
	case channel == "":
		return errors.New("is empty; name a channel, e.g. orders_changes")
	case len(channel) > maxChannelBytes:
		return fmt.Errorf("is %d bytes; PostgreSQL channel names are at most %d bytes (a longer one is truncated by LISTEN and refused by pg_notify)", len(channel), maxChannelBytes)
	case !utf8.ValidString(channel):
		return errors.New("is not valid UTF-8")
	}
	for _, r := range channel {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return fmt.Errorf("holds the control character %U; use printable characters, e.g. orders_changes", r)
		}
	}
	return nil
}

// quoteLiteral quotes s as an SQL string literal, as PostgreSQL's
// quote_literal does: quotes doubled, and with a backslash present the
// E'...' form with backslashes doubled, so that the literal means s whatever
// standard_conforming_strings says.
func quoteLiteral(s string) string {
	q := strings.ReplaceAll(s, "'", "''")
	if strings.Contains(s, `\`) {
		return `E'` + strings.ReplaceAll(q, `\`, `\\`) + `'`
	}
	return "'" + q + "'"
}

// dollarQuote quotes body with a dollar-quote tag that does not occur in
// it, so no text inside the body can end it early.
func dollarQuote(body string) string {
	tag := "$tidemark$"
	for i := 1; strings.Contains(body, tag); i++ {
		tag = "$tidemark_" + strconv.Itoa(i) + "$"
	}
	return tag + body + tag
}

// NotifyTrigger is the trigger name NotifyStatements creates on the table.
const NotifyTrigger = "tidemark_notify"

// NotifyStatements is the SQL that makes a table notify a channel
// (NotifySQL): for the operator to run, as the table's owner. tidemark
// never runs it itself.
type NotifyStatements struct {
	// Install creates (or replaces) the trigger function and the
	// trigger, in one transaction.
	Install string
	// Remove drops both.
	Remove string
	// Function is the trigger function's quoted, schema-qualified name.
	Function string
}

// NotifyKind selects the trigger NotifySQL prints (docs/operating.md,
// "Change notifications").
type NotifyKind int

const (
	// NotifyStatement is a statement-level trigger: every transaction that
	// writes the table notifies when it commits. It changes nothing else
	// about the table, but PostgreSQL commits notifying transactions one
	// at a time, each through its WAL flush, which caps the writers near
	// one commit per flush. The default.
	NotifyStatement NotifyKind = iota
	// NotifyDeferred is a row-level constraint trigger deferred to commit
	// and queued once per transaction, which notifies only when no other
	// transaction is notifying the channel at that moment (docs/design.md,
	// "One notifier at a time"): the writers keep group commit. Its event
	// is pending until commit, which PostgreSQL holds against DDL on the
	// table later in the same transaction, among other limits.
	NotifyDeferred
)

// NotifyKinds are the names of the kinds, as ParseNotifyKind takes them.
var NotifyKinds = []string{"statement", "deferred"}

// ParseNotifyKind parses a kind's name (NotifyKinds).
func ParseNotifyKind(name string) (NotifyKind, error) {
	for i, n := range NotifyKinds {
		if name == n {
			return NotifyKind(i), nil
		}
	}
	return 0, fmt.Errorf("%w: notify trigger %q: want one of %s", ErrBadConfig, name, strings.Join(NotifyKinds, ", "))
}

// NotifySQL returns the statements that make every transaction that
// inserts, updates or deletes rows of schema.table notify channel, with an
// empty payload, when it commits (schema "" is public), with the trigger
// of the given kind. PostgreSQL delivers a notification only at commit,
// and folds identical notifications of one transaction into one. Every
// identifier is quoted; the channel is a literal (quoteLiteral) inside a
// dollar-quoted body whose tag it cannot contain.
func NotifySQL(schema, table, channel string, kind NotifyKind) (NotifyStatements, error) {
	if schema == "" {
		schema = "public"
	}
	if err := CheckChannel(channel); err != nil {
		return NotifyStatements{}, fmt.Errorf("%w: notify channel %w", ErrBadConfig, err)
	}
	if table == "" || strings.IndexByte(schema+table, 0) >= 0 {
		return NotifyStatements{}, fmt.Errorf("%w: notify: a table name is required and names cannot hold NUL bytes", ErrBadConfig)
	}
	if kind != NotifyStatement && kind != NotifyDeferred {
		return NotifyStatements{}, fmt.Errorf("%w: notify trigger kind %d", ErrBadConfig, kind)
	}
	rel := quote(schema, table)
	fn := quote(schema, notifyFunctionName(table))
	trg := quote(NotifyTrigger)
	notify := "PERFORM pg_catalog.pg_notify(" + quoteLiteral(channel) + ", '');"
	body := "\nBEGIN\n  " + notify + "\n  RETURN NULL;\nEND\n"
	if kind == NotifyDeferred {
		k1, k2 := notifyTurn(channel)
		body = "\nBEGIN\n" +
			"  IF pg_catalog.pg_try_advisory_xact_lock(" + strconv.Itoa(int(k1)) + ", " + strconv.Itoa(int(k2)) + ") THEN\n" +
			"    " + notify + "\n" +
			"  END IF;\n  RETURN NULL;\nEND\n"
	}
	remove := "DROP TRIGGER IF EXISTS " + trg + " ON " + rel + ";\nDROP FUNCTION IF EXISTS " + fn + "();\n"
	var b strings.Builder
	if kind == NotifyStatement {
		b.WriteString("-- tidemark: a statement-level trigger that wakes `tidemark run` (source.notify)\n")
		b.WriteString("-- after every INSERT, UPDATE and DELETE statement on the table.\n")
		b.WriteString("-- Run it as the table's owner; tidemark never creates it itself.\n")
		b.WriteString("-- Every writing transaction notifies; PostgreSQL commits notifying transactions\n")
		b.WriteString("-- one at a time. For thousands of commits a second, see --notify-trigger deferred.\n")
	} else {
		b.WriteString("-- tidemark: a trigger that wakes `tidemark run` (source.notify) when a\n")
		b.WriteString("-- transaction that inserted, updated or deleted rows of the table commits.\n")
		b.WriteString("-- Run it as the table's owner; tidemark never creates it itself.\n")
		b.WriteString("-- The WHEN clause queues it once per transaction (it marks the transaction\n")
		b.WriteString("-- in a setting), and it runs at commit. PostgreSQL commits notifying\n")
		b.WriteString("-- transactions one at a time, each through its WAL flush, so a commit does\n")
		b.WriteString("-- not notify while another is notifying this channel (a transaction-level\n")
		b.WriteString("-- advisory lock, tried, never waited for): tidemark's follow-up pass reads it.\n")
		b.WriteString("-- Until commit its event is pending: ALTER TABLE, TRUNCATE, CREATE INDEX or\n")
		b.WriteString("-- DROP on the table after a write in the same transaction fail (\"pending\n")
		name := quote(schema, NotifyTrigger)
		if strings.ContainsAny(name, "\r\n") {
			name = quote(NotifyTrigger) // see the comment on removal below
		}
		b.WriteString("-- trigger events\"); run SET CONSTRAINTS " + name + " IMMEDIATE before them.\n")
		b.WriteString("-- Foreign tables cannot have it: not on a table with foreign partitions.\n")
	}
	// Only text without line breaks may go into a -- comment: a quoted
	// identifier can hold one, and the rest of its line would be SQL.
	if !strings.ContainsAny(rel+fn, "\r\n") {
		b.WriteString("-- To remove it:\n")
		for _, l := range strings.Split(strings.TrimSuffix(remove, "\n"), "\n") {
			b.WriteString("--   " + l + "\n")
		}
	} else {
		b.WriteString("-- To remove it: DROP TRIGGER " + trg + " on the table, and DROP FUNCTION of the function below.\n")
	}
	b.WriteString("BEGIN;\n")
	// The trigger's lock on the table waits for open write transactions
	// and, while it waits, holds up every new write: give up after a few
	// seconds rather than stall the application (run it again later).
	b.WriteString("SET LOCAL lock_timeout = '5s';\n")
	// Names in the statements below resolve in pg_catalog first, whatever
	// the installer's search_path (the operators of WHEN are resolved now).
	b.WriteString("SET LOCAL search_path = pg_catalog, pg_temp;\n")
	b.WriteString("CREATE OR REPLACE FUNCTION " + fn + "() RETURNS trigger\nLANGUAGE plpgsql AS " + dollarQuote(body) + ";\n")
	b.WriteString("DROP TRIGGER IF EXISTS " + trg + " ON " + rel + ";\n")
	if kind == NotifyStatement {
		b.WriteString("CREATE TRIGGER " + trg + "\n  AFTER INSERT OR UPDATE OR DELETE ON " + rel + "\n  FOR EACH STATEMENT EXECUTE FUNCTION " + fn + "();\n")
	} else {
		// The mark is the transaction's own id, so that a value set for
		// the session (SET, ALTER ROLE ... SET) cannot silence it.
		set := quoteLiteral(notifySetting(channel))
		b.WriteString("CREATE CONSTRAINT TRIGGER " + trg + "\n  AFTER INSERT OR UPDATE OR DELETE ON " + rel + "\n  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW\n" +
			"  WHEN (pg_catalog.current_setting(" + set + ", true) IS DISTINCT FROM pg_catalog.set_config(" + set + ", pg_catalog.txid_current()::text, true))\n" +
			"  EXECUTE FUNCTION " + fn + "();\n")
	}
	b.WriteString("COMMIT;\n")
	return NotifyStatements{Install: b.String(), Remove: remove, Function: fn}, nil
}

// notifySetting is the name of the setting (a custom GUC, set for the
// transaction only) that marks a transaction as queued to notify channel:
// one per channel, so that a transaction writing two tables of two
// channels notifies both.
func notifySetting(channel string) string {
	d := channelDigest(channel)
	return "tidemark.notify_" + hex.EncodeToString(d[:])
}

// channelDigest is the first four bytes of a digest of the channel, which
// names its setting (notifySetting) and keys its turn (notifyTurn).
func channelDigest(channel string) [4]byte {
	sum := sha256.Sum256([]byte("tidemark notify " + channel))
	return [4]byte(sum[:4])
}

// notifyTurn is the advisory lock key pair of a channel's notify turn
// (NotifySQL): the first four bytes of a digest of the channel, and a
// fixed "tide". The two-int4 form shares no key with the bigint form of
// the advisory lock functions, and an application's own int4 pairs would
// have to hit both numbers.
func notifyTurn(channel string) (int32, int32) {
	d := channelDigest(channel)
	return 0x74696465, int32(binary.BigEndian.Uint32(d[:]))
}

// notifyFunctionName is tidemark_notify_<table>, or when that is longer
// than an identifier may be, the table's name cut at a character boundary
// and a digest of the whole name, so two long names never share a
// function.
func notifyFunctionName(table string) string {
	name := NotifyTrigger + "_" + table
	if len(name) <= maxChannelBytes {
		return name
	}
	sum := sha256.Sum256([]byte(table))
	suffix := "_" + hex.EncodeToString(sum[:4])
	cut := maxChannelBytes - len(suffix)
	for cut > 0 && !utf8.RuneStart(name[cut]) {
		cut--
	}
	return name[:cut] + suffix
}

// notifyTriggerSQL lists the table's user triggers whose function calls
// pg_notify: name, enabled, statement-level, the events (tgtype bits 4
// INSERT, 8 DELETE, 16 UPDATE), deferred to commit with a WHEN clause
// (as NotifySQL's), and the function's source.
const notifyTriggerSQL = `SELECT t.tgname::text, t.tgenabled <> 'D', (t.tgtype & 1) = 0, (t.tgtype & 28) = 28,
	t.tginitdeferred AND t.tgqual IS NOT NULL, p.prosrc
FROM pg_catalog.pg_trigger t JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid
WHERE t.tgrelid = $1 AND NOT t.tgisinternal AND p.prosrc LIKE '%pg_notify%'`

// CheckNotify reports whether a trigger on the table notifies channel
// (the one NotifySQL prints, or any whose function passes the channel to
// pg_notify as a literal). Without one, tidemark still works, by polling:
// a Warn finding with the fix.
func (s *Source) CheckNotify(ctx context.Context, channel string) ([]Finding, error) {
	sh := s.shape()
	rows, err := s.pool.Query(ctx, notifyTriggerSQL, sh.tbl.oid)
	if err != nil {
		return nil, fmt.Errorf("check notify trigger: %w", err)
	}
	type trig struct {
		name                              string
		enabled, stmt, allEvent, deferred bool
		src                               string
	}
	var found []trig
	for rows.Next() {
		var t trig
		if err := rows.Scan(&t.name, &t.enabled, &t.stmt, &t.allEvent, &t.deferred, &t.src); err != nil {
			return nil, fmt.Errorf("check notify trigger: %w", err)
		}
		found = append(found, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("check notify trigger: %w", err)
	}
	lit := "pg_notify(" + quoteLiteral(channel)
	fix := "print it with `tidemark check --print-notify-sql` and have the table's owner run it"
	for _, t := range found {
		if !strings.Contains(t.src, lit) {
			continue
		}
		switch {
		case !t.enabled:
			return []Finding{{Warn, "notify", fmt.Sprintf("trigger %s on %s notifies channel %q but is disabled: changes wait for the poll (sync.poll_interval); ALTER TABLE ... ENABLE TRIGGER it", quote(t.name), sh.tbl.ident, channel)}}, nil
		case !t.allEvent:
			return []Finding{{Warn, "notify", fmt.Sprintf("trigger %s on %s notifies channel %q, but not on every one of INSERT, UPDATE and DELETE: the others wait for the poll (sync.poll_interval); %s", quote(t.name), sh.tbl.ident, channel, fix)}}, nil
		}
		turn := strings.Contains(t.src, "pg_try_advisory_xact_lock")
		how := "statement-level: every writing transaction notifies"
		switch {
		case turn && !t.deferred:
			// It takes the turn at its statement and holds it to the end
			// of the transaction: commits beside a long transaction go
			// unnotified (docs/design.md, "One notifier at a time").
			return []Finding{{Warn, "notify", fmt.Sprintf("trigger %s on %s notifies channel %q one transaction at a time, but is not deferred to commit: a transaction holds the turn from its first write to its end, and commits meanwhile wait for the poll (sync.poll_interval); print the deferred one with `tidemark check --print-notify-sql --notify-trigger deferred` and have the table's owner run it", quote(t.name), sh.tbl.ident, channel)}}, nil
		case turn:
			how = "deferred to commit, one notifying commit at a time"
		case t.deferred:
			how = "deferred to commit: every writing transaction notifies"
		case !t.stmt:
			how = "row-level (one call per row; a statement-level trigger costs less)"
		}
		return []Finding{{OK, "notify", fmt.Sprintf("trigger %s on %s notifies channel %q on INSERT, UPDATE and DELETE (%s)", quote(t.name), sh.tbl.ident, channel, how)}}, nil
	}
	return []Finding{{Warn, "notify", fmt.Sprintf("no trigger on %s notifies channel %q: changes wait for the poll (sync.poll_interval); %s", sh.tbl.ident, channel, fix)}}, nil
}

// ListenConfig configures Listen.
type ListenConfig struct {
	// Channel is the channel to LISTEN on (CheckChannel). Required.
	Channel string
	// Heartbeat is how long the connection may stay silent before a round
	// trip checks that it is still alive (a dead peer that sent no reset
	// is found this way). Default 30s.
	Heartbeat time.Duration
	// MaxBackoff caps the wait between reconnection attempts, which starts
	// at 100 ms and doubles, jittered. Default 5s.
	MaxBackoff time.Duration
	// MaxHold caps how long notifications are left unread while a
	// wake-up waits for the engine to take it (see Listener). Default
	// 250ms.
	MaxHold time.Duration
	// Logger; default the source Config's Logger, else slog.Default().
	Logger *slog.Logger
}

// Listener holds a dedicated connection (not one of the page pool's) that
// LISTENs on a channel and turns notifications into wake-ups on a channel
// of capacity 1: any number of notifications that arrive before the
// engine looks again make one wake-up. While a wake-up waits for the
// engine, further notifications are left unread until it takes it, for
// at most MaxHold: under thousands of commits a second, reading each as
// it came cost a system call and a wake-up of this process per commit;
// this way one read brings all that queued meanwhile, and makes the next
// wake-up. (So a burst of commits that a pass already read may start one
// more pass, as a notification read during the pass would: the listener
// cannot tell which commits the pass's snapshot holds.) It holds only on
// a plain TCP or Unix socket connection (see holdable); over TLS it reads
// every notification as it comes.
//
// When the connection drops (a server restart, pg_terminate_backend, a
// network failure found by the heartbeat) it is re-established with
// capped, jittered backoff, and then one wake-up is sent: the pass it
// starts reads whatever changed while nobody listened. It stops when the
// context given to Listen ends, or on Close.
type Listener struct {
	conn      *pgx.ConnConfig
	pwFile    string // Config.PasswordFile
	channel   string
	heartbeat time.Duration
	maxWait   time.Duration
	maxHold   time.Duration
	log       *slog.Logger

	wake   chan struct{}
	pid    atomic.Uint32
	notes  atomic.Int64 // notifications received
	again  atomic.Int64 // reconnections
	cancel context.CancelFunc
	done   chan struct{}
}

// Listen connects, runs LISTEN on lc.Channel and returns a Listener that
// keeps listening, reconnecting as needed, until ctx ends or Close. It
// sends one wake-up at once: a change committed before LISTEN took effect
// was not notified. Errors of the first connection are returned (a refused
// login or a bad DSN wraps ErrBadConfig or is a *pgconn.PgError); later
// ones are logged and retried.
func Listen(ctx context.Context, cfg Config, lc ListenConfig) (*Listener, error) {
	if err := CheckChannel(lc.Channel); err != nil {
		return nil, fmt.Errorf("%w: notify channel %w", ErrBadConfig, err)
	}
	if err := CheckDSN(cfg.DSN); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DSN) // pool_* keywords are accepted, and ignored
	if err != nil {
		return nil, dsnError(cfg.DSN)
	}
	cc := pc.ConnConfig
	if cfg.Password != "" {
		cc.Password = cfg.Password
	}
	dialSettings(&cc.Config)
	if cc.RuntimeParams["application_name"] == "" {
		cc.RuntimeParams["application_name"] = "tidemark-notify"
	}
	l := &Listener{
		conn:      cc,
		pwFile:    cfg.PasswordFile,
		channel:   lc.Channel,
		heartbeat: lc.Heartbeat,
		maxWait:   lc.MaxBackoff,
		maxHold:   lc.MaxHold,
		log:       lc.Logger,
		wake:      make(chan struct{}, 1),
		done:      make(chan struct{}),
	}
	if l.heartbeat <= 0 {
		l.heartbeat = 30 * time.Second
	}
	if l.maxWait <= 0 {
		l.maxWait = 5 * time.Second
	}
	if l.maxHold <= 0 {
		l.maxHold = 250 * time.Millisecond
	}
	// Every notification pgx receives, in WaitForNotification or in the
	// heartbeat's round trip, is taken at once: no queue of pgx's own
	// holds some back from wait's accounting.
	l.conn.OnNotification = l.notified
	if l.log == nil {
		l.log = cfg.logger()
	}
	conn, err := l.connect(ctx)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithCancel(ctx)
	l.cancel = cancel
	l.signal()
	go l.run(lctx, conn)
	return l, nil
}

// Wake receives one value for any number of notifications (or a
// reconnection) since it was last read: connector.Config.Wake.
func (l *Listener) Wake() <-chan struct{} { return l.wake }

// PID is the server process id of the listening connection; 0 while it
// is down.
func (l *Listener) PID() uint32 { return l.pid.Load() }

// Notifications is the number of notifications received so far.
func (l *Listener) Notifications() int64 { return l.notes.Load() }

// Reconnects is the number of times the connection was re-established.
func (l *Listener) Reconnects() int64 { return l.again.Load() }

// Close stops listening and closes the connection, waiting for both.
func (l *Listener) Close() {
	l.cancel()
	<-l.done
}

// notified is the connection's notification handler.
func (l *Listener) notified(_ *pgconn.PgConn, n *pgconn.Notification) {
	if n.Channel == l.channel {
		l.notes.Add(1)
		l.signal()
	}
}

// signal sends a wake-up unless one is already waiting.
func (l *Listener) signal() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// holdPoll is how often hold looks whether the engine took the wake-up.
const holdPoll = 2 * time.Millisecond

// holdable reports whether the listener may hold on conn: whether what a
// read of it brings is all the driver's buffer shows, with nothing kept
// between the socket and it. A TLS connection keeps the records it has
// read beyond the one it returns, so a read would look like no backlog
// while one waits, and holding would leave the listener a record a cycle
// behind the server; there, and on any connection it does not know, the
// listener reads every notification as it comes.
func holdable(conn net.Conn) bool {
	switch conn.(type) {
	case *net.TCPConn, *net.UnixConn:
		return true
	}
	return false
}

// holdBacklog is what a read of the connection brings, in bytes, when
// more queued than one read takes (half the driver's read buffer, some
// hundred notifications): the listener then reads on without holding
// until a read brings less. (A read that ends inside a message is
// followed at once by the read of its rest; this is for one that ends
// between two.)
const holdBacklog = 4096

// hold waits while the wake-up sent last waits for the engine, for at most
// maxHold. The notifications that arrive meanwhile queue on the connection
// (and, once its buffers are full, in the server's notification queue,
// which is bounded and which every notifying commit writes to: hence the
// bound).
func (l *Listener) hold(ctx context.Context) {
	t := time.NewTicker(holdPoll)
	defer t.Stop()
	for end := time.Now().Add(l.maxHold); len(l.wake) > 0 && time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// connect opens the connection and runs LISTEN on the quoted channel.
func (l *Listener) connect(ctx context.Context) (*pgx.Conn, error) {
	// The password file and the TLS files are read for each connection
	// (Config.PasswordFile, renewTLS).
	cc := l.conn.Copy()
	if err := passwordFromFile(l.pwFile, &cc.Config); err != nil {
		return nil, err
	}
	if err := renewTLS(cc); err != nil {
		return nil, err
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+quote(l.channel)); err != nil {
		closeConn(conn)
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "25006" { // read_only_sql_transaction: a standby
			return nil, fmt.Errorf("%w: the server refuses LISTEN (%s): a standby cannot listen, notifications are not replicated; connect to the primary, or turn notifications off", ErrBadConfig, pe.Message)
		}
		return nil, fmt.Errorf("LISTEN: %w", err)
	}
	l.pid.Store(conn.PgConn().PID())
	return conn, nil
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

func (l *Listener) run(ctx context.Context, conn *pgx.Conn) {
	defer close(l.done)
	for {
		err := l.wait(ctx, conn)
		closeConn(conn)
		l.pid.Store(0)
		if ctx.Err() != nil {
			return
		}
		lost := time.Now()
		l.log.Warn("notify: the LISTEN connection was lost; reconnecting (changes are still read at every poll meanwhile)",
			"channel", l.channel, "err", err)
		if conn = l.reconnect(ctx, lost); conn == nil {
			return
		}
		l.again.Add(1)
		l.signal()
	}
}

// reconnect retries connect with capped, jittered backoff until it
// succeeds (nil when ctx ended first).
func (l *Listener) reconnect(ctx context.Context, lost time.Time) *pgx.Conn {
	for attempt := 1; ; attempt++ {
		d := min(100*time.Millisecond<<min(attempt-1, 16), l.maxWait)
		d = d/2 + time.Duration(mrand.Int64N(int64(d/2)+1))
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		// An attempt that reaches something that accepts and never
		// answers (a hung pooler or proxy) gives up after a heartbeat,
		// as a silent connection does, and is tried again.
		actx, cancel := context.WithTimeout(ctx, l.heartbeat)
		conn, err := l.connect(actx)
		cancel()
		if err == nil {
			l.log.Info("notify: LISTEN re-established; a pass follows to read what changed meanwhile",
				"channel", l.channel, "attempts", attempt, "down_for", time.Since(lost).Round(time.Millisecond))
			return conn
		}
		if ctx.Err() != nil {
			return nil
		}
		l.log.Warn("notify: reconnecting failed; retrying", "channel", l.channel, "attempt", attempt, "err", err)
	}
}

// wait forwards notifications as wake-ups until the connection fails or
// ctx ends. A connection silent for a heartbeat is checked with a round
// trip; notifications that arrive meanwhile are taken by notified as
// well. Once it has taken every notification a read of the connection
// brought, it holds (see Listener), unless that read brought a backlog.
func (l *Listener) wait(ctx context.Context, conn *pgx.Conn) error {
	buffered := conn.PgConn().Frontend().ReadBufferLen
	holds := holdable(conn.PgConn().Conn())
	backlog := false // the last read of the connection brought a backlog
	for {
		read := buffered() == 0
		wctx, cancel := context.WithTimeout(ctx, l.heartbeat)
		_, err := conn.WaitForNotification(wctx) // notified took it
		cancel()
		switch {
		case err == nil:
			if read {
				backlog = buffered() >= holdBacklog
			}
			if holds && buffered() == 0 && !backlog {
				l.hold(ctx)
			}
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case wctx.Err() != nil && !conn.IsClosed():
			pctx, cancel := context.WithTimeout(ctx, l.heartbeat)
			err = conn.Ping(pctx)
			cancel()
			if err == nil {
				continue
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("no answer to the heartbeat: %w", err)
		}
		return err
	}
}
