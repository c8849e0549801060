package connector

import (
	"context"
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tidemark/tidemark/schemas"
)

// backwards counts a record of key older than the key's newest, and with
// Repeats remembers the key for Recheck.
func (f *TopicFold) backwards(key string) {
	f.Stats.Backwards++
	if !slices.Contains(f.sample, key) {
		f.sample = SmallestKeys(f.sample, key, backSample)
	}
	if !f.Repeats {
		return
	}
	if _, ok := f.back[key]; ok {
		return
	}
	if f.full || len(f.back) >= f.maxBack {
		f.full = true
		f.Stats.Unchecked++
		return
	}
	f.back[key] = struct{}{}
}

// backSample is how many keys BackwardsSample names.
const backSample = 10

// BackwardsSample returns the smallest keys (by string order), at most
// 10, that had a record older than their newest.
func (f *TopicFold) BackwardsSample() []string {
	out := slices.Clone(f.sample)
	slices.Sort(out)
	return out
}

// Recheck reads the records again (read replays them in the order Add
// saw them; it may leave out keys Add did not remember) for the keys that
// Add remembered as back in time (Repeats), and counts as Duplicates each
// such record that repeats an earlier version of its key other than its
// previous record (Add counted those). See TopicFold. Without such keys it
// reads nothing. It holds at most maxVersions versions; a record back in
// time whose key's versions did not all fit, and that matches none that
// did, is counted as Unchecked. It calls note (when not nil) with the key
// of each record it counts, and whether it is a duplicate (else
// unchecked).
func (f *TopicFold) Recheck(read func(fn func(key, value, updatedAt []byte) error) error, note func(key string, dup bool)) error {
	if len(f.back) == 0 {
		return nil
	}
	keys := make(map[string]*recheckKey, len(f.back))
	for k := range f.back {
		keys[k] = &recheckKey{id: xxhash.Sum64String(k), newest: noTime, prevAt: noTime}
	}
	// seen holds the versions (content and updated_at header) of the
	// keys, each mixed with its key.
	seen := map[uint64]struct{}{}
	return read(func(key, value, updatedAt []byte) error {
		h := keys[string(key)]
		if h == nil {
			return nil
		}
		at := headerTime(updatedAt)
		tomb := value == nil
		var sum uint64
		var ver uint32
		if tomb {
			sum = digest(false, updatedAt)
		} else {
			sum, ver = digest(false, value), versionOf(updatedAt)
		}
		v := h.version(sum, ver, tomb)
		// A repeat is older than the key's newest, or carries the newest
		// after an older record (A, then B from an older transaction,
		// then A again). Under the newest right after the newest, a
		// record cannot be told from a row changed without a new
		// updated_at.
		if at != noTime && (at < h.newest || at == h.newest && h.prevAt != h.newest) {
			previous := h.prevSum == sum && h.prevTomb == tomb && (tomb || h.prevVer == ver || h.prevVer == 0 || ver == 0)
			_, again := seen[v]
			switch {
			case again && !previous:
				f.Stats.Duplicates++
				if note != nil {
					note(string(key), true)
				}
			case !again && h.partial:
				f.Stats.Unchecked++
				if note != nil {
					note(string(key), false)
				}
			}
		}
		if tomb {
			// A delete ends the key's life. A row that comes back as it
			// was (restored with its old updated_at, which the next sweep
			// republishes) is published again by design: its versions
			// are compared from here on. The delete itself counts in the
			// new life, so a repeated delete is still a repeat.
			h.life++
			v = h.version(sum, ver, tomb)
			h.partial = false
		}
		if at != noTime {
			if len(seen) < f.maxVersions {
				seen[v] = struct{}{}
			} else if _, ok := seen[v]; !ok {
				h.partial = true
			}
			h.newest = max(h.newest, at)
		}
		h.prevTomb, h.prevSum, h.prevVer, h.prevAt = tomb, sum, ver, at
		return nil
	})
}

// recheckKey is what Recheck holds of one key.
type recheckKey struct {
	id     uint64 // mixes the key into its versions' entries
	newest int64
	// The previous record, as Add compares it: a tombstone's digest is of
	// its updated_at header.
	prevTomb bool
	prevSum  uint64
	prevVer  uint32
	prevAt   int64
	// partial: a version of the key did not fit in Recheck's set.
	partial bool
	// life counts the key's tombstones: versions are compared within one
	// life of the key.
	life uint64
}

// version identifies a record of the key in its current life: its content
// digest (a tombstone's is of its updated_at header), the fingerprint of
// its updated_at header, and whether it is a tombstone.
func (h *recheckKey) version(sum uint64, ver uint32, tomb bool) uint64 {
	v := mix64(h.id ^ mix64(h.life+mix64(sum^uint64(ver)*0x9e3779b97f4a7c15)))
	if tomb {
		v = ^v
	}
	return v
}

// readAgain reads the parts readParts returned (none: nothing).
func readAgain(ctx context.Context, pin PinnedTopic, parts []int32, fn func(key, value, at []byte) error) error {
	if len(parts) == 0 {
		return nil
	}
	return pin.Read(ctx, parts, fn)
}

// readParts reads parts of pin one at a time with fn, and returns those in
// which tf counted a record back in time: the parts Recheck reads again.
func readParts(ctx context.Context, pin PinnedTopic, parts []int32, tf *TopicFold, fn func(key, value, at []byte) error) (back []int32, err error) {
	for _, p := range parts {
		before := tf.Stats.Backwards
		if err := pin.Read(ctx, []int32{p}, fn); err != nil {
			return back, err
		}
		if tf.Stats.Backwards > before {
			back = append(back, p)
		}
	}
	return back, nil
}

// SmallestKeys adds k to s, which keeps the n smallest keys (by string
// order) it was given, in no order.
func SmallestKeys(s []string, k string, n int) []string {
	if len(s) < n {
		return append(s, k)
	}
	at := 0
	for i := range s {
		if s[i] > s[at] {
			at = i
		}
	}
	if k < s[at] {
		s[at] = k
	}
	return s
}

// headerTime reads an updated_at header (schemas.TimeLayout) as
// microseconds since the Unix epoch; noTime when there is none or it is
// not a time. The fixed layout is read by hand: this runs once per record
// a comparison reads.
func headerTime(b []byte) int64 {
	if len(b) == 0 {
		return noTime
	}
	// 2006-01-02T15:04:05.000000Z
	if len(b) == 27 && b[4] == '-' && b[7] == '-' && b[10] == 'T' && b[13] == ':' && b[16] == ':' && b[19] == '.' && b[26] == 'Z' {
		num := func(from, to int) (int, bool) {
			n := 0
			for _, c := range b[from:to] {
				if c < '0' || c > '9' {
					return 0, false
				}
				n = n*10 + int(c-'0')
			}
			return n, true
		}
		y, ok1 := num(0, 4)
		mo, ok2 := num(5, 7)
		d, ok3 := num(8, 10)
		hh, ok4 := num(11, 13)
		mm, ok5 := num(14, 16)
		ss, ok6 := num(17, 19)
		us, ok7 := num(20, 26)
		if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && mo >= 1 && mo <= 12 && d >= 1 && hh < 24 && mm < 60 && ss < 60 {
			// time.Date normalises 02-30 to 03-02; such a header is not a time.
			if t := time.Date(y, time.Month(mo), d, hh, mm, ss, us*1000, time.UTC); t.Day() == d {
				return t.UnixMicro()
			}
			return noTime
		}
	}
	t, err := schemas.ParseTime(string(b))
	if err != nil {
		return noTime
	}
	return t.UnixMicro()
}
