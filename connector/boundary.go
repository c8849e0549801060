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
func Digest(r *Row) uint64 {
	h := sha256.New()
	if r.Deleted {
		h.Write([]byte{'D'})
	} else {
		h.Write([]byte{'U'})
		h.Write(r.Value)
	}
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

type bEntry struct {
	ts     int64 // updated_at, µs since epoch
	digest uint64
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

// seen reports whether id was last published with digest d.
func (b *boundary) seen(id string, d uint64) bool {
	e, ok := b.m[id]
	return ok && e.digest == d
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

// entries returns B sorted by (updated_at, id), for a deterministic checkpoint.
func (b *boundary) entries() []schemas.BoundaryEntry {
	out := make([]schemas.BoundaryEntry, 0, len(b.m))
	for id, e := range b.m {
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
