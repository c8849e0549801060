package kfakebroker

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// A client of a cluster New started negotiates transaction.version 1.
func TestNewFinalizesTheTransactionVersion(t *testing.T) {
	c, err := New(nil, kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	resp, err := kmsg.NewPtrApiVersionsRequest().RequestWith(context.Background(), cl)
	if err != nil {
		t.Fatal(err)
	}
	var level int16 = -1
	for _, f := range resp.FinalizedFeatures {
		if f.Name == "transaction.version" {
			level = f.MaxVersionLevel
		}
	}
	if level != TransactionVersion {
		t.Errorf("finalized transaction.version %d; want %d", level, TransactionVersion)
	}
}

// The gate holds a connection to the broker's address until the gates
// open, and lets New's own one (to the private address) through while
// others wait.
func TestGateHoldsConnectionsUntilReleased(t *testing.T) {
	gs := &gates{}
	ln, err := gs.listen(net.Listen)("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func(addr string) net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	early := dial(ln.Addr().String())
	select {
	case c := <-accepted:
		t.Fatalf("a connection from %s got through a closed gate", c.RemoteAddr())
	case <-time.After(100 * time.Millisecond):
	}
	own := dial(gs.privateAddr(ln.Addr().String()))
	if c := <-accepted; c.RemoteAddr().String() != own.LocalAddr().String() {
		t.Fatalf("accepted %s; want New's own %s", c.RemoteAddr(), own.LocalAddr())
	}
	gs.release()
	if c := <-accepted; c.RemoteAddr().String() != early.LocalAddr().String() {
		t.Fatalf("accepted %s after the release; want the held %s", c.RemoteAddr(), early.LocalAddr())
	}
	later := dial(ln.Addr().String())
	if c := <-accepted; c.RemoteAddr().String() != later.LocalAddr().String() {
		t.Fatalf("accepted %s; want %s, through the open gate", c.RemoteAddr(), later.LocalAddr())
	}
	ln.Close()
	if _, ok := <-accepted; ok {
		t.Fatal("Accept returned a connection after Close")
	}
}
