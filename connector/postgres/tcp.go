package postgres

import (
	"net"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// A server that vanishes without a reset (a failover that leaves the old
// address dead, a network partition) sends nothing more, and by the
// kernel's defaults a connection to it is given up only after some 15
// minutes of retransmissions when a query is not yet acknowledged, or 2.5
// minutes of keepalive probes while a reply is awaited: a pass would hang
// that long. Every connection of the source (the pool's, the listener's)
// gives up within deadPeerAfter instead, and the engine's retry takes over
// (docs/operating.md, "Logs and progress"). A slow query is not a dead peer: the
// server's kernel acknowledges the probes and the query's bytes.
const (
	deadPeerAfter     = 30 * time.Second
	keepAliveIdle     = 10 * time.Second
	keepAliveInterval = 5 * time.Second
	keepAliveCount    = 4 // 10 s + 4 × 5 s = 30 s
)

// dialSettings makes cc's connections find a dead peer within
// deadPeerAfter, keeping the connect timeout of the DSN.
func dialSettings(cc *pgconn.Config) {
	d := &net.Dialer{
		Timeout: cc.ConnectTimeout,
		KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		},
		Control: userTimeout(deadPeerAfter),
	}
	cc.DialFunc = d.DialContext
}
