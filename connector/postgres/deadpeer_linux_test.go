package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector/postgres"
	"github.com/tidemark/tidemark/test/harness"
)

// A server that vanishes without a reset (a failover that leaves the old
// address dead, a partition) must not hold a pass for the kernel's
// defaults: some 15 minutes of retransmissions for a query not yet
// acknowledged, and 2.5 minutes of keepalive probes while waiting for a
// reply. The pool's and the listener's connections give up within about
// 30 s (docs/operating.md, "Logs and progress").
func TestConnectionsGiveUpOnADeadPeer(t *testing.T) {
	db := harness.NewDB(t)
	db.Exec(t, `CREATE TABLE items (id bigint PRIMARY KEY, updated_at timestamptz NOT NULL)`)
	ctx := context.Background()
	src := open(t, config(db, "items"))
	l, err := postgres.Listen(ctx, config(db, "items"), postgres.ListenConfig{Channel: "tcp_test"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for name, read := range map[string]func(context.Context) (int, int, int, int, int, error){
		"pool": src.SocketOptions, "listener": l.SocketOptions,
	} {
		user, ka, idle, intvl, cnt, err := read(ctx)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if user == 0 || time.Duration(user)*time.Millisecond > 30*time.Second {
			t.Errorf("%s: TCP_USER_TIMEOUT %d ms; want at most 30 s (0 is the kernel's retransmissions, some 15 minutes)", name, user)
		}
		if probe := time.Duration(idle+intvl*cnt) * time.Second; ka == 0 || probe > 30*time.Second {
			t.Errorf("%s: keepalive %d, idle %d s, interval %d s, count %d: a dead peer is found after %s; want at most 30 s", name, ka, idle, intvl, cnt, probe)
		}
	}
}
