package main

import (
	"context"
	"testing"
	"time"
)

// TestStopWaitsForAStoppingTask: the group's revoke callback runs on the
// client's goroutine while shutdown may already be stopping the same task;
// it must not acknowledge the revoke (and let another member start the
// task) before the task has ended.
func TestStopWaitsForAStoppingTask(t *testing.T) {
	s := &supervisor{env: &taskEnv{}, running: map[string]*runningTask{}}
	ctx, cancel := context.WithCancel(context.Background())
	rt := &runningTask{cancel: cancel, done: make(chan struct{})}
	s.running["a"] = rt
	stopped := make(chan time.Time, 1)
	go func() {
		<-ctx.Done()
		time.Sleep(300 * time.Millisecond) // its transaction commits or aborts
		stopped <- time.Now()
		close(rt.done)
	}()
	go s.stop([]string{"a"}) // shutdown
	time.Sleep(20 * time.Millisecond)
	s.stop([]string{"a"}) // the revoke callback
	acked := time.Now()
	if st := <-stopped; acked.Before(st) {
		t.Fatalf("revoke acknowledged %v before the task stopped", st.Sub(acked))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.running) != 0 {
		t.Errorf("stopped tasks still listed: %v", s.running)
	}
}
