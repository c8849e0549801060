package connector

import (
	"fmt"
	"hash/maphash"
)

// KeySet is a compact map from record key to value digest, for comparing a
// topic with a source by key set and content (the sweep and verify). It
// holds 64-bit key hashes, digests and the key bytes in one arena: about
// 40 bytes per live key, so a million keys take some 40 MiB.
type KeySet struct {
	seed  maphash.Seed
	m     map[uint64]ksEntry
	arena []byte
}

type ksEntry struct {
	digest uint64
	off    uint32
	n      uint32
	seen   bool
}

// NewKeySet returns an empty KeySet sized for n keys.
func NewKeySet(n int) *KeySet {
	return &KeySet{seed: maphash.MakeSeed(), m: make(map[uint64]ksEntry, n)}
}

func (s *KeySet) hash(key string) uint64 { return maphash.String(s.seed, key) }

func (s *KeySet) key(e ksEntry) string { return string(s.arena[e.off : e.off+e.n]) }

// Put sets key's digest. It reports whether the key already held the same
// digest (a repeated publication).
func (s *KeySet) Put(key string, digest uint64) (same bool, err error) {
	h := s.hash(key)
	if e, ok := s.m[h]; ok {
		if s.key(e) != key {
			return false, fmt.Errorf("key hash collision between %q and %q; rerun (the hash seed is random)", s.key(e), key)
		}
		same = e.digest == digest
		e.digest = digest
		s.m[h] = e
		return same, nil
	}
	if len(s.arena)+len(key) > 1<<32-1 {
		return false, fmt.Errorf("key set exceeds 4 GiB of keys")
	}
	s.m[h] = ksEntry{digest: digest, off: uint32(len(s.arena)), n: uint32(len(key))}
	s.arena = append(s.arena, key...)
	return false, nil
}

// Delete removes key (a tombstone).
func (s *KeySet) Delete(key string) { delete(s.m, s.hash(key)) }

// Lookup returns key's digest.
func (s *KeySet) Lookup(key string) (uint64, bool) {
	e, ok := s.m[s.hash(key)]
	if !ok || s.key(e) != key {
		return 0, false
	}
	return e.digest, true
}

// Mark flags key as seen in the source; it reports whether key is present.
func (s *KeySet) Mark(key string) bool {
	h := s.hash(key)
	e, ok := s.m[h]
	if !ok || s.key(e) != key {
		return false
	}
	e.seen = true
	s.m[h] = e
	return true
}

// Unmarked calls fn for every key not marked, in no particular order.
func (s *KeySet) Unmarked(fn func(key string, digest uint64) error) error {
	for _, e := range s.m {
		if !e.seen {
			if err := fn(s.key(e), e.digest); err != nil {
				return err
			}
		}
	}
	return nil
}

// Len is the number of live keys.
func (s *KeySet) Len() int { return len(s.m) }
