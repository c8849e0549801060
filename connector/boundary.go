package connector

import (
	"cmp"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/cespare/xxhash/v2"

	"github.com/tidemark/tidemark/schemas"
)

// Digest is the content digest of a published record: the first 64 bits of
// SHA-256 over the operation and the value. Equal digests mean an identical
// record; any content change gives a different digest. The sweep and verify
// compare topics and sources by it.
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

// idHash is the 64-bit hash B is indexed by. Two ids may share it; B's
// digest covers the id as well, so such a pair can only cost a publication,
// never skip one.
func idHash(id string) uint64 { return xxhash.Sum64String(id) }

// entryDigest is B's digest of a publication: SHA-256 over the record's
// content digest and the id, first 64 bits.
func entryDigest(id string, content uint64) uint64 {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], content)
	h.Write(b[:])
	h.Write([]byte(id))
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0]))
}

// boundary is the dedupe set B (docs/design.md, "The dedupe set"): for every
// row a later read may meet again, the digest of the record last published
// for it. It has no ceiling: it holds as many entries as the window has
// rows, in 28 bytes each plus a 4-byte index slot kept at most 3/4 full
// (about 33 to 39 bytes an entry), and it never drops an entry a later read
// can meet.
//
// Durability: every transaction writes the entries it changed as a unit of
// segment records to the offsets topic, in the same Kafka transaction as
// the data; the checkpoint names the units that make up B. A unit is
// dropped, oldest first, once none of its entries is current (pruned below
// the floor, or replaced by a later unit); units are only ever dropped from
// the front, so replaying the remaining ones in order can never bring back
// an entry older than the one it replaced. When the units hold much more
// than B, too many of them pile up, or the oldest lies far back, commits
// merge the oldest units into their own, a little at a time (plan).
type boundary struct {
	// Entries, as parallel slices; unit 0 marks a deleted entry.
	hash   []uint64
	digest []uint64
	ts     []int64
	unit   []uint32

	slots []uint32 // 0 = empty, else 1 + entry index; len is a power of two
	live  int
	free  []uint32 // deleted entries, reusable
	// freeing are entries deleted in the open transaction: reused only
	// after it commits, so that dirty never names a reused entry.
	freeing []uint32
	minTS   int64 // no entry is older (a lower bound)

	// pending holds, for entries published in the open transaction, what
	// their digest is computed from: most are pruned before the commit and
	// never need SHA-256.
	pending map[uint32]pendingValue

	units  []*unit // committed units, oldest first
	byID   map[uint32]*unit
	nextID uint32
	cur    *unit    // the open transaction's unit, nil until it changes B
	dirty  []uint32 // entries whose unit is cur
	// shadow are entries of the open transaction that replaced an entry of
	// a committed unit. They are written even when they fall below the
	// floor before the commit: the unit that held the replaced entry may
	// outlive it, and a replay would bring that entry back.
	shadow  map[uint32]bool
	written int64 // entries in the committed units, current or not
	lim     mergeLimits
}

type pendingValue struct {
	id      string
	value   []byte
	deleted bool
}

// unit is the group of segments one transaction wrote.
type unit struct {
	id      uint32
	seq     int64
	offsets []int64
	entries int64 // written
	live    int   // of them still current
}

func newBoundary() *boundary {
	return &boundary{
		slots:   make([]uint32, 16),
		pending: map[uint32]pendingValue{},
		byID:    map[uint32]*unit{},
		shadow:  map[uint32]bool{},
		nextID:  1,
		minTS:   1<<63 - 1,
		lim:     defaultMergeLimits,
	}
}

// Len is the number of entries.
func (b *boundary) Len() int { return b.live }

