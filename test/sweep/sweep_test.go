package sweep

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/test/rig"
	"github.com/tidemark/tidemark/verify"
)

// TestSweepTombstonesHardDeletes: rows that were read (published) and rows
// that were never read are hard-deleted; a sweep publishes tombstones for
// exactly the published ones, republishes the rows the walk has not read
// yet, and verify then matches. A second sweep finds nothing to do.
func TestSweepTombstonesHardDeletes(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 20, time.Millisecond)
	r.Once(r.Src, connector.Config{PageSize: 7})
	r.Seed(21, 25, time.Millisecond) // never read by a pass
	r.Exec(`DELETE FROM items WHERE id IN (3, 7, 11, 22, 24)`)

	res := r.Sweep(connector.Config{})
	if res.Tombstoned != 3 || res.Repaired != 3 || res.SourceRows != 20 || res.TopicKeys != 20 {
		t.Errorf("sweep: %s; want 3 tombstoned (3, 7, 11), 3 repaired (21, 23, 25), 20 source rows, 20 topic keys", res)
	}
	st := r.AssertTable()
	if got, want := rig.Tombstoned(st), []string{"11", "3", "7"}; !slices.Equal(got, want) {
		t.Errorf("keys with a tombstone: %v, want exactly %v", got, want)
	}
	for _, id := range []string{"22", "24"} {
		if n := len(st.Publications[id]); n != 0 {
			t.Errorf("key %s was never published and is deleted: want no record at all, got %v", id, st.Publications[id])
		}
	}
	if rep := r.Verify(); !rep.OK() || rep.SourceRows != 20 || rep.LiveKeys != 20 {
		t.Errorf("verify after the sweep:\n%s", rep.Text())
	}
	cp := r.Checkpoint()
	if cp.Sweep != nil || cp.LastSweep == nil || cp.LastSweep.Tombstoned != 3 || cp.LastSweep.Repaired != 3 {
		t.Errorf("checkpoint after the sweep: sweep %+v, last_sweep %+v", cp.Sweep, cp.LastSweep)
	}

	// Nothing changed: a second sweep publishes nothing.
	records := st.Records
	res = r.Sweep(connector.Config{})
	if res.Tombstoned != 0 || res.Repaired != 0 {
		t.Errorf("second sweep: %s; want nothing to do", res)
	}
	if st2 := r.AssertTable(); st2.Records != records {
		t.Errorf("second sweep added %d records", st2.Records-records)
	}
}

// TestVerifyMissingAndExtraWithEqualCounts: the topic lacks one key and
// holds one that the table does not, so the counts are equal; verify must
// still fail and name both. A sweep repairs both.
func TestVerifyMissingAndExtraWithEqualCounts(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 10, time.Millisecond)
	r.Once(r.Src, connector.Config{})
	if rep := r.Verify(); !rep.OK() {
		t.Fatalf("verify after a sync:\n%s", rep.Text())
	}
	produceRaw(r, [2]*string{ptr("4"), nil}, [2]*string{ptr("999"), ptr(`{"id":999,"v":"ghost"}`)})

	rep := r.Verify()
	t.Logf("\n%s", rep.Text())
	if rep.OK() {
		t.Fatal("verify reports a match for a topic missing key 4 and holding key 999")
	}
	if rep.SourceRows != 10 || rep.LiveKeys != 10 {
		t.Errorf("counts: %d source rows, %d live keys; want 10 and 10 (equal counts are the point)", rep.SourceRows, rep.LiveKeys)
	}
	if rep.Missing != 1 || !contains(rep.MissingSample, "4") {
		t.Errorf("missing: %d %v, want 1 naming 4", rep.Missing, rep.MissingSample)
	}
	if rep.Extra != 1 || !contains(rep.ExtraSample, "999") {
		t.Errorf("extra: %d %v, want 1 naming 999", rep.Extra, rep.ExtraSample)
	}
	if rep.Mismatched != 0 {
		t.Errorf("mismatched: %d %v, want 0", rep.Mismatched, rep.MismatchedSample)
	}

	// The sweep as `run --once` runs it when one is due.
	r.Once(r.Src, connector.Config{SweepInterval: time.Nanosecond})
	if ls := r.Checkpoint().LastSweep; ls == nil || ls.Tombstoned != 1 || ls.Repaired != 1 {
		t.Errorf("sweep: %+v; want 999 tombstoned and 4 repaired", ls)
	}
	r.AssertTable()
	if rep := r.Verify(); !rep.OK() {
		t.Errorf("verify after the sweep:\n%s", rep.Text())
	}
}

