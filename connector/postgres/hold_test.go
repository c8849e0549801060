package postgres

import (
	"crypto/tls"
	"net"
	"testing"
)

// TestHoldableConnections: the listener holds only where what a read of
// the connection brings is all the driver's buffer shows. A TLS connection
// keeps the records it read beyond the one it returned: holding there would
// take a backlog for none, and leave the listener behind the server.
func TestHoldableConnections(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tcp, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	for _, c := range []struct {
		name string
		conn net.Conn
		want bool
	}{
		{"TCP", tcp, true},
		{"TLS over TCP", tls.Client(tcp, &tls.Config{InsecureSkipVerify: true}), false},
		{"another kind", a, false},
	} {
		if got := holdable(c.conn); got != c.want {
			t.Errorf("%s: holdable %v, want %v", c.name, got, c.want)
		}
	}
}
