package main

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/offsets"
)

type latencyResult struct {
	rate    float64 // updates/s achieved
	updates int
	seen    int
	p50     time.Duration
	p99     time.Duration
	max     time.Duration
	poll    time.Duration
	cpu     time.Duration // tidemark, whole continuous run
	rssKB   int64
	// target is the rate asked for, writers the connections that wrote,
	// batch the updates each of their transactions committed.
	target, writers, batch int
	// trigger is the notify trigger's kind (postgres.NotifyKinds), with
	// source.notify.
	trigger string
	// bare marks a loadAlone run with neither trigger nor listener.
	bare bool
	// txns and records are the Kafka transactions tidemark committed and
	// the rows it published from the first update until it stopped (the
	// checkpoint's counters), span the time from the first update until
	// the last one was visible.
	txns, records int64
	span          time.Duration
	// The writers' side (writerStats): their own UPDATE round trips (the
	// statement and its commit), how far behind their schedule they sent
	// them, and the CPU of PostgreSQL (every backend: the writers', and
	// tidemark's) over the time they wrote, in cores.
	wp50, wp99, behind99 time.Duration
	pgCores              float64 // -1 when not measured (cores)
	// notified is what the listener read in loadAlone.
	notified int64
	// benchCores is the bench process's CPU over that time, in cores: the
	// writers' client side, and the consumer that reads the topic back (in
	// loadAlone, the listener).
	benchCores float64
}

// tps is transactions per second over the span.
func (l latencyResult) tps() float64 {
	if l.span <= 0 {
		return 0
	}
	return float64(l.txns) / l.span.Seconds()
}

// perTxn is records per transaction.
func (l latencyResult) perTxn() float64 {
	if l.txns == 0 {
		return 0
	}
	return float64(l.records) / float64(l.txns)
}

// latencySpec is one latency run: the update rate, the writer connections
// sharing it, and extra arguments of `tidemark run` (notify.go).
type latencySpec struct {
	rate, writers int
	// batch is the updates of one transaction (1 when 0): a writer
	// commits batch distinct rows in one UPDATE.
	batch int
	args  []string
}

func (l latencyResult) line() string {
	return fmt.Sprintf("%d updates at %.0f/s: %d visible; commit -> visible read_committed p50 %s, p99 %s, max %s (poll %s)",
		l.updates, l.rate, l.seen, ms(l.p50), ms(l.p99), ms(l.max), l.poll)
}

func ms(d time.Duration) string { return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond)) }

// cores formats a CPU share in cores, n/a when not measured (-1).
func cores(c float64) string {
	if c < 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f", c)
}

// msFine is ms with a decimal below 10 ms (a round trip on loopback).
func msFine(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
	return ms(d)
}

// write is one update: its row, its slot in the writers' schedule, when
// its statement was sent and when its commit returned.
type write struct {
	id        int64
	slot      time.Time
	sent      time.Time
	committed time.Time
	visible   time.Time
}

// tracker matches writes with records. A record for id carrying sequence
// number s makes every write to id with a number <= s visible (a later
// update of the same row supersedes an earlier one).
type tracker struct {
	mu      sync.Mutex
	writes  []write         // by sequence number - 1
	pending map[int64][]int // id -> sequence numbers not yet visible, ascending
	records int64
}

func (t *tracker) add(id int64) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.writes = append(t.writes, write{id: id})
	seq := len(t.writes)
	t.pending[id] = append(t.pending[id], seq)
	return seq
}

func (t *tracker) committed(seq int, slot, sent, at time.Time) {
	t.mu.Lock()
	w := &t.writes[seq-1]
	w.slot, w.sent, w.committed = slot, sent, at
	t.mu.Unlock()
}

// writerStats sets the writers' side of res from the writes: their UPDATE
// round trips (p50, p99) and how far behind their schedule they sent them
// (p99).
func (t *tracker) writerStats(res *latencyResult) {
	// Copied under the lock and sorted outside it: the consumer that
	// marks records visible takes the lock too.
	t.mu.Lock()
	var rt, behind []time.Duration
	for _, w := range t.writes {
		if w.committed.IsZero() {
			continue
		}
		rt = append(rt, w.committed.Sub(w.sent))
		behind = append(behind, max(w.sent.Sub(w.slot), 0))
	}
	t.mu.Unlock()
	if len(rt) == 0 {
		return
	}
	slices.Sort(rt)
	slices.Sort(behind)
	res.wp50, res.wp99, res.behind99 = rt[len(rt)/2], rt[min(len(rt)-1, len(rt)*99/100)], behind[min(len(behind)-1, len(behind)*99/100)]
}

func (t *tracker) seen(id int64, seq int, at time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.pending[id]
	i := 0
	for ; i < len(p) && p[i] <= seq; i++ {
		t.writes[p[i]-1].visible = at
	}
	if i > 0 {
		t.pending[id] = p[i:]
	}
}

func (t *tracker) count() (records int64, open int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, p := range t.pending {
		open += len(p)
	}
	return t.records, open
}

