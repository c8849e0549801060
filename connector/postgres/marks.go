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
// its name (a shadow table renamed in, a partition attached, a dump
// restored) holds versions below the mark that no pass saw. So the token
// also names the relation: "x2:<xid8>@<relation>", where relation is a
// digest of the oids of the table and its partitions, read under the
// configured name when the mark is taken. A skip or settle mark of another
// relation is not used. An "x1:<xid8>" token (an earlier release) names
// none and is taken as the current relation's.
const (
	markPrefix   = "x2:"
	markPrefixV1 = "x1:"
)

// markSQL reads the oldest running transaction id of the current snapshot
// and the relation now under the configured name ($1, a quoted identifier):
// its oid and its partitions', or "" when there is none. txid_snapshot_xmin
// and txid_current_snapshot exist in every supported PostgreSQL
// (pg_snapshot_xmin is their newer name from 13 on).
const markSQL = `SELECT txid_snapshot_xmin(txid_current_snapshot()), coalesce((SELECT r.oid::oid::text || coalesce((SELECT ',' || string_agg(p.relid::oid::text, ',' ORDER BY p.relid::oid)
		FROM pg_catalog.pg_partition_tree(r.oid) p), '') FROM (SELECT pg_catalog.to_regclass($1) AS oid) r WHERE r.oid IS NOT NULL), '')`

// Mark returns the token of a pass about to start, or "" for a view or a
// foreign table (no row versions to compare).
func (s *Source) Mark(ctx context.Context) (string, error) {
	sh := s.shape()
	if !sh.q.marks {
		return "", nil
	}
	var x int64
	var rel string
	if err := s.pool.QueryRow(ctx, markSQL, sh.tbl.ident).Scan(&x, &rel); err != nil {
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
	return markPrefix + strconv.FormatInt(x, 10) + "@" + relationDigest(oids)
}

// parseMark returns a mark's transaction id and relation digest ("" for
// an x1 mark, which names none).
func parseMark(m string) (int64, string, error) {
	xs, rel := "", ""
	if rest, ok := strings.CutPrefix(m, markPrefix); ok {
		var found bool
		if xs, rel, found = strings.Cut(rest, "@"); !found || rel == "" {
			return 0, "", fmt.Errorf("mark %q from the checkpoint names no relation; reset the connector rather than guess", m)
		}
	} else if xs, ok = strings.CutPrefix(m, markPrefixV1); !ok {
		return 0, "", fmt.Errorf("mark %q from the checkpoint is not a PostgreSQL-source mark; it was written by another source or corrupted: reset the connector rather than guess", m)
	}
	x, err := strconv.ParseInt(xs, 10, 64)
	if err != nil || x < 0 || strconv.FormatInt(x, 10) != xs {
		return 0, "", fmt.Errorf("mark %q from the checkpoint is not a transaction id; reset the connector rather than guess", m)
	}
	return x, rel, nil
}

// provable reports whether an earlier pass's mark k, of relation krel,
// proves anything about the versions a pass with mark m reads from
// relation rel: not above m (else another database), less than maxMarkAge
// older, of the same relation.
func provable(m int64, rel string, k int64, krel string) bool {
	return k <= m && m-k < maxMarkAge && sameRelation(rel, krel)
}

// sameRelation reports whether a mark of relation b may be compared with
// versions of relation a (the current pass's): "" names none.
func sameRelation(a, b string) bool { return a == "" || b == "" || a == b }

// marks returns the page query's skip parameter (nil = no skip) and the
// mark modulo 2^32 that flags a version Settled (nil = no Settled flags)
// for req: req.Settle when set, else the current pass's mark.
func (s *Source) marks(sh *shape, req connector.PageRequest) (skip any, mark *int64, err error) {
	if !sh.q.marks || req.Mark == "" {
		return nil, nil, nil
	}
	m, rel, err := parseMark(req.Mark)
	if err != nil {
		return nil, nil, err
	}
	settle, settles := m, true
	if req.Settle != "" {
		var srel string
		if settle, srel, err = parseMark(req.Settle); err != nil {
			return nil, nil, err
		}
		// A settle mark above the pass's own is from another database
		// (see below), one too old cannot be compared (see maxMarkAge),
		// and one of another relation proves nothing here: the next
		// full pass will skip nothing, so nothing read now is settled.
		settles = provable(m, rel, settle, srel)
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
	if !sameRelation(rel, krel) {
		// The table was replaced since that pass: what it saw was
		// another relation's.
		s.warnOnce(fmt.Sprintf("the table under %s is not the one the last pass read (replaced or restored since): re-reading the window without skipping", sh.tbl.ident))
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
func (s *Source) steps(sh *shape, req connector.PageRequest) (lows, marks any, err error) {
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
		if st.Since.IsZero() || !provable(m, rel, k, krel) {
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
