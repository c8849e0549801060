package postgres

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/tidemark/tidemark/connector"
)

var _ connector.Clock = (*Source)(nil)

// A mark is PostgreSQL's proof of what a pass has already seen
// (docs/design.md, "What a pass re-reads"): the oldest transaction id still
// running when the pass began, 64 bits with its epoch, taken before the
// pass reads anything. Every row version written by a transaction below it
// was committed (or aborted) by then, so the pass reads it if it is at or
// above the pass's lower bound; a later pass whose Skip is that mark need
// not return it again, and a version the pass itself reads is Settled. Any
// version written since, or by a transaction still running then, is fresh
// and is read again.
//
// A mark proves what was seen of one relation only. A table replaced under
// its name (a shadow table renamed in, a table with rows attached as a
// partition, a dump restored) holds versions below the mark that no pass
// saw. So the token also names the relation, the oids of the table and its
// partitions read under the configured name when the mark is taken:
// "x3:<xid8>@<oid>,<oid>,...", the table's first (listed again among
// its partition tree's), or, with more than maxMarkOids of them, "x2:<xid8>@<digest>" (a digest of that list; x2 is
// also what earlier releases wrote). A skip or settle mark of another
// relation is not used, with one exception (covers): the same table whose
// partitions since added hold no version below the mark (created, not a
// table with rows attached), or were dropped. An "x1:<xid8>" token (an
// earlier release) names none and is taken as the current relation's.
const (
	markPrefix   = "x3:"
	markPrefixV2 = "x2:"
	markPrefixV1 = "x1:"
	// maxMarkOids bounds the oids a mark lists: a mark goes into every
	// checkpoint, several times.
	maxMarkOids = 256
)

// relation is the relation a mark names: the digest of its oid list, and
// the list when the mark has it. The zero value names none (an x1 mark).
type relation struct {
	digest string
	oids   []string
}

func relationOf(oids string) relation {
	r := relation{digest: relationDigest(oids)}
	if oids != "" {
		r.oids = strings.Split(oids, ",")
	}
	return r
}

// renewAfter renews q after the server refused a query, when q is a
// pass's view: the refusal ended its transaction, and the page after it
// reads in a new one.
func renewAfter(ctx context.Context, q querier, err error) {
	var pgErr *pgconn.PgError
	if v, ok := q.(*passView); ok && errors.As(err, &pgErr) {
		_ = v.renew(ctx) // if this fails too, so does the page
	}
}

// markSQL reads the oldest running transaction id of the current snapshot
// and the relation now under the configured name (%s, a quoted identifier
// as a literal; see markSQLFor): its oid and its partitions', or "" when
// there is none. txid_snapshot_xmin and txid_current_snapshot exist in
// every supported PostgreSQL (pg_snapshot_xmin is their newer name from 13
// on).
const markSQL = `SELECT txid_snapshot_xmin(txid_current_snapshot()), coalesce((SELECT r.oid::oid::text || coalesce((SELECT ',' || string_agg(p.relid::oid::text, ',' ORDER BY p.relid::oid)
		FROM pg_catalog.pg_partition_tree(r.oid) p), '') FROM (SELECT pg_catalog.to_regclass(%s) AS oid) r WHERE r.oid IS NOT NULL), '')`

// markSQLFor is markSQL for the table named ident. The name is a literal,
// not a parameter, so that each session plans the statement once, as
// signatureSQL.
func markSQLFor(ident string) string { return fmt.Sprintf(markSQL, quoteLiteral(ident)) }

// Mark returns the token of a pass about to start, or "" for a view or a
// foreign table (no row versions to compare).
func (s *Source) Mark(ctx context.Context) (string, error) {
	sh := s.shape()
	if !sh.q.marks {
		return "", nil
	}
	var x int64
	var rel string
	if err := s.pool.QueryRow(ctx, sh.q.mark).Scan(&x, &rel); err != nil {
		return "", fmt.Errorf("read the oldest running transaction: %w", err)
	}
	return formatMark(x, rel), nil
}

// relationDigest is the relation part of a mark: a digest of the oids
// markSQL lists (FNV-1a, 64 bits, in hex).
func relationDigest(oids string) string {
	h := fnv.New64a()
	h.Write([]byte(oids))
	return strconv.FormatUint(h.Sum64(), 16)
}

// Now reads the server's clock (clock_timestamp(), not the transaction
// start), for the watermark cap.
func (s *Source) Now(ctx context.Context) (time.Time, error) {
	var t time.Time
	if err := s.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t); err != nil {
		return time.Time{}, fmt.Errorf("read the database clock: %w", err)
	}
	return t.UTC(), nil
}

func formatMark(x int64, oids string) string {
	if oids != "" && strings.Count(oids, ",") < maxMarkOids {
		return markPrefix + strconv.FormatInt(x, 10) + "@" + oids
	}
	return markPrefixV2 + strconv.FormatInt(x, 10) + "@" + relationDigest(oids)
}