// latencyRun starts tidemark continuously on table, waits for the initial
// load to be visible, then updates rows at o.rate per second for
// o.latency, each update setting updated_at = clock_timestamp() and a
// sequence number in attrs.seq, and measures commit -> visible.
func (b *bench) latencyRun(ctx context.Context, table string) (latencyResult, error) {
	return b.latencyRunSpec(ctx, table, latencySpec{rate: b.opts.rate, writers: 1})
}

// latencyRunSpec is latencyRun at spec.rate updates per second, shared by
// spec.writers connections, with spec.args added to `tidemark run`.
func (b *bench) latencyRunSpec(ctx context.Context, table string, spec latencySpec) (latencyResult, error) {
	spec.writers = max(spec.writers, 1)
	res := latencyResult{poll: time.Second, target: spec.rate, writers: spec.writers, batch: max(spec.batch, 1)}
	t, n, err := b.freshTable(ctx, table)
	if err != nil {
		return res, err
	}
	r, err := b.newRun(table, 0)
	if err != nil {
		return res, err
	}
	defer b.k.drop(context.WithoutCancel(ctx), r.topic, r.offsets, r.ledger)
	p, err := b.start(r, append([]string{"run"}, spec.args...)...)
	if err != nil {
		return res, err
	}
	defer p.stop(30 * time.Second)

	// The consumer subscribes once tidemark has created the topic (a
	// consumer never creates it, but waiting keeps its metadata fresh).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		td, err := b.k.adm.ListTopics(ctx, r.topic)
		if err == nil && td.Has(r.topic) && td[r.topic].Err == nil {
			break
		}
		if time.Now().After(deadline) || p.exited() {
			return res, fmt.Errorf("tidemark did not create %s (log %s):\n%s", r.topic, r.log, tail(r.log, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	tr := &tracker{pending: map[int64][]int{}}
	cl, err := kgo.NewClient(kgo.SeedBrokers(b.k.addrs...), kgo.ConsumeTopics(r.topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.FetchMaxWait(100*time.Millisecond))
	if err != nil {
		return res, err
	}
	cctx, stopConsumer := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer cl.Close()
		var v struct {
			Attrs struct {
				Seq int `json:"seq"`
			} `json:"attrs"`
		}
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			now := time.Now()
			fs.EachRecord(func(rec *kgo.Record) {
				tr.mu.Lock()
				tr.records++
				tr.mu.Unlock()
				if rec.Value == nil {
					return
				}
				v.Attrs.Seq = 0
				if json.Unmarshal(rec.Value, &v) != nil || v.Attrs.Seq == 0 {
					return
				}
				id, err := strconv.ParseInt(string(rec.Key), 10, 64)
				if err == nil {
					tr.seen(id, v.Attrs.Seq, now)
				}
			})
		}
	}()
	defer func() { stopConsumer(); wg.Wait() }()

	// Initial load first: the latency is about the incremental walk.
	deadline = time.Now().Add(5 * time.Minute)
	for {
		recs, _ := tr.count()
		if recs >= n {
			break
		}
		if time.Now().After(deadline) || p.exited() {
			return res, fmt.Errorf("initial load of %d rows not visible (%d records; log %s):\n%s", n, recs, r.log, tail(r.log, 20))
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // let the first pass end and the poll loop start
	store := offsets.NewStore([]kgo.Opt{kgo.SeedBrokers(b.k.addrs...)}, r.offsets, r.name)
	cp0, err := store.Load(ctx)
	if err != nil || cp0 == nil {
		return res, fmt.Errorf("checkpoint before the updates: %v (none: %t)", err, cp0 == nil)
	}

	start, err := b.writeMeasured(ctx, t, n, spec, tr, &res)
	if err != nil {
		return res, err
	}
	// Wait for the last updates: two poll intervals and then some.
	deadline = time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if _, open := tr.count(); open == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopConsumer()
	wg.Wait()
	p.stop(30 * time.Second)
	res.cpu, res.rssKB = p.rusage()
	cp1, err := store.Load(ctx)
	if err != nil || cp1 == nil {
		return res, fmt.Errorf("checkpoint after the updates: %v (none: %t)", err, cp1 == nil)
	}
	res.txns = cp1.Counters.Transactions - cp0.Counters.Transactions
	res.records = cp1.Counters.Published - cp0.Counters.Published

	tr.mu.Lock()
	defer tr.mu.Unlock()
	var lat []time.Duration
	for _, w := range tr.writes {
		if !w.visible.IsZero() {
			lat = append(lat, max(w.visible.Sub(w.committed), 0))
			res.span = max(res.span, w.visible.Sub(start))
		}
	}
	res.seen = len(lat)
	if path := os.Getenv("BENCH_LATENCY_DUMP"); path != "" {
		// One line per write, for looking at when the slow ones happened:
		// commit time (Unix ns), commit -> visible (ns, -1 when never seen).
		// One file per rate: FILE.RATE.
		path = fmt.Sprintf("%s.%d", path, spec.rate)
		var sb strings.Builder
		for _, w := range tr.writes {
			d := int64(-1)
			if !w.visible.IsZero() {
				d = int64(max(w.visible.Sub(w.committed), 0))
			}
			fmt.Fprintf(&sb, "%d %d\n", w.committed.UnixNano(), d)
		}
		if err := os.WriteFile(path, []byte(sb.String()), 0o644); err != nil {
			return res, err
		}
	}
	if len(lat) == 0 {
		return res, fmt.Errorf("no update became visible (log %s):\n%s", r.log, tail(r.log, 20))
	}
	slices.Sort(lat)
	res.p50 = lat[len(lat)/2]
	res.p99 = lat[min(len(lat)-1, len(lat)*99/100)]
	res.max = lat[len(lat)-1]
	return res, nil
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// freshTable readies table for a run of writers: it returns its quoted
// name and its rows, once vacuumed. Every run starts from the same table:
// the dead versions of the runs before it would otherwise tax its index
// scans.
func (b *bench) freshTable(ctx context.Context, table string) (t string, n int64, err error) {
	t = pgx.Identifier{table}.Sanitize()
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&n); err != nil {
		return t, 0, err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+t); err != nil {
		return t, 0, fmt.Errorf("vacuum %s before the run: %w", table, err)
	}
	return t, n, nil
}

// writeUpdates has spec.writers connections update rows of the table t (n
// rows, a quoted name) at spec.rate per second for o.latency, each update
// setting updated_at = clock_timestamp() and a sequence number (tr's) in
// attrs.seq. Writer w commits updates w, w+writers, ..., each at its slot
// in the schedule, or at once when behind it. With spec.batch > 1 it
// commits batches of that many distinct rows instead, batch w, w+writers,
// ... It returns when the schedule began and the updates written, once
// every writer has stopped (on the first error, the others stop too).
func (b *bench) writeUpdates(ctx context.Context, t string, n int64, spec latencySpec, tr *tracker) (time.Time, int, error) {
	upd := "UPDATE " + t + " SET updated_at = clock_timestamp(), attrs = jsonb_set(attrs, '{seq}', to_jsonb($2::bigint)) WHERE id = $1"
	updMany := "UPDATE " + t + " SET updated_at = clock_timestamp(), attrs = jsonb_set(attrs, '{seq}', to_jsonb(s.seq)) " +
		"FROM unnest($1::bigint[], $2::bigint[]) AS s(id, seq) WHERE " + t + ".id = s.id"
	total := int(float64(spec.rate) * b.opts.latency.Seconds())
	ids := rand.Perm(int(n))
	every := time.Second / time.Duration(spec.rate)
	batch := max(spec.batch, 1)
	writers := max(spec.writers, 1)
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	var once sync.Once
	var failed error
	fail := func(err error) {
		once.Do(func() { failed = err })
		stop()
	}
	start := time.Now()
	for w := range writers {
		conn, err := b.pool.Acquire(wctx)
		if err != nil {
			fail(err)
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer conn.Release()
			for i := w * batch; i < total && wctx.Err() == nil; i += writers * batch {
				slot := start.Add(time.Duration(i) * every)
				if d := time.Until(slot); d > 0 {
					time.Sleep(d)
				}
				var bid, bseq []int64
				for j := i; j < min(i+batch, total); j++ {
					id := int64(ids[j%len(ids)] + 1)
					bid, bseq = append(bid, id), append(bseq, int64(tr.add(id)))
				}
				sent := time.Now()
				var err error
				if batch == 1 {
					_, err = conn.Exec(wctx, upd, bid[0], bseq[0])
				} else {
					_, err = conn.Exec(wctx, updMany, bid, bseq)
				}
				if err != nil {
					fail(fmt.Errorf("update: %w", err))
					return
				}
				now := time.Now()
				for _, seq := range bseq {
					tr.committed(int(seq), slot, sent, now)
				}
			}
		}()
	}
	wg.Wait()
	if failed == nil && ctx.Err() != nil {
		failed = ctx.Err()
	}
	if failed != nil {
		return start, 0, failed
	}
	return start, total, nil
}

// writeMeasured is writeUpdates, measured into res: the rate reached, the
// writers' side (writerStats) and the CPU of PostgreSQL and of the bench
// process over the time they wrote. It returns when the writers' schedule
// began.
func (b *bench) writeMeasured(ctx context.Context, t string, n int64, spec latencySpec, tr *tracker, res *latencyResult) (time.Time, error) {
	pg0, err0 := b.pgCP.sample()
	self0 := selfCPU()
	start, total, err := b.writeUpdates(ctx, t, n, spec, tr)
	if err != nil {
		return start, err
	}
	wall := time.Since(start)
	pg1, err1 := b.pgCP.sample()
	res.rate, res.updates = float64(total)/wall.Seconds(), total
	// A server whose processes this machine cannot see (DATABASE_URL
	// elsewhere) is not measured: -1, reported as n/a.
	res.pgCores = -1
	if b.pgCP != nil && err0 == nil && err1 == nil {
		res.pgCores = (pg1 - pg0).Seconds() / wall.Seconds()
	}
	res.benchCores = (selfCPU() - self0).Seconds() / wall.Seconds()
	tr.writerStats(res)
	return start, nil
}
