package rig

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
)

// tombstone is how fold.State.Publications counts a tombstone.
const tombstone = "\x00tombstone"

// Expected walks the table from scratch with the PostgreSQL source itself
// (in one snapshot) and returns id -> encoded value of its live rows,
// skipping soft-deleted ones: exactly what a consumer must rebuild.
func (r *Rig) Expected() map[string]string {
	r.T.Helper()
	out := map[string]string{}
	if _, err := r.Src.ScanLive(context.Background(), func(row *connector.Row) error {
		out[row.ID] = string(row.Value)
		return nil
	}); err != nil {
		r.T.Fatalf("walk the table: %v", err)
	}
	return out
}

// Walk reads one whole pass of the table from minus infinity with the
// source's Page, soft-deleted rows included.
func (r *Rig) Walk() []connector.Row {
	r.T.Helper()
	var all []connector.Row
	req := connector.PageRequest{Limit: 1000}
	for i := 0; ; i++ {
		if i > 10000 {
			r.T.Fatal("walk of the table did not end")
		}
		p, err := r.Src.Page(context.Background(), req)
		if err != nil {
			r.T.Fatalf("walk the table: %v", err)
		}
		if p.End {
			return all
		}
		all = append(all, p.Rows...)
		req.Cursor = p.Next
	}
}

// Fold folds the data topic read_committed.
func (r *Rig) Fold() *fold.State {
	r.T.Helper()
	st, err := fold.Map(context.Background(), r.Opts, r.Topic)
	if err != nil {
		r.T.Fatalf("fold %s: %v", r.Topic, err)
	}
	return st
}

// AssertFolded folds the data topic and compares its live keys and values
// with want (see AssertState). It returns the folded state.
func (r *Rig) AssertFolded(want map[string]string) *fold.State {
	r.T.Helper()
	st := r.Fold()
	AssertState(r.T, st, want)
	return st
}

// AssertTable is AssertFolded against the table as it is now.
func (r *Rig) AssertTable() *fold.State {
	r.T.Helper()
	return r.AssertFolded(r.Expected())
}

// AssertState fails the test when the live keys and values of st differ
// from want, naming every difference (Diff).
func AssertState(t testing.TB, st *fold.State, want map[string]string) {
	t.Helper()
	if d := Diff(st, want); len(d) > 0 {
		t.Errorf("the folded topic differs from the table:\n  %s", strings.Join(d, "\n  "))
	}
}

// Diff lists, one line a key in key order, how the live keys and values of
// st differ from want: keys missing from the topic (or whose last record is
// a tombstone), values that differ, and keys live in the topic only.
func Diff(st *fold.State, want map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(want)) {
		got, ok := st.Live[k]
		switch {
		case !ok && st.Publications[k][tombstone] > 0:
			out = append(out, fmt.Sprintf("key %s: live in the table (%s) but its last record is a TOMBSTONE", k, want[k]))
		case !ok:
			out = append(out, fmt.Sprintf("key %s: missing from the topic; the table has %s", k, want[k]))
		case string(got.Value) != want[k]:
			out = append(out, fmt.Sprintf("key %s: the topic has %s, the table has %s", k, got.Value, want[k]))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(st.Live)) {
		if _, ok := want[k]; !ok {
			out = append(out, fmt.Sprintf("key %s: live in the topic (%s) but not in the table", k, st.Live[k].Value))
		}
	}
	return out
}

// Tombstoned lists, sorted, the keys that have at least one tombstone
// record.
func Tombstoned(st *fold.State) []string {
	var out []string
	for k, vs := range st.Publications {
		if vs[tombstone] > 0 {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// AssertTombstoned fails the test unless id is absent from the live state
// and a tombstone was published for it.
func AssertTombstoned(t testing.TB, st *fold.State, id string) {
	t.Helper()
	if _, ok := st.Live[id]; ok {
		t.Errorf("key %s: still live in the topic, want it deleted", id)
	}
	if st.Publications[id][tombstone] == 0 {
		t.Errorf("key %s: no tombstone record in the topic", id)
	}
}

// AssertNoDupes fails the test when any (id, value) was published more
// than once, or when a key went back in time: a record older (by its
// updated_at header) than one of its key published before it. A key going
// back and forth shows as a value published twice, but an old version
// published once after a newer one (a stale read) only as the latter.
func AssertNoDupes(t testing.TB, st *fold.State) {
	t.Helper()
	if n := len(st.Backwards); n > 0 {
		t.Errorf("%d records published after a newer record of their key: %s", n, strings.Join(st.Backwards[:min(n, 5)], "; "))
	}
	var out []string
	for k, vs := range st.Publications {
		for v, n := range vs {
			if n > 1 {
				if v == tombstone {
					v = "<tombstone>"
				}
				out = append(out, fmt.Sprintf("%s=%s x%d", k, v, n))
			}
		}
	}
	slices.Sort(out)
	if len(out) > 0 {
		n := len(out)
		if n > 5 {
			out = append(out[:5], "...")
		}
		t.Errorf("%d row versions published more than once: %s", n, strings.Join(out, "; "))
	}
}
