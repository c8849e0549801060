package kfakebroker

import (
	"fmt"
	"net"
	"sync"
)

// gates hold the connections that clients make to a starting cluster
// until New has set its transaction version, so that no client negotiates
// the other one: a connector that keeps retrying while `tidemark broker`
// restarts on its port reconnects at once. Each broker's gate first
// serves a private loopback listener, which only New's own client dials;
// the connections to the broker's address wait in its listen queue until
// release.
type gates struct {
	mu      sync.Mutex
	private map[string]string // broker address -> its private listener's
	all     []*gate
}

// listen returns a listen function for kfake.ListenFn that wraps base's
// listeners in gates.
func (gs *gates) listen(base func(network, address string) (net.Listener, error)) func(network, address string) (net.Listener, error) {
	return func(network, address string) (net.Listener, error) {
		ln, err := base(network, address)
		if err != nil {
			return nil, err
		}
		private, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			ln.Close()
			return nil, fmt.Errorf("kfake: private listener: %w", err)
		}
		g := &gate{Listener: ln, private: private}
		gs.mu.Lock()
		defer gs.mu.Unlock()
		if gs.private == nil {
			gs.private = map[string]string{}
		}
		gs.private[ln.Addr().String()] = private.Addr().String()
		gs.all = append(gs.all, g)
		return g, nil
	}
}

// privateAddr is where New's own client reaches the broker at addr.
func (gs *gates) privateAddr(addr string) string {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	if p, ok := gs.private[addr]; ok {
		return p
	}
	return addr
}

// release closes the private listeners: every broker accepts on its own
// address from then on, the connections that waited first.
func (gs *gates) release() {
	gs.mu.Lock()
	defer gs.mu.Unlock()
	for _, g := range gs.all {
		g.private.Close()
	}
}

// gate is a listener that accepts on its private listener until that is
// closed, and on its own address after.
type gate struct {
	net.Listener
	private net.Listener
}

// Accept returns the next connection the gate lets through.
func (g *gate) Accept() (net.Conn, error) {
	if c, err := g.private.Accept(); err == nil {
		return c, nil
	}
	return g.Listener.Accept()
}

// Close closes both listeners.
func (g *gate) Close() error {
	g.private.Close()
	return g.Listener.Close()
}
