package connector_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/fold"
)

// TestWakeStartsAPassAtOnce: with a long poll interval, a wake-up starts
// the next pass at once, and a row written just before it is published
// well before the poll interval would have passed.
func TestWakeStartsAPassAtOnce(t *testing.T) {
	r := newRig(t)
	m := newMemTable()
	m.set("a", t0, "v1", false)
	wake := make(chan struct{}, 1)
	e, _ := r.engine(m, connector.Config{PollInterval: time.Hour, Wake: wake})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { _, err := e.Run(ctx, connector.Continuous); done <- err }()
	waitSeq(t, r, 1)
	m.set("b", time.Now(), "v1", false)
	at := time.Now()
	wake <- struct{}{}
	deadline := time.Now().Add(10 * time.Second)
	for {
		st := r.assertFoldedQuiet()
		if _, ok := st["b"]; ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the row written before the wake-up was not published within 10s (poll interval 1h)")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("published %s after the wake-up", time.Since(at).Round(time.Millisecond))
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// assertFoldedQuiet folds the topic and returns its live keys.
func (r *rig) assertFoldedQuiet() map[string]string {
	r.t.Helper()
	st, err := fold.Map(context.Background(), r.opts, r.topic)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range st.Live {
		out[k] = fmt.Sprint(string(v.Value))
	}
	return out
}
