package connector

import (
	"slices"
	"time"

	"github.com/cespare/xxhash/v2"

	"github.com/tidemark/tidemark/schemas"
)

// Recheck reads the records again (read replays them in the order Add
// saw them) for the keys that had a record older than their newest, and
// counts as Duplicates, calling dup with the key, each such record that
// repeats an earlier version of its key other than its previous record
// (Add counted those). See TopicFold. Without such keys it reads nothing.
func (f *TopicFold) Recheck(read func(fn func(key, value, updatedAt []byte) error) error, dup func(key string)) error {
	if len(f.back) == 0 {
		return nil
	}
	type history struct {
		newest int64
		// The previous record, as Add compares it: a tombstone's digest
		// is of its updated_at header.
		prevTomb bool
		prevSum  uint64
		prevVer  uint32
		seen     map[uint64]struct{} // versions with an updated_at header
	}
	keys := make(map[string]*history, len(f.back))
	for k := range f.back {
		keys[k] = &history{newest: noTime, seen: map[uint64]struct{}{}}
	}
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
		// The version: its content and its updated_at header.
		v := sum ^ xxhash.Sum64(updatedAt)*0x9e3779b97f4a7c15
		if tomb {
			v = ^v
		}
		previous := h.prevSum == sum && h.prevTomb == tomb && (tomb || h.prevVer == ver || h.prevVer == 0 || ver == 0)
		if _, again := h.seen[v]; again && at != noTime && at < h.newest && !previous {
			f.Stats.Duplicates++
			if dup != nil {
				dup(string(key))
			}
		}
		if at != noTime {
			h.seen[v] = struct{}{}
			h.newest = max(h.newest, at)
		}
		h.prevTomb, h.prevSum, h.prevVer = tomb, sum, ver
		return nil
	})
}

// BackwardsSample returns the smallest keys (by string order), at most
// 10, that had a record older than their newest.
func (f *TopicFold) BackwardsSample() []string {
	out := make([]string, 0, min(len(f.back), 11))
	for k := range f.back {
		out = SmallestKeys(out, k, 10)
	}
	slices.Sort(out)
	return out
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
		if ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7 && mo >= 1 && mo <= 12 && d >= 1 && d <= 31 && hh < 24 && mm < 60 && ss < 60 {
			return time.Date(y, time.Month(mo), d, hh, mm, ss, us*1000, time.UTC).UnixMicro()
		}
	}
	t, err := schemas.ParseTime(string(b))
	if err != nil {
		return noTime
	}
	return t.UnixMicro()
}
