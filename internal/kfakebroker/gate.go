package kfakebroker

import (
	"net"
	"sync"
)

// gates hold the connections that clients make to a starting cluster
// until New has set its transaction version, so that no client negotiates
// the other one: a connector that keeps retrying while `tidemark broker`
// restarts on its port reconnects at once. The connections of New's own
// client are let through (allow).
type gates struct {
	mu      sync.Mutex
	open    bool
	allowed map[string]bool // remote addresses let through early
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
		g := &gate{Listener: ln, gs: gs, out: make(chan net.Conn), dead: make(chan struct{})}
		gs.mu.Lock()
		gs.all = append(gs.all, g)
		gs.mu.Unlock()
		go g.pump()
		return g, nil
	}
}

// allow lets the connection from the client address addr through.
func (gs *gates) allow(addr string) {
	gs.mu.Lock()
	if gs.allowed == nil {
		gs.allowed = map[string]bool{}
	}
	gs.allowed[addr] = true
	var let []pending
	for _, g := range gs.all {
		kept := g.parked[:0]
		for _, c := range g.parked {
			if c.RemoteAddr().String() == addr {
				let = append(let, pending{g, c})
			} else {
				kept = append(kept, c)
			}
		}
		g.parked = kept
	}
	gs.mu.Unlock()
	for _, p := range let {
		p.g.deliver(p.c)
	}
}

// release lets every connection through, held ones and later ones.
func (gs *gates) release() {
	gs.mu.Lock()
	gs.open = true
	var let []pending
	for _, g := range gs.all {
		for _, c := range g.parked {
			let = append(let, pending{g, c})
		}
		g.parked = nil
	}
	gs.mu.Unlock()
	for _, p := range let {
		p.g.deliver(p.c)
	}
}

type pending struct {
	g *gate
	c net.Conn
}

// gate is a listener whose connections reach Accept only as gates allow.
type gate struct {
	net.Listener
	gs     *gates
	out    chan net.Conn
	dead   chan struct{} // closed when the listener fails
	err    error
	parked []net.Conn // guarded by gs.mu
}

func (g *gate) pump() {
	for {
		c, err := g.Listener.Accept()
		if err != nil {
			g.err = err
			close(g.dead)
			g.gs.mu.Lock()
			for _, c := range g.parked {
				c.Close()
			}
			g.parked = nil
			g.gs.mu.Unlock()
			return
		}
		g.gs.mu.Lock()
		let := g.gs.open || g.gs.allowed[c.RemoteAddr().String()]
		if !let {
			g.parked = append(g.parked, c)
		}
		g.gs.mu.Unlock()
		if let {
			g.deliver(c)
		}
	}
}

func (g *gate) deliver(c net.Conn) {
	select {
	case g.out <- c:
	case <-g.dead:
		c.Close()
	}
}

// Accept returns the next connection that the gates let through.
func (g *gate) Accept() (net.Conn, error) {
	select {
	case c := <-g.out:
		return c, nil
	case <-g.dead:
		return nil, g.err
	}
}
