package main

import (
	"context"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tidemark/tidemark/fold"
	"github.com/tidemark/tidemark/offsets"
	"github.com/tidemark/tidemark/schemas"
)

// TestCLIResetFollowsTheNewestCheckpoint: another connector's transaction
// left open on the shared offsets topic (killed mid-commit) hides this
// connector's newest checkpoint from a read as it stands. reset asks its
// question from that read, but the reset itself follows the strict read
// made after fencing: while the other transaction is open it refuses
// (exit 1, nothing written) instead of writing a reset on an older seq;
// once that transaction is resolved it commits the seq after the newest.
func TestCLIResetFollowsTheNewestCheckpoint(t *testing.T) {
	w := newVFWorld(t, "")
	w.mustCLI("run", "--once")
	ctx := context.Background()
	asItStands := fold.WithViewWait(ctx, fold.ViewWait{Timeout: -1})
	store := offsets.NewStore(w.opts(), "tidemark-offsets", vfName)
	cp, err := store.Load(asItStands)
	if err != nil || cp == nil {
		t.Fatalf("checkpoint after the run: %v %v", cp, err)
	}

	txn := func(id string) *kgo.Client {
		cl, err := kgo.NewClient(append(w.opts(), kgo.TransactionalID(id))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		return cl
	}
	put := func(cl *kgo.Client, key string, value []byte) {
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "tidemark-offsets", Key: []byte(key), Value: value}).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
	x := txn("tidemark-other") // another connector, killed mid-commit
	put(x, "other", []byte("{}"))
	newer := *cp // this connector's newest checkpoint, committed after x began
	newer.Seq++
	b, err := schemas.EncodeCheckpoint(&newer)
	if err != nil {
		t.Fatal(err)
	}
	c := txn("tidemark-" + vfName)
	put(c, vfName, b)
	if err := c.EndTransaction(ctx, kgo.TryCommit); err != nil {
		t.Fatal(err)
	}

	code, out, errOut := w.cli("reset", "--yes", "--reason", "test")
	if code != exitFailure {
		t.Fatalf("reset while another transaction hides the newest checkpoint: exit %d, want %d (refused, run again)\n%s\n%s", code, exitFailure, out, errOut)
	}
	if got, err := store.Load(asItStands); err != nil || got.Seq != cp.Seq || got.LastReset != nil {
		t.Fatalf("the refused reset wrote a checkpoint: %+v, %v", got, err)
	}

	if err := x.EndTransaction(ctx, kgo.TryAbort); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = w.cli("reset", "--yes", "--reason", "test")
	if code != exitOK {
		t.Fatalf("reset once the other transaction is resolved: exit %d\n%s\n%s", code, out, errOut)
	}
	got, err := store.Load(ctx)
	if err != nil || got.LastReset == nil || got.Seq != newer.Seq+1 {
		t.Fatalf("after the reset: %+v, %v; want a reset at seq %d, after the newest checkpoint", got, err, newer.Seq+1)
	}
}

// TestCLIResetReplacesAnUnreadableCheckpoint: a checkpoint this build cannot
// read stops the run, whose hint is `tidemark reset`: the reset must then
// replace it, not stop on it too.
func TestCLIResetReplacesAnUnreadableCheckpoint(t *testing.T) {
	w := newVFWorld(t, "")
	w.mustCLI("run", "--once")
	ctx := context.Background()
	cl, err := kgo.NewClient(w.opts()...)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "tidemark-offsets", Key: []byte(vfName), Value: []byte(`{"version":99}`)}).FirstErr(); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := w.cli("run", "--once"); code != exitDecision {
		t.Fatalf("run on an unreadable checkpoint: exit %d, want %d\n%s", code, exitDecision, errOut)
	}
	if code, out, errOut := w.cli("reset", "--yes", "--reason", "unreadable checkpoint"); code != exitOK {
		t.Fatalf("reset of an unreadable checkpoint: exit %d, want 0\n%s\n%s", code, out, errOut)
	}
	cp, err := offsets.NewStore(w.opts(), "tidemark-offsets", vfName).Load(ctx)
	if err != nil || cp == nil || cp.LastReset == nil {
		t.Fatalf("checkpoint after the reset: %+v, %v", cp, err)
	}
	if code, _, errOut := w.cli("run", "--once"); code != exitOK {
		t.Fatalf("run after the reset: exit %d\n%s", code, errOut)
	}
}