// TestValueChangedBehindTheBack: an UPDATE that leaves updated_at alone is
// invisible to the walk. verify reports the row as mismatched (and the walk
// indeed does not repair it); a sweep repairs it.
func TestValueChangedBehindTheBack(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 10, time.Hour) // an hour apart: only row 10 lies within the margin
	cfg := connector.Config{Margin: time.Second}
	r.Once(r.Src, cfg)
	r.Exec(`UPDATE items SET v = 'sneaky' WHERE id = 3`)

	rep := r.Verify()
	t.Logf("\n%s", rep.Text())
	if rep.OK() || rep.Mismatched != 1 || !slices.Equal(rep.MismatchedSample, []string{"3"}) || rep.Missing != 0 || rep.Extra != 0 {
		t.Fatalf("verify: want exactly key 3 mismatched, got\n%s", rep.Text())
	}
	if c := r.Once(r.Src, cfg); c.Published != 0 {
		t.Errorf("the walk published %d records; it cannot see a change that kept updated_at", c.Published)
	}
	if rep := r.Verify(); rep.Mismatched != 1 {
		t.Errorf("after a pass: %d mismatched, want 1 (the walk cannot see it)", rep.Mismatched)
	}

	res := r.Sweep(cfg)
	if res.Repaired != 1 || res.Tombstoned != 0 {
		t.Errorf("sweep: %s; want 1 repaired", res)
	}
	st := r.AssertTable()
	if got := st.Live["3"].Value; !strings.Contains(string(got), `"sneaky"`) {
		t.Errorf("key 3 after the sweep: %s", got)
	}
	if rep := r.Verify(); !rep.OK() {
		t.Errorf("verify after the sweep:\n%s", rep.Text())
	}
	// The repair is in B: the next passes do not publish it again.
	before := r.Fold().Records
	r.Once(r.Src, cfg)
	if after := r.Fold().Records; after != before {
		t.Errorf("a pass after the repair published %d records", after-before)
	}
}

// TestVerifyAgainstReplicaTable: a replica table copied with SQL matches;
// a changed, a deleted and an added row are each named.
func TestVerifyAgainstReplicaTable(t *testing.T) {
	r := newRig(t)
	r.Seed(1, 10, time.Millisecond)
	r.Exec(`CREATE TABLE items_replica (LIKE items INCLUDING ALL); INSERT INTO items_replica SELECT * FROM items`)
	rcfg := r.PG
	rcfg.Table, rcfg.DeletedAtColumn = "items_replica", "" // as `verify --replica-table` opens it
	replica := r.Open(rcfg)
	cmp := func() *verify.Report {
		t.Helper()
		rep, err := verify.Compare(context.Background(), r.Src, verify.Scanned{LiveScanner: replica}, "table items_replica")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("\n%s", rep.Text())
		return rep
	}
	if rep := cmp(); !rep.OK() || rep.SourceRows != 10 || rep.LiveKeys != 10 {
		t.Fatal("an exact copy does not match")
	}
	r.Exec(`UPDATE items_replica SET v = 'drift' WHERE id = 6`)
	rep := cmp()
	if rep.OK() || rep.Mismatched != 1 || !slices.Equal(rep.MismatchedSample, []string{"6"}) {
		t.Errorf("want key 6 mismatched")
	}
	r.Exec(`DELETE FROM items_replica WHERE id = 2; INSERT INTO items_replica (id, v) VALUES (77, 'x')`)
	rep = cmp()
	if rep.Missing != 1 || !slices.Equal(rep.MissingSample, []string{"2"}) || rep.Extra != 1 || !slices.Equal(rep.ExtraSample, []string{"77"}) || rep.Mismatched != 1 {
		t.Errorf("want 2 missing, 77 extra, 6 mismatched")
	}
}