// parseMark returns a mark's transaction id and relation (the zero
// relation for an x1 mark, which names none).
func parseMark(m string) (int64, relation, error) {
	xs, name := "", ""
	var rel relation
	switch {
	case strings.HasPrefix(m, markPrefix), strings.HasPrefix(m, markPrefixV2):
		var found bool
		if xs, name, found = strings.Cut(m[len(markPrefix):], "@"); !found || name == "" {
			return 0, rel, badCheckpoint(fmt.Errorf("mark %q from the checkpoint names no relation", m))
		}
		if strings.HasPrefix(m, markPrefixV2) {
			rel.digest = name
		} else {
			for o := range strings.SplitSeq(name, ",") {
				if n, err := strconv.ParseUint(o, 10, 32); err != nil || strconv.FormatUint(n, 10) != o {
					return 0, rel, badCheckpoint(fmt.Errorf("mark %q from the checkpoint lists %q, not a relation oid", m, o))
				}
			}
			rel = relationOf(name)
		}
	default:
		var ok bool
		if xs, ok = strings.CutPrefix(m, markPrefixV1); !ok {
			return 0, rel, badCheckpoint(fmt.Errorf("mark %q from the checkpoint is not a PostgreSQL-source mark; it was written by another source or corrupted", m))
		}
	}
	x, err := strconv.ParseInt(xs, 10, 64)
	if err != nil || x < 0 || strconv.FormatInt(x, 10) != xs {
		return 0, rel, badCheckpoint(fmt.Errorf("mark %q from the checkpoint is not a transaction id", m))
	}
	return x, rel, nil
}

// provable reports whether an earlier pass's mark k, of relation krel,
// proves anything about the versions a pass with mark m reads from
// relation rel: not above m (else another database), less than maxMarkAge
// older, of a relation it covers.
func (s *Source) provable(ctx context.Context, q querier, m int64, rel relation, k int64, krel relation) bool {
	return k <= m && m-k < maxMarkAge && s.covers(ctx, q, rel, k, krel)
}

// covers reports whether mark k of relation old proves what was seen of
// relation cur (the current pass's): the same relation, or one names none;
// or, both listing their oids, the same table (first oid) whose partitions
// since added hold no version below k. Partitions dropped since take
// their rows with them, and a partition created after the mark holds only
// versions of transactions that began after it, so none below k; a table
// with such rows attached as a partition was never seen, and neither was
// anything of another table. The answer for an added partition is a scan
// of it (for a version below k) on q, the page's querier (a pass's view
// holds the only connection of a pool of one), kept for the pair of
// relations and k; q nil answers no.
func (s *Source) covers(ctx context.Context, q querier, cur relation, k int64, old relation) bool {
	if cur.digest == "" || old.digest == "" || cur.digest == old.digest {
		return true
	}
	if cur.oids == nil || old.oids == nil || cur.oids[0] != old.oids[0] {
		return false
	}
	had := make(map[string]bool, len(old.oids))
	for _, o := range old.oids {
		had[o] = true
	}
	var added []string
	for _, o := range cur.oids {
		if !had[o] {
			had[o] = true
			added = append(added, o)
		}
	}
	if len(added) == 0 || q == nil {
		return len(added) == 0
	}
	key := old.digest + "|" + strconv.FormatInt(k, 10) + "|" + cur.digest
	s.coverMu.Lock()
	ok, known := s.covered[key]
	s.coverMu.Unlock()
	if known {
		return ok
	}
	ok = true
	for _, o := range added {
		// An empty partition (one created ahead of time, as pg_partman
		// does) holds no version at all; its size needs no privilege on
		// it, which a role with SELECT on the table only lacks (CREATE
		// TABLE ... PARTITION OF copies no grants). Else its rows are
		// read, which needs that privilege.
		var name string
		var size int64
		if err := q.QueryRow(ctx, "SELECT $1::oid::regclass::text, pg_catalog.pg_relation_size($1::oid)", o).Scan(&name, &size); err != nil {
			renewAfter(ctx, q, err)
			return false // not known: asked again
		}
		if size == 0 {
			continue
		}
		var old bool
		if err := q.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM ONLY "+name+" WHERE NOT "+freshOf("$1::bigint")+")", k&0xffffffff).Scan(&old); err != nil {
			renewAfter(ctx, q, err)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "42501" {
				return false // not known: asked again
			}
			old = true // may not read it: not proven
		}
		if old {
			ok = false
			break
		}
	}
	s.coverMu.Lock()
	if len(s.covered) >= 64 {
		clear(s.covered)
	}
	if s.covered == nil {
		s.covered = map[string]bool{}
	}
	s.covered[key] = ok
	s.coverMu.Unlock()
	return ok
}

