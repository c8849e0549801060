package connector

import "time"

// NewWeakKeySet is NewKeySet whose key hashes keep only the bits of mask,
// so that keys collide (TestKeySetMatchesMap).
func NewWeakKeySet(n int, mask uint32) *KeySet {
	s := NewKeySet(n)
	s.weak = mask
	return s
}

// SetSupersededEvery sets how often an instance that committed nothing
// meanwhile reads the ledger for a newer run, and returns the restore.
func SetSupersededEvery(d time.Duration) (restore func()) {
	old := supersededEvery
	supersededEvery = d
	return func() { supersededEvery = old }
}
