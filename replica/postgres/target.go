package postgres

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	source "github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/replica"
)

// Target is a replica.Store backed by a PostgreSQL table. Each Apply is one
// database transaction: the batch is copied into a temporary staging table,
// tombstoned ids are deleted, the rest is upserted with INSERT ... ON
// CONFLICT DO UPDATE, and the positions are written to the offsets table.
// Apply calls must not run concurrently.
type Target struct {
	cfg     Config
	pool    *pgxpool.Pool
	ident   string // "schema"."table"
	offsets string // "schema"."offsets table"
	lockKey string

	mu     sync.Mutex
	exists bool
	id     targetColumn
	cols   []targetColumn // written columns, id excluded
	byName map[string]int // value member -> index in cols
	// known is the positions this target last read (Positions) or wrote
	// (Apply, Reset); nil after a failed Apply, when they are uncertain.
	known map[int32]int64
	// topicID is the Kafka topic id CheckTopic was given, stored with the
	// positions ("" before, or without one).
	topicID string

	// beforeCommit, when set (tests), runs after every statement of an
	// Apply and before COMMIT; an error aborts the transaction.
	beforeCommit func(context.Context) error
}

var (
	_ replica.Store        = (*Target)(nil)
	_ replica.Resetter     = (*Target)(nil)
	_ replica.TopicChecker = (*Target)(nil)
)

// Open connects to the target database, creates the offsets table when
// missing, and creates (cfg.Columns set) or checks the target table.
// Errors about the table's shape wrap ErrSchema.
func Open(ctx context.Context, cfg Config) (*Target, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	cfg = cfg.withDefaults()
	pc, err := pgxpool.ParseConfig(cfg.DSN)
	if err != nil {
		return nil, fmt.Errorf("target dsn: %w", err) // pgconn redacts the password
	}
	source.SetCredentials(pc, source.Config{PasswordFile: cfg.PasswordFile})
	pc.ConnConfig.RuntimeParams["timezone"] = "UTC"
	pc.ConnConfig.RuntimeParams["datestyle"] = "ISO"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("connect to target: %w", err)
	}
	t := &Target{cfg: cfg, pool: pool}
	if err := t.open(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return t, nil
}

