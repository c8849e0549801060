package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// tableInfo describes the benchmark table as loaded.
type tableInfo struct {
	rows       int
	ties       int     // rows per distinct updated_at
	valueBytes float64 // mean octet_length(row_to_json(t)::text)
	heapMB     float64
	loadTime   time.Duration
	shuffled   bool // updated_at unrelated to the heap order
}

// tiesPerTimestamp is how many rows share one updated_at: many ties, so
// page boundaries fall inside tie groups and the id tiebreaker matters.
const tiesPerTimestamp = 50

// createTable creates and loads a table of n rows (~200 bytes of JSON each):
// bigint id, timestamptz updated_at (50 rows per second, so many ties),
// text, numeric, jsonb; index on (updated_at, id); VACUUM ANALYZE; then
// warms the cache (pg_prewarm when available, else a full index walk).
func createTable(ctx context.Context, pool *pgxpool.Pool, name string, n int) (tableInfo, error) {
	return createTableShaped(ctx, pool, name, n, false)
}

// createTableShaped is createTable; with shuffled, updated_at is unrelated
// to the heap order: row g gets the timestamp of position g*7919 mod n (a
// permutation of 0..n-1 when 7919, a prime, does not divide n), so a walk
// in (updated_at, id) order reads the heap at random, as on a table whose
// rows are updated in no particular order.
func createTableShaped(ctx context.Context, pool *pgxpool.Pool, name string, n int, shuffled bool) (tableInfo, error) {
	pos := "g"
	if shuffled {
		pos = fmt.Sprintf("(g * 7919 %%%% %d)", n) // %% in the format below
	}
	start := time.Now()
	t := pgx.Identifier{name}.Sanitize()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return tableInfo{}, err
	}
	defer conn.Release()
	for _, sql := range []string{
		"SET maintenance_work_mem = '256MB'",
		"DROP TABLE IF EXISTS " + t,
		"CREATE TABLE " + t + ` (
			id         bigint      NOT NULL,
			updated_at timestamptz NOT NULL,
			note       text        NOT NULL,
			amount     numeric(12,2) NOT NULL,
			attrs      jsonb       NOT NULL)`,
		fmt.Sprintf(`INSERT INTO %s
			SELECT g,
			       timestamptz '2024-01-01 00:00:00+00' + (`+pos+` / %d) * interval '1 second',
			       'Order ' || (g * 7919 %% 1000003) || ' for customer ' || (g %% 50000) || ', shipped by ' || (ARRAY['road','rail','air','sea'])[g %% 4 + 1],
			       (g %% 100000) / 100.0 + 0.01,
			       jsonb_build_object('plan', (ARRAY['free','pro','team','enterprise'])[g %% 4 + 1], 'seats', g %% 50,
			                          'region', 'eu-west-1', 'score', g %% 997, 'tags', jsonb_build_array('a', 'b'))
			FROM generate_series(1::bigint, %d) g`, t, tiesPerTimestamp, n),
		"ALTER TABLE " + t + " ADD PRIMARY KEY (id)",
		"CREATE INDEX ON " + t + " (updated_at, id)",
		"VACUUM ANALYZE " + t,
	} {
		if _, err := conn.Exec(ctx, sql); err != nil {
			return tableInfo{}, fmt.Errorf("%s: %w", firstLine(sql), err)
		}
	}
	warm(ctx, conn.Conn(), name)
	info := tableInfo{rows: n, ties: tiesPerTimestamp, loadTime: time.Since(start), shuffled: shuffled}
	var heap int64
	err = conn.QueryRow(ctx, `SELECT (SELECT avg(octet_length(row_to_json(s)::text)) FROM (SELECT * FROM `+t+` LIMIT 10000) s)::float8,
		pg_table_size($1::regclass)`, t).Scan(&info.valueBytes, &heap)
	if err != nil {
		return tableInfo{}, err
	}
	info.heapMB = float64(heap) / (1 << 20)
	fmt.Printf("      loaded in %s: %.0f MiB heap, %.0f bytes of row_to_json per row, %d rows per updated_at\n",
		info.loadTime.Round(100*time.Millisecond), info.heapMB, info.valueBytes, info.ties)
	return info, nil
}

