//go:build !linux

package postgres

import (
	"syscall"
	"time"
)

// userTimeout is Linux's TCP_USER_TIMEOUT; elsewhere only the keepalive
// finds a dead peer.
func userTimeout(time.Duration) func(network, address string, c syscall.RawConn) error {
	return nil
}
