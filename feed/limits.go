package feed

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound what one client can hold of a server: how long it may take
// to send a request, to read the answer, how long an idle keep-alive
// connection is kept, and how many connections are open at once. `tidemark
// feed serve` applies them (docs/http-source.md); embed them with Server and
// Listener.
type Limits struct {
	// ReadHeaderTimeout bounds reading a request's headers, ReadTimeout the
	// whole request, WriteTimeout writing the answer; IdleTimeout closes a
	// keep-alive connection that sends no next request.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxConns is the most connections open at once. A connection past it
	// is answered 503 with Retry-After: 1 and closed.
	MaxConns int
}

// DefaultLimits are those of `tidemark feed serve`: 10s for headers, 30s
// per request, 60s per answer (a page of 500 rows takes milliseconds), 60s
// idle, 256 connections.
func DefaultLimits() Limits {
	return Limits{ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second,
		WriteTimeout: 60 * time.Second, IdleTimeout: 60 * time.Second, MaxConns: 256}
}

// Server returns an http.Server for h with l's timeouts.
func (l Limits) Server(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: l.ReadHeaderTimeout, ReadTimeout: l.ReadTimeout,
		WriteTimeout: l.WriteTimeout, IdleTimeout: l.IdleTimeout}
}

// Listener wraps ln so that at most l.MaxConns accepted connections are
// open at once (0: no bound).
func (l Limits) Listener(ln net.Listener) net.Listener {
	if l.MaxConns <= 0 {
		return ln
	}
	return &limitListener{Listener: ln, slots: make(chan struct{}, l.MaxConns)}
}

// busy is the whole answer to a connection past the limit.
const busy = "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n" +
	"Connection: close\r\nContent-Length: 85\r\n\r\n" +
	`{"error":{"code":"unavailable","message":"too many connections; retry in a second"}}` + "\n"

type limitListener struct {
	net.Listener
	slots chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.slots <- struct{}{}:
			return &slotConn{Conn: c, release: func() { <-l.slots }}, nil
		default:
			// Refuse without blocking the accept loop: the answer fits in
			// the socket buffer; the deadline bounds a peer that never
			// reads it.
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte(busy))
			_ = c.Close()
		}
	}
}

// slotConn gives its slot back once, when closed.
type slotConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *slotConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
