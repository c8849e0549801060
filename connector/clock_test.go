package connector_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tidemark/tidemark/connector"
	"github.com/tidemark/tidemark/schemas"
)

// clockedTable is a memTable whose shape and clock come in one call
// (connector.ClockedReshaper), at a fixed time; Reshape and Now alone are
// counted, since the engine should not need them.
type clockedTable struct {
	*memTable
	now                time.Time
	reshapeNows, alone atomic.Int32
}

func (c *clockedTable) ReshapeNow(context.Context) (*connector.ShapeChange, time.Time, error) {
	c.reshapeNows.Add(1)
	return nil, c.now, nil
}

func (c *clockedTable) Reshape(context.Context) (*connector.ShapeChange, error) {
	c.alone.Add(1)
	return nil, nil
}

func (c *clockedTable) Now(context.Context) (time.Time, error) {
	c.alone.Add(1)
	return c.now, nil
}

// TestPassTakesShapeAndClockInOneCall: a pass begins with the source's shape
// and clock in one call when the source offers it (ClockedReshaper), and
// the clock is the pass's cap: a row dated after it is published, but the
// watermark stops at the clock (docs/design.md, "Watermark").
func TestPassTakesShapeAndClockInOneCall(t *testing.T) {
	r := newRig(t)
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	m := newMemTable()
	m.set("a", t0, "1", false)
	m.set("b", t0.Add(time.Hour), "2", false) // after the clock below
	src := &clockedTable{memTable: m, now: t0.Add(time.Minute)}
	r.once(src, connector.Config{PageSize: 10, Margin: time.Second})
	if n := src.reshapeNows.Load(); n == 0 {
		t.Fatal("the pass did not call ReshapeNow")
	}
	if n := src.alone.Load(); n != 0 {
		t.Errorf("Reshape or Now called %d times besides ReshapeNow", n)
	}
	r.assertFolded(m.expected())
	cp, err := r.store().Load(context.Background())
	if err != nil || cp == nil {
		t.Fatalf("checkpoint: %v, %v", cp, err)
	}
	if want := schemas.FormatTime(src.now); cp.Watermark != want {
		t.Errorf("watermark %s; want the clock ReshapeNow returned, %s", cp.Watermark, want)
	}
}
