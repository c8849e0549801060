package connector

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
	"strings"

	"github.com/tidemark/tidemark/schemas"
)

// Digest is the content digest of a published record: the first 64 bits of
// SHA-256 over the operation and the value. Equal digests mean an identical
// record; any content change gives a different digest.
func Digest(r *Row) uint64 { return digest(r.Deleted, r.Value) }

func digest(deleted bool, value []byte) uint64 {
	h := sha256.New()
	if deleted {
		h.Write([]byte{'D'})
	} else {
		h.Write([]byte{'U'})
		h.Write(value)
	}
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

type bEntry struct {
	ts     int64 // updated_at, µs since epoch
	digest uint64
	// A row published in the open transaction keeps its value here and is
	// digested only when it is met again or survives pruning to a commit:
	// during a long pass most entries are pruned first, so most rows never
	// need SHA-256.
	val     []byte
	pending bool
	deleted bool
}

func (e *bEntry) settle() {
	if e.pending {
		e.digest = digest(e.deleted, e.val)
		e.pending, e.val = false, nil
	}
}

// boundary is the dedupe set B (CONTRACT §3): for rows that a later pass may
// read again, the digest of the value last published for them. It is bounded;
// a row that does not fit is counted, and a re-read of it is published again.
type boundary struct {
	m   map[string]bEntry
	max int
}

func newBoundary(max int, entries []schemas.BoundaryEntry) *boundary {
	b := &boundary{m: make(map[string]bEntry, len(entries)), max: max}
	for _, e := range entries {
		b.m[e.ID] = bEntry{ts: e.UpdatedAt, digest: e.Digest}
	}
	return b
}

// seen reports whether r repeats the value last published for its id.
func (b *boundary) seen(r *Row) bool {
	e, ok := b.m[r.ID]
	if !ok {
		return false
	}
	if e.pending {
		e.settle()
		b.m[r.ID] = e
	}
	return e.digest == Digest(r)
}

// touch refreshes the timestamp of an entry met again with the same value.
// It reports whether the timestamp changed (only possible when the value
// does not include updated_at).
func (b *boundary) touch(id string, ts int64) bool {
	if e, ok := b.m[id]; ok && e.ts != ts {
		e.ts = ts
		b.m[id] = e
		return true
	}
	return false
}

// published records that r was published; its digest is computed lazily.
// It reports false when B is full and r's id is not in it.
func (b *boundary) published(r *Row, ts int64) bool {
	if _, ok := b.m[r.ID]; !ok && len(b.m) >= b.max {
		return false
	}
	b.m[r.ID] = bEntry{ts: ts, val: r.Value, pending: true, deleted: r.Deleted}
	return true
}

// put records a publication (or a re-read with the same digest, to refresh
// its timestamp). It reports false when B is full and id is not in it.
func (b *boundary) put(id string, ts int64, d uint64) bool {
	if _, ok := b.m[id]; !ok && len(b.m) >= b.max {
		return false
	}
	b.m[id] = bEntry{ts: ts, digest: d}
	return true
}

// prune drops entries that no later read can meet: updated_at below the
// lowest bound a future pass can start from.
func (b *boundary) prune(below int64) {
	for id, e := range b.m {
		if e.ts < below {
			delete(b.m, id)
		}
	}
}

// entries returns B sorted by (updated_at, id), for a deterministic
// checkpoint, digesting what is still pending.
func (b *boundary) entries() []schemas.BoundaryEntry {
	out := make([]schemas.BoundaryEntry, 0, len(b.m))
	for id, e := range b.m {
		if e.pending {
			e.settle()
			b.m[id] = e
		}
		out = append(out, schemas.BoundaryEntry{ID: id, UpdatedAt: e.ts, Digest: e.digest})
	}
	slices.SortFunc(out, func(x, y schemas.BoundaryEntry) int {
		if x.UpdatedAt != y.UpdatedAt {
			if x.UpdatedAt < y.UpdatedAt {
				return -1
			}
			return 1
		}
		return strings.Compare(x.ID, y.ID)
	})
	return out
}
