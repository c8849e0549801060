package postgres

import (
	"context"
	"errors"
	"net"

	"golang.org/x/sys/unix"
)

// socketOptions reads the options dialSettings sets from a connection.
func socketOptions(c net.Conn) (userTimeout, keepAlive, idle, interval, count int, err error) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return 0, 0, 0, 0, 0, errors.New("not a TCP connection")
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	var serr error
	err = rc.Control(func(fd uintptr) {
		get := func(level, opt int) int {
			v, err := unix.GetsockoptInt(int(fd), level, opt)
			serr = errors.Join(serr, err)
			return v
		}
		userTimeout = get(unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT)
		keepAlive = get(unix.SOL_SOCKET, unix.SO_KEEPALIVE)
		idle = get(unix.IPPROTO_TCP, unix.TCP_KEEPIDLE)
		interval = get(unix.IPPROTO_TCP, unix.TCP_KEEPINTVL)
		count = get(unix.IPPROTO_TCP, unix.TCP_KEEPCNT)
	})
	return userTimeout, keepAlive, idle, interval, count, errors.Join(err, serr)
}

// SocketOptions are the TCP options of a connection of the source's pool
// (Linux): TCP_USER_TIMEOUT in ms, and the keepalive's on/off, idle,
// interval (s) and count.
func (s *Source) SocketOptions(ctx context.Context) (userTimeout, keepAlive, idle, interval, count int, err error) {
	c, err := s.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer c.Release()
	return socketOptions(c.Conn().PgConn().Conn())
}

// ListenerSocketOptions is SocketOptions of the listener's connection.
func (l *Listener) SocketOptions(ctx context.Context) (userTimeout, keepAlive, idle, interval, count int, err error) {
	conn, err := l.connect(ctx)
	if err != nil {
		return
	}
	defer closeConn(conn)
	return socketOptions(conn.PgConn().Conn())
}