// warm reads the table and its indexes into the caches.
func warm(ctx context.Context, c *pgx.Conn, name string) {
	if _, err := c.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_prewarm"); err == nil {
		_, err = c.Exec(ctx, `SELECT pg_prewarm(c.oid) FROM pg_class c
			WHERE c.oid = $1::regclass OR c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = $1::regclass)`,
			pgx.Identifier{name}.Sanitize())
		if err == nil {
			return
		}
	}
	t := pgx.Identifier{name}.Sanitize()
	_, _ = c.Exec(ctx, "SELECT count(*), sum(length(note)) FROM (SELECT * FROM "+t+" ORDER BY updated_at, id) s")
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i] + " ..."
	}
	return s
}

// pgCPU measures the CPU time of a local PostgreSQL server: the postmaster
// and every live child (backends and background workers), plus the
// postmaster's cutime/cstime, which holds the time of children that
// exited (a backend that disconnects is reaped by the postmaster). Read
// from /proc, so only for a server on this machine.
type pgCPU struct {
	postmaster int
	tick       float64
}

func newPGCPU(ctx context.Context, pool *pgxpool.Pool) (*pgCPU, error) {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return nil, err
	}
	f, err := procStat(backend)
	if err != nil {
		return nil, fmt.Errorf("the server's processes are not visible in /proc (remote server?): %w", err)
	}
	pm, _ := strconv.Atoi(f[1])
	if pm <= 1 {
		return nil, fmt.Errorf("backend %d has no postmaster parent", backend)
	}
	c := &pgCPU{postmaster: pm, tick: 100} // USER_HZ is 100 on Linux
	if _, err := c.sample(); err != nil {
		return nil, err
	}
	return c, nil
}

// procStat returns the fields of /proc/<pid>/stat after the command name:
// [0] state, [1] ppid, ... [11] utime, [12] stime, [13] cutime, [14] cstime.
func procStat(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("bad /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 15 {
		return nil, fmt.Errorf("short /proc/%d/stat", pid)
	}
	return f, nil
}

func ticks(f []string, idx ...int) int64 {
	var n int64
	for _, i := range idx {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		n += v
	}
	return n
}

// sample returns the server's cumulative CPU time.
func (c *pgCPU) sample() (time.Duration, error) {
	if c == nil {
		return 0, nil
	}
	f, err := procStat(c.postmaster)
	if err != nil {
		return 0, err
	}
	total := ticks(f, 11, 12, 13, 14)
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	pm := strconv.Itoa(c.postmaster)
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == c.postmaster {
			continue
		}
		f, err := procStat(pid)
		if err != nil || f[1] != pm {
			continue
		}
		total += ticks(f, 11, 12)
	}
	return time.Duration(float64(total) / c.tick * float64(time.Second)), nil
}

// machineBusy is the CPU time every process on this machine has used
// since boot (/proc/stat: user + nice + system + irq + softirq).
func machineBusy() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return 0
	}
	var t int64
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		t += v
	}
	return time.Duration(float64(t) / 100 * float64(time.Second))
}

// machine describes where the figures were measured.
type machine struct {
	cores    int
	cpuModel string
	memory   string
	kernel   string
	postgres string
	goVer    string
	broker   string
	date     string
}

func describeMachine(ctx context.Context, pool *pgxpool.Pool) (machine, error) {
	m := machine{cores: runtime.NumCPU(), goVer: runtime.Version(), date: time.Now().UTC().Format("2006-01-02 15:04 MST")}
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&m.postgres); err != nil {
		return m, err
	}
	var sb, fsync, sc string
	_ = pool.QueryRow(ctx, "SELECT current_setting('shared_buffers'), current_setting('fsync'), current_setting('synchronous_commit')").Scan(&sb, &fsync, &sc)
	m.postgres = "PostgreSQL " + m.postgres + " (shared_buffers " + sb + ", fsync " + fsync + ", synchronous_commit " + sc + ")"
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				m.memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
			}
		}
	}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.cpuModel = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.kernel = "Linux " + strings.TrimSpace(string(b))
	}
	return m, nil
}

// pageStat is one EXPLAIN (ANALYZE, BUFFERS) figure.
type pageStat struct {
	query   string // keyset or offset
	depth   string // start, middle, end
	after   int    // rows before the page
	scanned int64  // rows produced by the scan node under the Limit
	buffers int64  // shared hit + read
	ms      float64
	plan    string // node types under the Limit
}

