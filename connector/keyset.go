package connector

import (
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
)

// KeySet is a compact map from record key to value digest, for comparing a
// topic with a source by key set and content (the sweep and verify).
//
// Layout: one 32-byte entry per key (32-bit key hash, version fingerprint,
// digest, where the key's bytes sit in a single arena, the newest time
// put with it), the key bytes in that arena, and an open-addressing index
// of 4-byte slots (linear probing, at most 3/4 full). Keys whose hashes are equal are told apart by their
// bytes.
// With 7-byte keys that is some 56 bytes per live key: a million keys take
// about 53 MiB (BenchmarkKeySet1M measures it). Growing the index costs 4
// bytes per slot, so there is no doubling spike of the whole set.
type KeySet struct {
	seed  maphash.Seed
	slots []uint32 // 0 = empty, else 1 + index in ents; len is a power of two
	ents  []ksEntry
	free  []uint32 // ents of deleted keys, reused by the next new key
	live  int
	arena []byte
	// weak masks the key hash; all ones but in tests, which make hashes
	// collide to drive the paths that tell keys apart by their bytes.
	weak uint32
}

type ksEntry struct {
	hash   uint32
	ver    uint32 // a fingerprint of the version the digest is of (PutVersion)
	digest uint64
	off    uint32
	n      uint32 // key length; the top bit flags "marked"
	newest int64  // the newest time put with the key (PutVersionAt); noTime: none
}

// noTime is the time of a record that has none (no or an unreadable
// updated_at header): before every time.
const noTime = math.MinInt64

const ksMarked = 1 << 31

// NewKeySet returns an empty KeySet sized for n keys.
func NewKeySet(n int) *KeySet {
	return &KeySet{
		seed:  maphash.MakeSeed(),
		slots: make([]uint32, slotsFor(n)),
		ents:  make([]ksEntry, 0, n),
		weak:  ^uint32(0),
	}
}

// slotsFor is the power of two that holds n keys at most 3/4 full.
func slotsFor(n int) int {
	want := max(16, n+n/3+1)
	return 1 << bits.Len(uint(want-1))
}

func (s *KeySet) hash(key string) uint32 { return uint32(maphash.String(s.seed, key)) & s.weak }

func (s *KeySet) key(e *ksEntry) string {
	return string(s.arena[e.off : e.off+e.n&^ksMarked])
}

// probe returns the slot of key (hash h), or the empty slot where it would
// go.
func (s *KeySet) probe(h uint32, key string) (slot int, found bool) {
	mask := len(s.slots) - 1
	for i := int(h) & mask; ; i = (i + 1) & mask {
		v := s.slots[i]
		if v == 0 {
			return i, false
		}
		if e := &s.ents[v-1]; e.hash == h && s.key(e) == key {
			return i, true
		}
	}
}

// place returns the first empty slot from hash h's home, for an entry
// known not to be in the index (growing or rebuilding it).
func (s *KeySet) place(h uint32) int {
	mask := len(s.slots) - 1
	i := int(h) & mask
	for s.slots[i] != 0 {
		i = (i + 1) & mask
	}
	return i
}

// find returns the entry of key, or nil.
func (s *KeySet) find(key string) *ksEntry {
	i, ok := s.probe(s.hash(key), key)
	if !ok {
		return nil
	}
	return &s.ents[s.slots[i]-1]
}

// Put sets key's digest. It reports whether the key already held the same
// digest (a repeated publication).
func (s *KeySet) Put(key string, digest uint64) (same bool, err error) {
	return s.PutVersion(key, digest, 0)
}

// PutVersion sets key's digest and the fingerprint of the row version it
// is of (0: not known). It reports whether the key already held the same
// digest of the same version, or of a version either side does not know:
// the same content of another known version is not a repeat.
func (s *KeySet) PutVersion(key string, digest uint64, ver uint32) (same bool, err error) {
	same, _, err = s.PutVersionAt(key, digest, ver, noTime, noTime)
	return same, err
}

