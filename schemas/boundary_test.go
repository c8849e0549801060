package schemas_test

import (
	"math"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/schemas"
)

func TestBoundarySegmentRoundTrip(t *testing.T) {
	for _, es := range [][]schemas.BoundaryRecord{
		nil,
		{{Hash: 1, Digest: 2, UpdatedAt: -5}},
		{{Hash: 0, Digest: math.MaxUint64, UpdatedAt: math.MinInt64 / 2}, {Hash: math.MaxUint64, Digest: 0, UpdatedAt: math.MaxInt64 / 2}},
		{{Hash: 7, Digest: 8, UpdatedAt: 1714564800000001}, {Hash: 9, Digest: 10, UpdatedAt: 1714564800000001}, {Hash: 11, Digest: 12, UpdatedAt: 1714564800000002}},
	} {
		b := schemas.AppendBoundarySegment([]byte("prefix"), es)[len("prefix"):]
		var got []schemas.BoundaryRecord
		n, err := schemas.DecodeBoundarySegment(b, func(e schemas.BoundaryRecord) { got = append(got, e) })
		if err != nil || n != len(es) {
			t.Fatalf("decode %v: n=%d err=%v", es, n, err)
		}
		for i := range es {
			if got[i] != es[i] {
				t.Errorf("entry %d: got %+v, want %+v", i, got[i], es[i])
			}
		}
	}
}

// TestBoundarySegmentRefusesDamage: a flipped bit anywhere, a truncated
// record and a foreign value are errors, never entries.
func TestBoundarySegmentRefusesDamage(t *testing.T) {
	es := []schemas.BoundaryRecord{{Hash: 7, Digest: 8, UpdatedAt: 100}, {Hash: 9, Digest: 10, UpdatedAt: 250}}
	good := schemas.AppendBoundarySegment(nil, es)
	for i := range good {
		for bit := range 8 {
			b := append([]byte(nil), good...)
			b[i] ^= 1 << bit
			if _, err := schemas.DecodeBoundarySegment(b, func(schemas.BoundaryRecord) {}); err == nil {
				t.Fatalf("bit %d of byte %d flipped: decoded without error", bit, i)
			}
		}
	}
	for _, b := range [][]byte{nil, good[:len(good)-1], good[:5], []byte(`{"version":2}`)} {
		if _, err := schemas.DecodeBoundarySegment(b, func(schemas.BoundaryRecord) {}); err == nil {
			t.Errorf("%q: decoded without error", b)
		}
	}
}

// TestDecodeVersion1Checkpoint: a checkpoint written by the previous format
// (dedupe set inline, dedupe_overflow counter) is read, its set kept as
// Legacy for the engine to convert.
func TestDecodeVersion1Checkpoint(t *testing.T) {
	v1 := `{"version":1,"connector":"c","fingerprint":"0123456789abcdef0123456789abcdef","fingerprint_fields":{},` +
		`"phase":"idle","watermark":"2024-05-01T12:00:00.000001Z","pass_low":"","pass_max":"","pass_horizon":"","cursor":"",` +
		`"boundary":[["42",1714564800000001,"00000000deadbeef"],["a\"b",-5,"ffffffffffffffff"]],` +
		`"run_id":"r","seq":7,"counters":{"raw":10,"published":8,"deduped":2,"tombstones":1,"dedupe_overflow":3,"transactions":7,"pages":9,"passes":1},"committed_at":""}`
	c, err := schemas.DecodeCheckpoint([]byte(v1))
	if err != nil {
		t.Fatal(err)
	}
	if c.Version != schemas.CheckpointVersion || c.Seq != 7 || c.Counters.Published != 8 || c.Counters.Passes != 1 {
		t.Errorf("decoded %+v", c)
	}
	want := []schemas.BoundaryEntry{{ID: "42", UpdatedAt: 1714564800000001, Digest: 0xdeadbeef}, {ID: `a"b`, UpdatedAt: -5, Digest: math.MaxUint64}}
	if len(c.Legacy) != 2 || c.Legacy[0] != want[0] || c.Legacy[1] != want[1] {
		t.Errorf("legacy boundary %+v, want %+v", c.Legacy, want)
	}
	b, err := schemas.EncodeCheckpoint(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := schemas.Validate(schemas.KindCheckpoint, b); err != nil {
		t.Errorf("re-encoded version 1 checkpoint does not validate: %v\n%s", err, b)
	}
	if _, err := schemas.DecodeCheckpoint([]byte(strings.Replace(v1, `"version":1`, `"version":3`, 1))); err == nil {
		t.Error("version 3 accepted")
	}
}
