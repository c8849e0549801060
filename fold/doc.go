// Package fold reads a tidemark data topic the way a consumer must:
// read_committed, from the start to the end that existed when the read
// began, applying "last record per key wins, a tombstone deletes".
//
// Scan is the primitive (every committed record, in offset order per
// partition); Map folds into memory. The tests, `tidemark verify` and the
// replica build on them.
package fold
