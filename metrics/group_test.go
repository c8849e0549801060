package metrics_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/metrics"
)

// TestGroupServesEveryTask: a member's server exports the group's series
// once and every task's series labelled with the task; /readyz names the
// task of each reason; a task given up stops being exported.
func TestGroupServesEveryTask(t *testing.T) {
	g := metrics.NewGroup("shop", "v1")
	a := g.Task("public.orders", 0)
	b := g.Task("sales.customers", 0)
	g.ObserveAssigned(2)
	a.ObservePage(time.Millisecond, 3)
	a.ObserveCommit(connector.CommitInfo{Records: 3})
	b.ObservePage(time.Millisecond, 5)

	srv, err := g.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + srv.Addr() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := get("/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	for _, want := range []string{
		`tidemark_rows_read_total{connector="shop",task="public.orders"} 3`,
		`tidemark_rows_read_total{connector="shop",task="sales.customers"} 5`,
		`tidemark_group_tasks_running{connector="shop"} 2`,
		`tidemark_group_rebalances_total{connector="shop"} 1`,
		`tidemark_group_tasks_assigned_total{connector="shop"} 2`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if n := strings.Count(body, "tidemark_build_info{"); n != 1 {
		t.Errorf("build_info exported %d times", n)
	}

	// b stopped on its own: the member is not ready, and says which task.
	b.ObserveStop("safety_stop")
	code, body = get("/readyz")
	if code != 503 || !strings.Contains(body, "task sales.customers: safety stop") || strings.Contains(body, "task public.orders") {
		t.Errorf("/readyz: %d\n%s", code, body)
	}
	g.RemoveTask("sales.customers")
	g.ObserveRevoked(1)
	if code, body = get("/readyz"); code != 200 {
		t.Errorf("/readyz after b was given up: %d\n%s", code, body)
	}
	if _, body = get("/metrics"); strings.Contains(body, `task="sales.customers"`) || !strings.Contains(body, `tidemark_group_tasks_revoked_total{connector="shop"} 1`) {
		t.Errorf("/metrics after b was given up:\n%s", body)
	}
	// Losing the membership makes the member unready until it joins again.
	g.ObserveLost(1)
	if code, body = get("/readyz"); code != 503 || !strings.Contains(body, "not a member of the group") {
		t.Errorf("/readyz after the membership was lost: %d\n%s", code, body)
	}
}