func (t *Target) open(ctx context.Context) error {
	if t.cfg.Schema == "" {
		if err := t.pool.QueryRow(ctx, "SELECT current_schema()").Scan(&t.cfg.Schema); err != nil {
			return fmt.Errorf("current schema of the target: %w", err)
		}
	}
	t.ident = quote(t.cfg.Schema, t.cfg.Table)
	t.offsets = quote(t.cfg.Schema, t.cfg.OffsetsTable)
	t.lockKey = "tidemark replica " + t.cfg.Schema + "." + t.cfg.Table
	if _, err := t.pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+t.offsets+` (
		target_table text NOT NULL,
		topic text NOT NULL,
		partition integer NOT NULL,
		next_offset bigint NOT NULL,
		updated_at timestamptz NOT NULL DEFAULT now(),
		topic_id text,
		PRIMARY KEY (target_table, topic, partition))`); err != nil {
		return fmt.Errorf("create offsets table %s: %w", t.offsets, err)
	}
	// Tables created before positions kept the topic's id get the column,
	// once: ALTER TABLE needs ownership (even with IF NOT EXISTS) and locks
	// the table every target shares.
	var has bool
	if err := t.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass AND attname = 'topic_id' AND NOT attisdropped)`,
		t.offsets).Scan(&has); err != nil {
		return fmt.Errorf("read the columns of the offsets table %s: %w", t.offsets, err)
	}
	if !has {
		if _, err := t.pool.Exec(ctx, `ALTER TABLE `+t.offsets+` ADD COLUMN IF NOT EXISTS topic_id text`); err != nil {
			return fmt.Errorf("add column topic_id to the offsets table %s (run the replica once as the table's owner, or have the owner run ALTER TABLE %s ADD COLUMN topic_id text): %w", t.offsets, t.offsets, err)
		}
	}
	if len(t.cfg.Columns) > 0 {
		if err := t.create(ctx, t.pool, t.cfg.Columns); err != nil {
			return err
		}
	}
	st, err := t.load(ctx, t.pool)
	if err != nil {
		return err
	}
	t.setState(st)
	return nil
}

// Close closes the connection pool.
func (t *Target) Close() { t.pool.Close() }

// Ident is the quoted target table name.
func (t *Target) Ident() string { return t.ident }

// tableState is what Apply needs to know about the target table.
type tableState struct {
	exists bool
	id     targetColumn
	cols   []targetColumn
}

func (t *Target) setState(st tableState) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.exists, t.id, t.cols = st.exists, st.id, st.cols
	t.byName = make(map[string]int, len(st.cols))
	for i, c := range st.cols {
		t.byName[c.name] = i
	}
}

// load reads and checks the target table.
func (t *Target) load(ctx context.Context, q querier) (tableState, error) {
	cat, err := readColumns(ctx, q, t.cfg.Schema, t.cfg.Table)
	if err != nil {
		return tableState{}, err
	}
	if len(cat) == 0 {
		return tableState{}, nil
	}
	st := tableState{exists: true}
	var errs []error
	byName := map[string]catalogColumn{}
	for _, c := range cat {
		byName[c.name] = c
	}
	idc, ok := byName[t.cfg.IDColumn]
	if !ok {
		errs = append(errs, fmt.Errorf("it has no id column %q for the record keys", t.cfg.IDColumn))
	} else {
		st.id = toTarget(idc)
		var unique bool
		if err := q.QueryRow(ctx, `
			SELECT EXISTS (
				SELECT 1 FROM pg_catalog.pg_index i
				JOIN pg_catalog.pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
				WHERE i.indrelid = $1::regclass AND i.indisunique AND i.indimmediate AND i.indisvalid AND i.indnkeyatts = 1
				  AND i.indpred IS NULL AND i.indexprs IS NULL AND a.attname = $2)`,
			t.ident, t.cfg.IDColumn).Scan(&unique); err != nil {
			return tableState{}, fmt.Errorf("read indexes of %s: %w", t.ident, err)
		}
		if !unique {
			errs = append(errs, fmt.Errorf("id column %q has no unique index that is valid and not deferrable (upserts need one; ON CONFLICT cannot use a deferrable or invalid one): ALTER TABLE %s ADD PRIMARY KEY (%s)",
				t.cfg.IDColumn, t.ident, quote(t.cfg.IDColumn)))
		}
	}
	if len(t.cfg.Columns) == 0 {
		for _, c := range cat {
			if c.name != t.cfg.IDColumn {
				st.cols = append(st.cols, toTarget(c))
			}
		}
	} else {
		wanted := map[string]bool{}
		for _, sc := range t.cfg.Columns {
			wanted[sc.Name] = true
			c, ok := byName[sc.Name]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("missing column %q (source type %s): ALTER TABLE %s ADD COLUMN %s %s",
					sc.Name, sc.Type, t.ident, quote(sc.Name), sc.Type))
				continue
			case !compatible(sc.Type, c.typ):
				errs = append(errs, fmt.Errorf("column %q: source type %s does not fit target type %s", sc.Name, sc.Type, c.typ))
				continue
			}
			if sc.Name != t.cfg.IDColumn {
				st.cols = append(st.cols, toTarget(c))
			}
		}
		for _, c := range cat {
			if !wanted[c.name] && c.notNull && c.name != t.cfg.IDColumn {
				var hasDefault bool
				_ = q.QueryRow(ctx, `SELECT atthasdef FROM pg_catalog.pg_attribute WHERE attrelid = $1::regclass AND attname = $2`, t.ident, c.name).Scan(&hasDefault)
				if !hasDefault {
					errs = append(errs, fmt.Errorf("column %q is NOT NULL without a default and not in the source: inserts would fail", c.name))
				}
			}
		}
	}
	if len(errs) > 0 {
		return tableState{}, fmt.Errorf("%w: %s: %w", ErrSchema, t.ident, errors.Join(errs...))
	}
	return st, nil
}

// create creates the target table with cols (the id column first, as the
// primary key) unless it exists. Types are checked with to_regtype before
// they are spliced into the DDL.
func (t *Target) create(ctx context.Context, q interface {
	querier
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}, cols []Column) error {
	var id *Column
	var defs []string
	for i := range cols {
		c := &cols[i]
		var ok bool
		if err := q.QueryRow(ctx, "SELECT to_regtype($1) IS NOT NULL", c.Type).Scan(&ok); err != nil || !ok {
			return fmt.Errorf("%w: column %q: type %q is not a type on the target server", ErrSchema, c.Name, c.Type)
		}
		if c.Name == t.cfg.IDColumn {
			id = c
			continue
		}
		def := quote(c.Name) + " " + c.Type
		if c.NotNull {
			def += " NOT NULL"
		}
		defs = append(defs, def)
	}
	idType := "text"
	if id != nil {
		idType = id.Type
	}
	defs = append([]string{quote(t.cfg.IDColumn) + " " + idType + " PRIMARY KEY"}, defs...)
	if _, err := q.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+t.ident+" (\n\t"+strings.Join(defs, ",\n\t")+"\n)"); err != nil {
		return fmt.Errorf("create target table %s: %w", t.ident, err)
	}
	return nil
}

// Positions implements replica.Store.
func (t *Target) Positions(ctx context.Context) (map[int32]int64, error) {
	pos, err := positions(ctx, t.pool, t.offsets, t.cfg.Table, t.cfg.Topic, "")
	if err == nil {
		t.mu.Lock()
		t.known = maps.Clone(pos)
		t.mu.Unlock()
	}
	return pos, err
}

func positions(ctx context.Context, q querier, offsets, table, topic, suffix string) (map[int32]int64, error) {
	rows, err := q.Query(ctx, "SELECT partition, next_offset FROM "+offsets+" WHERE target_table = $1 AND topic = $2"+suffix, table, topic)
	if err != nil {
		return nil, fmt.Errorf("read positions: %w", err)
	}
	out := map[int32]int64{}
	var p int32
	var o int64
	_, err = pgx.ForEachRow(rows, []any{&p, &o}, func() error { out[p] = o; return nil })
	if err != nil {
		return nil, fmt.Errorf("read positions: %w", err)
	}
	return out, nil
}

// ErrConflict is returned by Apply when the stored positions are not the
// ones this target last read or wrote, or are already past the batch:
// another replica process writes the same target, or rebuilt it.
var ErrConflict = errors.New("another replica has applied past this batch")

// stageRow is one compacted change as staged text.
type stageRow struct {
	change replica.Change
	vals   []*string // per written column; nil = SQL NULL
}

// Apply implements replica.Store.
func (t *Target) Apply(ctx context.Context, batch []replica.Change, pos map[int32]int64) (err error) {
	batch = replica.Compact(batch)
	t.mu.Lock()
	st := tableState{exists: t.exists, id: t.id, cols: t.cols}
	byName, known := t.byName, t.known
	t.mu.Unlock()
	defer func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		if err != nil {
			t.known = nil // a COMMIT that failed may have happened
		} else if t.known != nil {
			maps.Copy(t.known, pos)
		}
	}()

	tx, err := t.lockedTx(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	stored, err := positions(ctx, tx, t.offsets, t.cfg.Table, t.cfg.Topic, " FOR UPDATE")
	if err != nil {
		return err
	}
	first := map[int32]int64{}
	for _, c := range batch {
		if o, ok := first[c.Partition]; !ok || c.Offset < o {
			first[c.Partition] = c.Offset
		}
	}
	for p, next := range pos {
		s, stok := stored[p]
		if known != nil {
			// Another process's rebuild (--from-beginning) empties the
			// table and forgets the positions: a batch applied on top
			// would store positions past everything before it.
			if k, kok := known[p]; kok != stok || s != k {
				return fmt.Errorf("%w: partition %d: the stored position is %s, but this replica last read or wrote %s: another replica process writes the same table, or rebuilt it (--from-beginning)",
					ErrConflict, p, showPos(s, stok), showPos(k, kok))
			}
			continue
		}
		from, ok := first[p]
		if !ok {
			from = next - 1
		}
		if stok && s > from {
			return fmt.Errorf("%w: partition %d is applied up to offset %d, this batch starts at %d", ErrConflict, p, s, from)
		}
	}

	created := false
	if !st.exists && slices.ContainsFunc(batch, func(c replica.Change) bool { return !c.Delete() }) {
		cols, err := t.infer(batch)
		if err != nil {
			return err
		}
		if err := t.create(ctx, tx, cols); err != nil {
			return err
		}
		if st, err = t.load(ctx, tx); err != nil {
			return err
		}
		byName = map[string]int{}
		for i, c := range st.cols {
			byName[c.name] = i
		}
		created = true
	}
	if st.exists && len(batch) > 0 {
		rows, named, err := t.stage(batch, st, byName)
		if err != nil {
			return err
		}
		if len(t.cfg.Columns) == 0 {
			// Without the source's columns, a column no record of the
			// batch names is the target's own: left alone (docs/replica.md).
			st, rows = onlyNamed(st, rows, named)
		}
		if err := t.merge(ctx, tx, st, rows); err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "22") || pgErr.Code == "23502") {
				_ = tx.Rollback(context.WithoutCancel(ctx))
				if ve := t.diagnose(ctx, st, rows, pgErr); ve != nil {
					return ve
				}
			}
			if errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "23") && pgErr.Code != "23502" {
				detail := ""
				if pgErr.Detail != "" {
					detail = " (" + pgErr.Detail + ")"
				}
				return fmt.Errorf("%w: constraint %q of %s: %s%s; the replica mirrors the topic, so a constraint the source does not have can refuse its rows: drop or change it, then run again",
					ErrConstraint, pgErr.ConstraintName, t.ident, pgErr.Message, detail)
			}
			return err
		}
	}
	if len(pos) > 0 {
		ps := slices.Sorted(maps.Keys(pos))
		parts := make([]int32, len(ps))
		offs := make([]int64, len(ps))
		for i, p := range ps {
			parts[i], offs[i] = p, pos[p]
		}
		t.mu.Lock()
		var topicID *string
		if t.topicID != "" {
			id := t.topicID
			topicID = &id
		}
		t.mu.Unlock()
		if _, err := tx.Exec(ctx, `INSERT INTO `+t.offsets+` (target_table, topic, partition, next_offset, topic_id)
			SELECT $1, $2, p, o, $5 FROM unnest($3::int4[], $4::int8[]) AS u(p, o)
			ON CONFLICT (target_table, topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now(),
				topic_id = coalesce(EXCLUDED.topic_id, `+t.offsets+`.topic_id)`,
			t.cfg.Table, t.cfg.Topic, parts, offs, topicID); err != nil {
			return fmt.Errorf("store positions: %w", err)
		}
	}
	if t.beforeCommit != nil {
		if err := t.beforeCommit(ctx); err != nil {
			return err
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	if created {
		t.setState(st)
	}
	return nil
}

// stage converts the batch to text input per written column. A value that
// cannot be converted is a *ValueError before anything is written.
//
// named reports, per column, whether a record of the batch has a member
// for it (null or not).
func (t *Target) stage(batch []replica.Change, st tableState, byName map[string]int) (rows []stageRow, named []bool, err error) {
	rows = make([]stageRow, len(batch))
	named = make([]bool, len(st.cols))
	for i, c := range batch {
		rows[i].change = c
		if c.Delete() {
			continue
		}
		members, err := decodeObject(c.Value)
		if err != nil {
			return nil, nil, &ValueError{ID: c.Key, Partition: c.Partition, Offset: c.Offset, Err: err}
		}
		vals := make([]*string, len(st.cols))
		for _, m := range members {
			if m.name == t.cfg.IDColumn {
				continue // the key is the id
			}
			j, ok := byName[m.name]
			if !ok {
				return nil, nil, &ValueError{ID: c.Key, Column: m.name, Partition: c.Partition, Offset: c.Offset,
					Err: fmt.Errorf("%w: target table %s has no such column", ErrSchema, t.ident)}
			}
			named[j] = true
			if isNull(m.raw) {
				continue
			}
			col := st.cols[j]
			s, err := toText(m.raw, col.kind, col.elem)
			if err != nil {
				return nil, nil, &ValueError{ID: c.Key, Column: m.name, Type: col.typ, Partition: c.Partition, Offset: c.Offset, Err: err}
			}
			vals[j] = &s
		}
		rows[i].vals = vals
	}
	return rows, named, nil
}

// onlyNamed keeps the columns of st that named marks, and their values.
func onlyNamed(st tableState, rows []stageRow, named []bool) (tableState, []stageRow) {
	if !slices.Contains(named, false) {
		return st, rows
	}
	var keep []int
	out := st
	out.cols = nil
	for j, ok := range named {
		if ok {
			keep = append(keep, j)
			out.cols = append(out.cols, st.cols[j])
		}
	}
	for i, r := range rows {
		if r.vals == nil {
			continue
		}
		vals := make([]*string, len(keep))
		for k, j := range keep {
			vals[k] = r.vals[j]
		}
		rows[i].vals = vals
	}
	return out, rows
}

// merge copies rows into a staging table and applies them to the target.
func (t *Target) merge(ctx context.Context, tx pgx.Tx, st tableState, rows []stageRow) error {
	defs := []string{"ord int4", "id text", "del bool"}
	names := []string{"ord", "id", "del"}
	for i := range st.cols {
		defs = append(defs, "c"+strconv.Itoa(i)+" text")
		names = append(names, "c"+strconv.Itoa(i))
	}
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE tidemark_stage ("+strings.Join(defs, ", ")+") ON COMMIT DROP"); err != nil {
		return fmt.Errorf("create staging table: %w", err)
	}
	_, err := tx.CopyFrom(ctx, pgx.Identifier{"tidemark_stage"}, names, pgx.CopyFromSlice(len(rows), func(i int) ([]any, error) {
		r := rows[i]
		vals := make([]any, 3+len(st.cols))
		vals[0], vals[1], vals[2] = int32(i), r.change.Key, r.change.Delete()
		for j := range st.cols {
			if r.vals != nil && r.vals[j] != nil {
				vals[3+j] = *r.vals[j]
			}
		}
		return vals, nil
	}))
	if err != nil {
		return fmt.Errorf("copy into staging table: %w", err)
	}
	id := quote(t.cfg.IDColumn)
	if _, err := tx.Exec(ctx, "DELETE FROM "+t.ident+" t USING tidemark_stage s WHERE s.del AND t."+id+" = s.id::"+castType(st.id.typ)); err != nil {
		return fmt.Errorf("delete tombstoned ids: %w", err)
	}
	targets := []string{id}
	exprs := []string{"s.id::" + castType(st.id.typ)}
	var sets []string
	for i, c := range st.cols {
		targets = append(targets, quote(c.name))
		exprs = append(exprs, "s.c"+strconv.Itoa(i)+"::"+castType(c.typ))
		sets = append(sets, quote(c.name)+" = EXCLUDED."+quote(c.name))
	}
	action := "DO NOTHING"
	if len(sets) > 0 {
		action = "DO UPDATE SET " + strings.Join(sets, ", ")
	}
	if _, err := tx.Exec(ctx, "INSERT INTO "+t.ident+" ("+strings.Join(targets, ", ")+") SELECT "+strings.Join(exprs, ", ")+
		" FROM tidemark_stage s WHERE NOT s.del ORDER BY s.ord ON CONFLICT ("+id+") "+action); err != nil {
		return fmt.Errorf("upsert: %w", err)
	}
	return nil
}

// lockedTx begins a transaction holding the target's advisory lock: one
// writer of the table and its positions at a time. The caller rolls it
// back (after a commit, a no-op).
func (t *Target) lockedTx(ctx context.Context) (pgx.Tx, error) {
	tx, err := t.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext($1))", t.lockKey); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return nil, fmt.Errorf("lock target: %w", err)
	}
	return tx, nil
}

// CheckTopic implements replica.TopicChecker: positions stored for another
// topic id (the topic was deleted and created again under its name) fail
// wrapping replica.ErrPosition; positions stored without one (before topic
// ids were kept) take id.
func (t *Target) CheckTopic(ctx context.Context, id string) error {
	tx, err := t.lockedTx(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	var other *string
	if err := tx.QueryRow(ctx, `SELECT min(topic_id) FROM `+t.offsets+` WHERE target_table = $1 AND topic = $2 AND topic_id IS DISTINCT FROM $3 AND topic_id IS NOT NULL`,
		t.cfg.Table, t.cfg.Topic, id).Scan(&other); err != nil {
		return fmt.Errorf("read the positions' topic id: %w", err)
	}
	if other != nil {
		return fmt.Errorf("%w: the positions in %s belong to topic %s with id %s, but the topic of that name now has id %s: it was deleted and recreated, so its offsets are not the ones applied; rebuild with --from-beginning",
			replica.ErrPosition, t.offsets, t.cfg.Topic, *other, id)
	}
	if _, err := tx.Exec(ctx, `UPDATE `+t.offsets+` SET topic_id = $3 WHERE target_table = $1 AND topic = $2 AND topic_id IS NULL`, t.cfg.Table, t.cfg.Topic, id); err != nil {
		return fmt.Errorf("store the positions' topic id: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	t.mu.Lock()
	t.topicID = id
	t.mu.Unlock()
	return nil
}

// showPos is a stored position for a message.
func showPos(o int64, ok bool) string {
	if !ok {
		return "none"
	}
	return "offset " + strconv.FormatInt(o, 10)
}

// Reset implements replica.Resetter: it empties the target table and
// forgets the positions, in one transaction.
func (t *Target) Reset(ctx context.Context) error {
	tx, err := t.lockedTx(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	t.mu.Lock()
	exists := t.exists
	t.mu.Unlock()
	if exists {
		if _, err := tx.Exec(ctx, "TRUNCATE "+t.ident); err != nil {
			return fmt.Errorf("truncate %s: %w", t.ident, err)
		}
	}
	if _, err := tx.Exec(ctx, "DELETE FROM "+t.offsets+" WHERE target_table = $1 AND topic = $2", t.cfg.Table, t.cfg.Topic); err != nil {
		return fmt.Errorf("clear positions: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.mu.Lock()
		t.known = nil
		t.mu.Unlock()
		return fmt.Errorf("commit reset: %w", err)
	}
	t.mu.Lock()
	t.known = map[int32]int64{}
	t.mu.Unlock()
	return nil
}