// PutVersionAt is PutVersion that also keeps the newest of the times put
// with the key (micros; noTime: none), starting from floor for a key it
// does not hold (the newest time of the key in another set: TopicFold
// moves a key between its live and deleted sets). It returns the newest
// time before this one.
func (s *KeySet) PutVersionAt(key string, digest uint64, ver uint32, at, floor int64) (same bool, newest int64, err error) {
	h := s.hash(key)
	i, ok := s.probe(h, key)
	if ok {
		e := &s.ents[s.slots[i]-1]
		same = e.digest == digest && (e.ver == ver || e.ver == 0 || ver == 0)
		newest = max(e.newest, floor)
		e.digest, e.ver, e.newest = digest, ver, max(newest, at)
		return same, newest, nil
	}
	if len(s.arena)+len(key) > 1<<32-1 || len(key) >= ksMarked {
		return false, floor, fmt.Errorf("key set exceeds 4 GiB of keys")
	}
	if (s.live+1)*4 > len(s.slots)*3 {
		s.grow()
		i = s.place(h)
	}
	e := ksEntry{hash: h, digest: digest, off: uint32(len(s.arena)), n: uint32(len(key)), ver: ver, newest: max(floor, at)}
	s.arena = append(s.arena, key...)
	var slot uint32
	if n := len(s.free); n > 0 {
		slot = s.free[n-1]
		s.free = s.free[:n-1]
		s.ents[slot] = e
	} else {
		if len(s.ents) >= 1<<32-2 {
			return false, floor, fmt.Errorf("key set exceeds 4 billion keys")
		}
		slot = uint32(len(s.ents))
		s.ents = append(s.ents, e)
	}
	s.slots[i] = slot + 1
	s.live++
	return false, floor, nil
}

// grow doubles the index.
func (s *KeySet) grow() {
	old := s.slots
	s.slots = make([]uint32, 2*len(old))
	for _, v := range old {
		if v != 0 {
			s.slots[s.place(s.ents[v-1].hash)] = v
		}
	}
}

// Delete removes key (a tombstone).
func (s *KeySet) Delete(key string) { s.Take(key) }

// Take removes key and returns the newest time put with it
// (PutVersionAt), noTime when it had none or was not held.
func (s *KeySet) Take(key string) (newest int64) {
	i, ok := s.probe(s.hash(key), key)
	if !ok {
		return noTime
	}
	newest = s.ents[s.slots[i]-1].newest
	s.free = append(s.free, s.slots[i]-1)
	s.live--
	// Backward-shift deletion: move later members of the probe run into
	// the hole when their home slot is not after it, so that no probe
	// stops early at the emptied slot.
	mask := len(s.slots) - 1
	for j := (i + 1) & mask; s.slots[j] != 0; j = (j + 1) & mask {
		home := int(s.ents[s.slots[j]-1].hash) & mask
		if (j-home)&mask >= (j-i)&mask {
			s.slots[i] = s.slots[j]
			i = j
		}
	}
	s.slots[i] = 0
	return newest
}

// Lookup returns key's digest.
func (s *KeySet) Lookup(key string) (uint64, bool) {
	if e := s.find(key); e != nil {
		return e.digest, true
	}
	return 0, false
}

// Mark flags key as seen in the source; it reports whether key is present.
func (s *KeySet) Mark(key string) bool {
	e := s.find(key)
	if e == nil {
		return false
	}
	e.n |= ksMarked
	return true
}

// Unmarked calls fn for every key not marked, in no particular order.
func (s *KeySet) Unmarked(fn func(key string, digest uint64) error) error {
	for _, v := range s.slots {
		if v == 0 {
			continue
		}
		if e := &s.ents[v-1]; e.n&ksMarked == 0 {
			if err := fn(s.key(e), e.digest); err != nil {
				return err
			}
		}
	}
	return nil
}

// Len is the number of live keys.
func (s *KeySet) Len() int { return s.live }

// Each calls fn for every key, in no particular order.
func (s *KeySet) Each(fn func(key string, digest uint64) error) error {
	for _, v := range s.slots {
		if v == 0 {
			continue
		}
		e := &s.ents[v-1]
		if err := fn(s.key(e), e.digest); err != nil {
			return err
		}
	}
	return nil
}

// Filter drops every key that keep rejects. The bytes of dropped keys stay
// in the arena until Reset.
func (s *KeySet) Filter(keep func(key string) bool) {
	old := s.slots
	s.slots = make([]uint32, len(old))
	for _, v := range old {
		if v == 0 {
			continue
		}
		e := &s.ents[v-1]
		if !keep(s.key(e)) {
			s.free = append(s.free, v-1)
			s.live--
			continue
		}
		s.slots[s.place(e.hash)] = v
	}
}

// Reset empties the set, keeping its memory for the next keys.
func (s *KeySet) Reset() {
	clear(s.slots)
	s.ents = s.ents[:0]
	s.free = s.free[:0]
	s.arena = s.arena[:0]
	s.live = 0
}
