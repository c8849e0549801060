package connector

// NewWeakKeySet is NewKeySet whose key hashes keep only the bits of mask,
// so that keys collide (TestKeySetMatchesMap).
func NewWeakKeySet(n int, mask uint32) *KeySet {
	s := NewKeySet(n)
	s.weak = mask
	return s
}