func (p pageStat) line() string {
	return fmt.Sprintf("%-6s %-6s after row %9d: %9d rows scanned, %7d buffers, %9.2f ms (%s)", p.query, p.depth, p.after, p.scanned, p.buffers, p.ms, p.plan)
}

// pageCost explains the page query at three depths. The keyset SQL has the
// exact shape connector/postgres builds (buildQueries, the "next" query
// with every column as the value): SELECT updated_at, id, <columns> ...
// WHERE (updated_at, id) > ($1, $2::text::bigint) ORDER BY updated_at, id
// LIMIT $3. OFFSET is the same SELECT with LIMIT 1000 OFFSET k.
func pageCost(ctx context.Context, pool *pgxpool.Pool, name string, n int) ([]pageStat, error) {
	t := pgx.Identifier{"public", name}.Sanitize()
	sel := `SELECT "updated_at", "id", "id", "updated_at", "note", "amount", "attrs" FROM ` + t
	keyset := sel + ` WHERE ("updated_at", "id") > ($1, $2::text::bigint) ORDER BY "updated_at", "id" LIMIT $3`
	offset := sel + ` ORDER BY "updated_at", "id" LIMIT $1 OFFSET $2`
	const page = 1000
	var out []pageStat
	for _, d := range []struct {
		name  string
		after int
	}{{"start", page}, {"middle", n / 2}, {"end", n - page}} {
		var ts time.Time
		var id int64
		if err := pool.QueryRow(ctx, `SELECT updated_at, id FROM `+t+` ORDER BY updated_at, id OFFSET $1 LIMIT 1`, d.after-1).Scan(&ts, &id); err != nil {
			return nil, fmt.Errorf("cursor at row %d: %w", d.after, err)
		}
		k, err := explain(ctx, pool, keyset, ts, strconv.FormatInt(id, 10), page)
		if err != nil {
			return nil, fmt.Errorf("explain keyset: %w", err)
		}
		k.query, k.depth, k.after = "keyset", d.name, d.after
		o, err := explain(ctx, pool, offset, page, d.after)
		if err != nil {
			return nil, fmt.Errorf("explain offset: %w", err)
		}
		o.query, o.depth, o.after = "offset", d.name, d.after
		out = append(out, k, o)
	}
	return out, nil
}

type planNode struct {
	NodeType    string     `json:"Node Type"`
	ActualRows  float64    `json:"Actual Rows"`
	ActualLoops float64    `json:"Actual Loops"`
	SharedHit   int64      `json:"Shared Hit Blocks"`
	SharedRead  int64      `json:"Shared Read Blocks"`
	Plans       []planNode `json:"Plans"`
}

// explain runs EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) three times and
// keeps the median execution time; rows and buffers do not vary.
func explain(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) (pageStat, error) {
	var st pageStat
	var times []float64
	for range 3 {
		var raw []byte
		if err := pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&raw); err != nil {
			return st, err
		}
		var doc []struct {
			Plan          planNode `json:"Plan"`
			ExecutionTime float64  `json:"Execution Time"`
		}
		if err := json.Unmarshal(raw, &doc); err != nil || len(doc) != 1 {
			return st, fmt.Errorf("parse EXPLAIN output: %v", err)
		}
		root := doc[0].Plan
		if root.NodeType != "Limit" || len(root.Plans) != 1 {
			return st, fmt.Errorf("unexpected plan: %s", raw)
		}
		// Rows scanned: the most rows any node under the Limit produced
		// (the index or heap scan; a Sort above a bitmap scan near the end
		// of the table sorts only what the scan found).
		var shape []string
		var walk func(n planNode)
		walk = func(n planNode) {
			shape = append(shape, n.NodeType)
			st.scanned = max(st.scanned, int64(n.ActualRows*max(n.ActualLoops, 1)))
			for _, c := range n.Plans {
				walk(c)
			}
		}
		walk(root.Plans[0])
		st.plan = strings.Join(shape, " > ")
		st.buffers = root.SharedHit + root.SharedRead
		times = append(times, doc[0].ExecutionTime)
	}
	slices.Sort(times)
	st.ms = times[len(times)/2]
	return st, nil
}