// marks returns the page query's skip parameter (nil = no skip) and the
// mark modulo 2^32 that flags a version Settled (nil = no Settled flags)
// for req: req.Settle when set, else the current pass's mark.
func (s *Source) marks(ctx context.Context, q querier, sh *shape, req connector.PageRequest) (skip any, mark *int64, err error) {
	if !sh.q.marks || req.Mark == "" {
		return nil, nil, nil
	}
	m, rel, err := parseMark(req.Mark)
	if err != nil {
		return nil, nil, err
	}
	settle, settles := m, true
	if req.Settle != "" {
		var srel relation
		if settle, srel, err = parseMark(req.Settle); err != nil {
			return nil, nil, err
		}
		// A settle mark above the pass's own is from another database
		// (see below), one too old cannot be compared (see maxMarkAge),
		// and one of another relation proves nothing here: the next
		// full pass will skip nothing, so nothing read now is settled.
		settles = s.provable(ctx, q, m, rel, settle, srel)
	}
	s32 := &settle
	*s32 &= 0xffffffff
	if !settles {
		s32 = nil
	}
	if req.Skip == "" {
		return nil, s32, nil
	}
	k, krel, err := parseMark(req.Skip)
	if err != nil {
		return nil, nil, err
	}
	if !s.covers(ctx, q, rel, k, krel) {
		// The table was replaced since that pass: what it saw was
		// another relation's.
		s.warnOnce(fmt.Sprintf("the table under %s is not the one the last pass read (replaced or restored since, or a partition holding older rows attached, or a new partition this role may not read): re-reading the window without skipping; rows the last pass settled may be published again", sh.tbl.ident))
		if req.Settle != "" {
			s32 = nil
		}
		return nil, s32, nil
	}
	if k > m {
		// Transaction ids went backwards between two passes: this is not
		// the database the earlier pass read (a restore, a new cluster).
		// Nothing it saw is proven here, so nothing is skipped.
		s.warnOnce(fmt.Sprintf("transaction ids went backwards since the last pass (mark %d, now %d): this looks like another database (restored or rebuilt); re-reading the window without skipping", k, m))
		if req.Settle != "" {
			s32 = nil // the settle mark is from that database too
		}
		return nil, s32, nil
	}
	if m-k >= maxMarkAge {
		s.warnOnce(fmt.Sprintf("the last pass's mark is %d transaction ids old (mark %d, now %d): too old to compare modulo 2^32; re-reading the window without skipping", m-k, k, m))
		return nil, s32, nil
	}
	return k & 0xffffffff, s32, nil
}

// steps returns the page query's step parameters for req (nil, nil = no
// steps): the lower bounds of req.Steps, ascending, and their marks
// modulo 2^32. A step is used on the terms of a skip mark (see marks): of
// the current relation, not above the pass's own mark, less than
// maxMarkAge older. A step that is not is left out with every step before
// it, whose rows go to the skip mark: the pass reads them again, which
// costs only the re-read. (Left out alone, its rows would go to the step
// before it, whose proof that a key's version was published does not make
// the topic current when the head pass in between read another relation
// and published its content.)
func (s *Source) steps(ctx context.Context, q querier, sh *shape, req connector.PageRequest) (lows, marks any, err error) {
	if !sh.q.marks || req.Mark == "" || len(req.Steps) == 0 {
		return nil, nil, nil
	}
	m, rel, err := parseMark(req.Mark)
	if err != nil {
		return nil, nil, err
	}
	var ls []time.Time
	var ms []int64
	for _, st := range req.Steps {
		k, krel, err := parseMark(st.Mark)
		if err != nil {
			return nil, nil, err
		}
		if st.Since.IsZero() || !s.provable(ctx, q, m, rel, k, krel) {
			ls, ms = ls[:0], ms[:0]
			continue
		}
		if len(ls) > 0 && st.Since.Before(ls[len(ls)-1]) {
			return nil, nil, fmt.Errorf("steps out of order: %s after %s", st.Since, ls[len(ls)-1])
		}
		ls, ms = append(ls, st.Since), append(ms, k&0xffffffff)
	}
	if len(ls) == 0 {
		return nil, nil, nil
	}
	return ls, ms, nil
}

// maxMarkAge bounds how many transaction ids older than the pass's own
// mark a skip or settle mark may be. Row versions carry their xid modulo
// 2^32 and are compared within 2^31 of a mark; a mark 2^31 ids old would
// call the newest versions old, and skip them. Versions a pass reads may
// be newer than its own mark, so the bound leaves them 2^30 ids of room.
// An older mark (a connector stopped for days on a busy database) skips
// nothing: the window is read again, and the dedupe set drops what was
// already published.
const maxMarkAge = 1 << 30

// isFresh is fresh's test in Go: whether a version written by transaction
// xmin (modulo 2^32) may be returned by a pass whose skip mark is x32.
func isFresh(xmin, x32 int64) bool {
	if xmin <= 2 {
		return false
	}
	d := xmin - x32
	return d >= 0 && d <= 2147483647 || d < -2147483648
}

// xminOf decodes the xmin column (xid: 4 bytes in binary, or text).
func xminOf(v []byte, text bool) (int64, error) {
	if v == nil {
		return 0, errors.New("NULL")
	}
	if text {
		return strconv.ParseInt(string(v), 10, 64)
	}
	if len(v) != 4 {
		return 0, fmt.Errorf("%d bytes in binary, want 4", len(v))
	}
	return int64(binary.BigEndian.Uint32(v)), nil
}

func (s *Source) warnOnce(msg string) {
	if s.warned.CompareAndSwap(false, true) {
		s.cfg.logger().Warn(msg)
	}
}