func (b *boundary) probe(h uint64) (slot int, found bool) {
	mask := uint64(len(b.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		v := b.slots[i]
		if v == 0 {
			return int(i), false
		}
		if b.hash[v-1] == h {
			return int(i), true
		}
	}
}

// find returns the entry of key hash h.
func (b *boundary) find(h uint64) (int, bool) {
	if b.live == 0 {
		return 0, false
	}
	i, ok := b.probe(h)
	if !ok {
		return 0, false
	}
	return int(b.slots[i] - 1), true
}

// settle computes a pending digest.
func (b *boundary) settle(idx int) {
	if p, ok := b.pending[uint32(idx)]; ok {
		b.digest[idx] = entryDigest(p.id, digest(p.deleted, p.value))
		delete(b.pending, uint32(idx))
	}
}

// seen reports whether r repeats the record last published for its id. When
// it does, idx is its entry.
func (b *boundary) seen(r *Row, h uint64) (idx int, same bool) {
	idx, ok := b.find(h)
	if !ok {
		return -1, false
	}
	b.settle(idx)
	return idx, b.digest[idx] == entryDigest(r.ID, Digest(r))
}

// openUnit returns the open transaction's unit.
func (b *boundary) openUnit() *unit {
	if b.cur == nil {
		b.cur = &unit{id: b.nextID}
		b.nextID++
	}
	return b.cur
}

// take moves entry idx into unit u (the open one, or one being replayed).
func (b *boundary) take(idx int, u *unit) {
	if old := b.unit[idx]; old != u.id {
		if o := b.byID[old]; o != nil {
			o.live--
			if u == b.cur {
				b.shadow[uint32(idx)] = true
			}
		}
		b.unit[idx] = u.id
		u.live++
		if u == b.cur {
			b.dirty = append(b.dirty, uint32(idx))
		}
	}
}

// set records a publication of key hash h at ts with digest d into unit u,
// and returns its entry.
func (b *boundary) set(h uint64, ts int64, d uint64, u *unit) int {
	if idx, ok := b.find(h); ok {
		b.digest[idx], b.ts[idx] = d, ts
		delete(b.pending, uint32(idx))
		b.take(idx, u)
		b.minTS = min(b.minTS, ts)
		return idx
	}
	if (b.live+1)*4 > len(b.slots)*3 {
		b.grow()
	}
	slot, _ := b.probe(h)
	var idx int
	if n := len(b.free); n > 0 {
		idx = int(b.free[n-1])
		b.free = b.free[:n-1]
		b.hash[idx], b.digest[idx], b.ts[idx], b.unit[idx] = h, d, ts, 0
	} else {
		idx = len(b.hash)
		b.hash = append(b.hash, h)
		b.digest = append(b.digest, d)
		b.ts = append(b.ts, ts)
		b.unit = append(b.unit, 0)
	}
	b.slots[slot] = uint32(idx) + 1
	b.live++
	b.minTS = min(b.minTS, ts)
	b.take(idx, u)
	return idx
}

func (b *boundary) grow() {
	old := b.slots
	b.slots = make([]uint32, 2*len(old))
	for _, v := range old {
		if v != 0 {
			i, _ := b.probe(b.hash[v-1])
			b.slots[i] = v
		}
	}
}

// publish records that r was published at ts; its digest is computed when
// it is needed.
func (b *boundary) publish(r *Row, h uint64, ts int64) {
	idx := b.set(h, ts, 0, b.openUnit())
	b.pending[uint32(idx)] = pendingValue{id: r.ID, value: r.Value, deleted: r.Deleted}
}

// put records a publication with a known digest.
func (b *boundary) put(id string, ts int64, content uint64) {
	b.set(idHash(id), ts, entryDigest(id, content), b.openUnit())
}

// touch moves the timestamp of entry idx, met again with the same record;
// the move must be written like a publication.
func (b *boundary) touch(idx int, ts int64) bool {
	if b.ts[idx] == ts {
		return false
	}
	b.ts[idx] = ts
	b.minTS = min(b.minTS, ts)
	b.take(idx, b.openUnit())
	return true
}

// remove deletes entry idx.
func (b *boundary) remove(idx int) {
	i, ok := b.probe(b.hash[idx])
	if !ok || int(b.slots[i]-1) != idx {
		panic(fmt.Sprintf("boundary: entry %d is not indexed", idx))
	}
	if u := b.byID[b.unit[idx]]; u != nil {
		u.live--
	} else if b.cur != nil && b.unit[idx] == b.cur.id {
		b.cur.live--
	}
	b.unit[idx] = 0
	delete(b.pending, uint32(idx))
	delete(b.shadow, uint32(idx))
	b.freeing = append(b.freeing, uint32(idx))
	b.live--
	// Backward-shift deletion keeps every probe run unbroken.
	mask := len(b.slots) - 1
	for j := (i + 1) & mask; b.slots[j] != 0; j = (j + 1) & mask {
		home := int(b.hash[b.slots[j]-1]) & mask
		if (j-home)&mask >= (j-i)&mask {
			b.slots[i] = b.slots[j]
			i = j
		}
	}
	b.slots[i] = 0
}

// prune drops every entry older than floor (µs): no later read can meet it.
func (b *boundary) prune(floor int64) {
	if b.live == 0 || floor <= b.minTS {
		return
	}
	newMin := int64(1<<63 - 1)
	for idx := range b.hash {
		if b.unit[idx] == 0 {
			continue
		}
		if b.ts[idx] < floor && !b.shadow[uint32(idx)] {
			b.remove(idx)
		} else {
			newMin = min(newMin, b.ts[idx])
		}
	}
	b.minTS = newMin
}

// Sealing a transaction's changes.

// sealed is what a commit writes for B: the new unit's segments and the
// units it drops.
type sealed struct {
	segments [][]byte
	entries  int64
	drop     []*unit
}

// Merge limits (docs/design.md, "Merging units"). A merge re-emits the
// current entries of the oldest units into the committing one, which lets
// them be dropped. Each commit may re-emit up to its budget: four times the
// entries it changed itself, at least minMergeBudget, and at least a
// (hardMaxUnits/2)th of B. A commit merges
// the longest run of oldest units that fits in its budget when more than
// maxUnits are live and at least two units fit. Otherwise, once past
// halfway to hardMaxUnits (until then the oldest units' entries may still
// age out, which costs nothing), when the units hold more than twice B
// plus rewriteSlack entries, or when the oldest lies more than
// maxUnitDistance offsets behind the newest, it merges that run and fills
// the rest of the budget with part of the next unit, so that a unit larger
// than the budget is re-emitted over several commits; past halfway, that
// part is at least the share of the unit that empties it by hardMaxUnits,
// which may exceed the budget. Past hardMaxUnits, when fewer than two units
// fit, it merges the two oldest whatever they hold, so that the
// checkpoint's list of units stays bounded.
const (
	maxUnits        = 64
	hardMaxUnits    = 256
	minMergeBudget  = 2048
	rewriteSlack    = 64 << 10
	maxUnitDistance = 1 << 20
)

// mergeLimits are the merge limits of one set: the constants above, smaller
// in tests that need every kind of merge to happen often.
type mergeLimits struct {
	units, hardUnits int
	// The budget: at least budget, perEntry per entry the commit changed,
	// and B's entries / perB (unless 0).
	budget, perEntry, perB int
	slack, distance        int64
}

var defaultMergeLimits = mergeLimits{
	units: maxUnits, hardUnits: hardMaxUnits,
	budget: minMergeBudget, perEntry: 4, perB: hardMaxUnits / 2,
	slack: rewriteSlack, distance: maxUnitDistance,
}

// seal encodes the open transaction's unit and lists the units that can be
// dropped. Nothing is committed until done is called after the commit.
func (b *boundary) seal() sealed {
	var s sealed
	if p := b.plan(); p.units > 0 || p.part > 0 {
		// Re-emit the current entries of the oldest p.units units, and at
		// most p.part of the unit after them, into the new one. Units left
		// holding nothing current are dropped below; a unit merged in part
		// stays until it is.
		merge := make(map[uint32]bool, p.units)
		for _, u := range b.units[:p.units] {
			merge[u.id] = true
		}
		var partOf uint32 // unit ids start at 1; 0 is none
		if p.part > 0 && p.units < len(b.units) {
			partOf = b.units[p.units].id
		}
		left := p.part
		u := b.openUnit()
		for idx := range b.hash {
			switch id := b.unit[idx]; {
			case id == 0:
			case merge[id]:
				b.take(idx, u)
			case id == partOf && left > 0:
				b.take(idx, u)
				left--
			}
		}
	}
	var es []schemas.BoundaryRecord
	for _, idx := range b.dirty {
		if b.cur == nil || b.unit[idx] != b.cur.id {
			continue // deleted, or moved on
		}
		b.settle(int(idx))
		es = append(es, schemas.BoundaryRecord{Hash: b.hash[idx], Digest: b.digest[idx], UpdatedAt: b.ts[idx]})
	}
	clear(b.pending) // every live pending entry is dirty, and settled above
	slices.SortFunc(es, func(x, y schemas.BoundaryRecord) int {
		if c := cmp.Compare(x.UpdatedAt, y.UpdatedAt); c != 0 {
			return c
		}
		return cmp.Compare(x.Hash, y.Hash)
	})
	s.entries = int64(len(es))
	for len(es) > 0 {
		n := min(len(es), schemas.MaxSegmentEntries)
		s.segments = append(s.segments, schemas.AppendBoundarySegment(make([]byte, 0, 8+n*19), es[:n]))
		es = es[n:]
	}
	// Only ever drop from the front: a unit is dropped once it and every
	// older one hold nothing current (docs/design.md, "The dedupe set").
	for _, u := range b.units {
		if u.live > 0 {
			break
		}
		s.drop = append(s.drop, u)
	}
	return s
}

// mergePlan is what a commit merges: all the current entries of the
// oldest units, and at most part of those of the unit after them. rule
// names the limit that called for it.
type mergePlan struct {
	units, part int
	rule        string
}

// plan is the next commit's merge (see the merge limits above). Moving
// some of a unit's current entries is as safe as moving all of them: the
// unit stays, listed, until it holds nothing current.
func (b *boundary) plan() mergePlan {
	n := len(b.units)
	if n == 0 {
		return mergePlan{}
	}
	lim := b.lim
	own := 0
	if b.cur != nil {
		own = b.cur.live
	}
	budget := max(lim.perEntry*own, lim.budget)
	if lim.perB > 0 {
		budget = max(budget, b.live/lim.perB)
	}
	k, live := 0, 0
	for k < n && live+b.units[k].live <= budget {
		live += b.units[k].live
		k++
	}
	part := 0
	if k < n {
		part = budget - live
	}
	switch {
	case n > lim.hardUnits && k < 2:
		return mergePlan{units: 2, rule: "hard units, over the budget"}
	case n > lim.hardUnits:
		return mergePlan{units: k, rule: "hard units"}
	case n > lim.units && k >= 2:
		return mergePlan{units: k, rule: "units"}
	case n > (lim.units+lim.hardUnits)/2:
		// At least the share of the next unit that empties it by the
		// hard limit, one unit more each commit: a unit far larger than
		// the budget is moved a share at a time, not all at once there.
		if k < n {
			share := (b.units[k].live + lim.hardUnits - n) / (lim.hardUnits - n + 1)
			part = max(part, share-live)
			if part >= b.units[k].live {
				return mergePlan{units: k + 1, rule: "units, in part"}
			}
		}
		return mergePlan{units: k, part: part, rule: "units, in part"}
	case b.written > 2*int64(b.live)+lim.slack:
		return mergePlan{units: k, part: part, rule: "written"}
	}
	last := b.units[n-1].offsets
	if last[len(last)-1]-b.units[0].offsets[0] > lim.distance {
		return mergePlan{units: k, part: part, rule: "distance"}
	}
	return mergePlan{}
}

// done applies a committed seal: the open unit becomes a committed unit of
// transaction seq at offsets, and the dropped units go.
func (b *boundary) done(s sealed, seq int64, offsets []int64) {
	for _, u := range s.drop {
		delete(b.byID, u.id)
		b.written -= u.entries
	}
	b.units = b.units[len(s.drop):]
	if u := b.cur; u != nil && len(s.segments) > 0 {
		u.seq, u.offsets, u.entries = seq, offsets, s.entries
		b.units = append(b.units, u)
		b.byID[u.id] = u
		b.written += u.entries
	}
	b.cur, b.dirty = nil, b.dirty[:0]
	clear(b.shadow)
	b.free = append(b.free, b.freeing...)
	b.freeing = b.freeing[:0]
}

// state describes B for the checkpoint, including the unit being committed
// at offsets; floor is the floor the seal pruned to, as text and in µs.
//
// Entries counts what a replay of the units pruned at floor holds: the
// entries of the open transaction that replaced a committed one and fell
// below the floor are written (see shadow) but not counted, since the
// replay prunes them.
func (b *boundary) state(floor string, floorUS int64, s sealed, seq int64, offsets []int64) schemas.BoundaryState {
	entries := int64(b.live)
	for idx := range b.shadow {
		if b.unit[idx] != 0 && b.ts[idx] < floorUS {
			entries--
		}
	}
	st := schemas.BoundaryState{Floor: floor, Entries: entries, Units: []schemas.BoundaryUnit{}}
	for _, u := range b.units[len(s.drop):] {
		st.Units = append(st.Units, schemas.BoundaryUnit{Seq: u.seq, Offsets: u.offsets, Entries: u.entries})
	}
	if len(s.segments) > 0 {
		st.Units = append(st.Units, schemas.BoundaryUnit{Seq: seq, Offsets: offsets, Entries: s.entries})
	}
	return st
}

// replay adds a committed unit read back from the offsets topic.
func (b *boundary) replay(seq int64, offsets []int64, segments [][]byte) (int64, error) {
	u := &unit{id: b.nextID, seq: seq, offsets: offsets}
	b.nextID++
	b.byID[u.id] = u
	b.units = append(b.units, u)
	for i, seg := range segments {
		n, err := schemas.DecodeBoundarySegment(seg, func(e schemas.BoundaryRecord) {
			b.set(e.Hash, e.UpdatedAt, e.Digest, u)
		})
		if err != nil {
			return 0, fmt.Errorf("segment %d of unit %d: %w", i, seq, err)
		}
		u.entries += int64(n)
	}
	b.written += u.entries
	return u.entries, nil
}

// legacy converts the inline dedupe set of a version 1 checkpoint; the next
// commit writes it as a unit.
func (b *boundary) legacy(es []schemas.BoundaryEntry) {
	for _, e := range es {
		b.set(idHash(e.ID), e.UpdatedAt, entryDigest(e.ID, e.Digest), b.openUnit())
	}
}

// bytes estimates B's memory: the entries and the index.
func (b *boundary) bytes() int64 {
	return int64(len(b.hash))*28 + int64(len(b.slots))*4
}
