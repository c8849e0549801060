package feed

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"testing"
	"time"
)

// serveLimited serves a feed of five rows under l on a loopback port.
func serveLimited(t *testing.T, l Limits) string {
	t.Helper()
	m := newMem()
	seed(m, 5)
	s, err := New(Config{Table: m, Key: testKey})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := l.Server(s)
	go func() { _ = hs.Serve(l.Listener(ln)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = hs.Shutdown(ctx)
		hs.Close()
	})
	return ln.Addr().String()
}

// closedWithin reports whether the server closes c within d (a read sees
// EOF or a reset), reading and discarding whatever comes first.
func closedWithin(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// request sends one keep-alive GET and reads its response.
func request(t *testing.T, c net.Conn) *http.Response {
	t.Helper()
	fmt.Fprint(c, "GET /?limit=2 HTTP/1.1\r\nHost: feed\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp
}

// Idle keep-alive connections, connections that never send a request and
// ones that trickle their headers are closed by the server's timeouts.
func TestLimitsCloseIdleAndSlowConnections(t *testing.T) {
	addr := serveLimited(t, Limits{ReadHeaderTimeout: 300 * time.Millisecond, ReadTimeout: 400 * time.Millisecond,
		WriteTimeout: time.Second, IdleTimeout: 300 * time.Millisecond, MaxConns: 100})
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	idle := dial()
	if r := request(t, idle); r.StatusCode != 200 {
		t.Fatalf("status %d", r.StatusCode)
	}
	silent := dial()
	trickle := dial()
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		fmt.Fprint(trickle, "GET /?limit=2 HTTP/1.1\r\nHost: feed\r\n")
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			if _, err := fmt.Fprintf(trickle, "X-%d: y\r\n", i); err != nil {
				return
			}
		}
	}()
	for name, c := range map[string]net.Conn{"idle keep-alive": idle, "silent": silent, "trickling headers": trickle} {
		if !closedWithin(c, 3*time.Second) {
			t.Errorf("%s connection still open after 3s", name)
		}
	}
}

// Past MaxConns open connections, a new one is answered 503 with a
// Retry-After and closed at once; once one closes, connections are served
// again. The file descriptors the server holds stay bounded.
func TestLimitsMaxConns(t *testing.T) {
	addr := serveLimited(t, Limits{ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second,
		WriteTimeout: 5 * time.Second, IdleTimeout: 10 * time.Second, MaxConns: 2})
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if r := request(t, c); r.StatusCode != 200 {
			t.Fatalf("status %d", r.StatusCode)
		}
		held = append(held, c)
	}
	fds := openFDs(t)
	for range 50 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
			t.Fatalf("over the limit: %v %v", resp, err)
		}
		if !closedWithin(c, time.Second) {
			t.Fatal("an over-limit connection was kept open")
		}
		c.Close()
	}
	if grown := openFDs(t) - fds; grown > 5 {
		t.Errorf("%d more file descriptors after 50 refused connections", grown)
	}
	held[0].Close()
	deadline := time.Now().Add(3 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		r := request(t, c)
		c.Close()
		if r.StatusCode == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d after a connection closed", r.StatusCode)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatalf("count open files: %v", err)
	}
	return len(ents)
}

func TestLimitsDefaults(t *testing.T) {
	d := DefaultLimits()
	hs := d.Server(http.NotFoundHandler())
	if hs.ReadHeaderTimeout <= 0 || hs.ReadTimeout <= 0 || hs.WriteTimeout <= 0 || hs.IdleTimeout <= 0 || d.MaxConns <= 0 {
		t.Errorf("defaults leave a limit off: %+v", d)
	}
}
