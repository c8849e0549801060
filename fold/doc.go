// Package fold reads a tidemark data topic the way a consumer must:
// read_committed, from the start to the end that existed when the read
// began, applying "last record per key wins, a tombstone deletes".
//
// Scan is the primitive (every committed record, in offset order per
// partition); Map folds into memory. The tests, `tidemark verify` and the
// replica build on them.
//
// A read fixes its view first (ViewWait: the last stable offsets, once the
// transactions that had written before are resolved) and then reads each
// partition with its own read_committed fetches until its position
// reaches the view's end (scanRanges says why the position, and not the
// last record, decides).
package fold
