package schemas

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
)

// BoundaryState locates the dedupe set B of a checkpoint (docs/design.md,
// "The dedupe set"). B itself is not in the checkpoint record: it is kept in
// segments, records of the offsets topic written in the same transactions
// as the data they describe, and the checkpoint names the ones that make up
// B now. Replaying the units in order, later entries replacing earlier
// ones for the same key, and dropping entries below Floor gives B.
type BoundaryState struct {
	// Floor is the lowest updated_at any later read can meet again ("" =
	// minus infinity); entries below it are not part of B.
	Floor string `json:"floor"`
	// Entries is the number of entries in B.
	Entries int64 `json:"entries"`
	// Units are the segment groups still needed, oldest first.
	Units []BoundaryUnit `json:"units"`
}

// BoundaryUnit is the group of segments one transaction wrote.
type BoundaryUnit struct {
	// Seq is the checkpoint sequence number of the transaction.
	Seq int64 `json:"seq"`
	// Offsets are the offsets of its segment records in the offsets topic;
	// the i-th has key BoundaryKey(connector, Seq, i).
	Offsets []int64 `json:"offsets"`
	// Entries is the number of entries the unit holds.
	Entries int64 `json:"entries"`
}

// BoundaryKey is the offsets-topic key of segment i of unit seq. Connector
// names cannot contain '#', so it never equals a checkpoint's key.
func BoundaryKey(connector string, seq int64, i int) string {
	return connector + "#b" + strconv.FormatInt(seq, 10) + "." + strconv.Itoa(i)
}

// BoundaryRecord is one entry of B: a 64-bit hash of the key, a 64-bit
// digest of the key and the published record, and the row's updated_at in
// microseconds since the Unix epoch.
type BoundaryRecord struct {
	Hash, Digest uint64
	UpdatedAt    int64
}

// MaxSegmentEntries bounds one segment record: at most about 19 bytes an
// entry, a segment stays under Kafka's default max.message.bytes (1 MiB).
const MaxSegmentEntries = 32 << 10

// segmentMagic starts a segment: "TMB" and the format version.
var segmentMagic = [4]byte{'T', 'M', 'B', 1}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// AppendBoundarySegment appends the segment encoding of es, which must be
// sorted by UpdatedAt: the magic, the count, the first updated_at, then per
// entry the hash and digest (8 bytes each, big endian) and the updated_at
// delta from the previous entry (uvarint), and a CRC-32C of all that.
func AppendBoundarySegment(b []byte, es []BoundaryRecord) []byte {
	start := len(b)
	b = append(b, segmentMagic[:]...)
	b = binary.AppendUvarint(b, uint64(len(es)))
	var prev int64
	if len(es) > 0 {
		prev = es[0].UpdatedAt
	}
	b = binary.AppendVarint(b, prev)
	for _, e := range es {
		b = binary.BigEndian.AppendUint64(b, e.Hash)
		b = binary.BigEndian.AppendUint64(b, e.Digest)
		b = binary.AppendUvarint(b, uint64(e.UpdatedAt-prev))
		prev = e.UpdatedAt
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli))
}

var errSegment = errors.New("not a boundary segment")

// DecodeBoundarySegment calls fn for every entry of segment b, in order, and
// returns how many there were. A damaged or foreign record is an error.
func DecodeBoundarySegment(b []byte, fn func(BoundaryRecord)) (int, error) {
	if len(b) < len(segmentMagic)+4 || [4]byte(b[:4]) != segmentMagic {
		return 0, errSegment
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return 0, fmt.Errorf("%w: checksum mismatch", errSegment)
	}
	p := body[4:]
	n, k := binary.Uvarint(p)
	if k <= 0 || n > MaxSegmentEntries {
		return 0, fmt.Errorf("%w: bad entry count", errSegment)
	}
	p = p[k:]
	ts, k := binary.Varint(p)
	if k <= 0 {
		return 0, fmt.Errorf("%w: bad first timestamp", errSegment)
	}
	p = p[k:]
	for i := uint64(0); i < n; i++ {
		if len(p) < 17 {
			return 0, fmt.Errorf("%w: truncated at entry %d of %d", errSegment, i, n)
		}
		e := BoundaryRecord{Hash: binary.BigEndian.Uint64(p), Digest: binary.BigEndian.Uint64(p[8:])}
		d, k := binary.Uvarint(p[16:])
		if k <= 0 {
			return 0, fmt.Errorf("%w: bad timestamp delta at entry %d", errSegment, i)
		}
		ts += int64(d)
		e.UpdatedAt = ts
		fn(e)
		p = p[16+k:]
	}
	if len(p) != 0 {
		return 0, fmt.Errorf("%w: %d trailing bytes", errSegment, len(p))
	}
	return int(n), nil
}
