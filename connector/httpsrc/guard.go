package httpsrc

import (
	"context"
	"crypto/sha256"
	"fmt"
	"sync"

	"github.com/tidemark/tidemark/connector"
)

// maxSeen bounds the cursors a walk remembers for cycle detection (about
// 64 bytes each). A longer cycle of pages with items is not detected; one
// of empty pages is, by the empty-page bound.
const maxSeen = 1 << 16

// guard follows the walk the engine drives (each request carrying the
// previous page's next cursor) and stops it when the server makes no
// progress: a next cursor that this walk already requested (the same
// cursor again, or a cycle), or MaxEmptyPages pages in a row without items
// that say there is more. Empty pages back off. See docs/http-source.md,
// "When the server makes no progress".
type guard struct {
	mu    sync.Mutex
	next  string           // the next cursor of the last page answered; "" none
	seen  map[[16]byte]int // request cursors answered in this walk -> page number
	order [][16]byte       // seen in insertion order, to bound it
	pages int              // pages answered in this walk
	empty int              // pages in a row without items and with more
}

func cursorKey(c string) [16]byte {
	h := sha256.Sum256([]byte(c))
	return [16]byte(h[:16])
}

// before is called before a request for cursor: a request that does not
// continue the walk (a new pass, or a resume from the checkpoint) starts
// a new one; one that follows an empty page waits first.
func (s *Source) before(ctx context.Context, cursor string) error {
	g := &s.guard
	g.mu.Lock()
	if cursor == "" || cursor != g.next {
		g.next, g.seen, g.order, g.pages, g.empty = "", nil, nil, 0, 0
	}
	empty := g.empty
	g.mu.Unlock()
	if empty == 0 {
		return nil
	}
	wait := backoff(s.cfg.BackoffBase, s.cfg.BackoffMax, empty)
	s.cfg.Logger.Info("the changes API answered with an empty page that says there is more; waiting before the next request",
		"empty_pages_in_a_row", empty, "of", s.cfg.MaxEmptyPages, "wait", wait)
	return s.cfg.Clock.Sleep(ctx, wait)
}

// after checks a page answered for the request identified by key (the
// cursor, or with link pagination the request URL) and cursor.
func (s *Source) after(key, cursor string, page connector.Page) error {
	g := &s.guard
	g.mu.Lock()
	defer g.mu.Unlock()
	if page.End {
		g.next, g.seen, g.order, g.pages, g.empty = "", nil, nil, 0, 0
		return nil
	}
	g.pages++
	if g.seen == nil {
		g.seen = map[[16]byte]int{}
	}
	k := cursorKey(key)
	if _, ok := g.seen[k]; !ok {
		if len(g.order) == maxSeen {
			delete(g.seen, g.order[0])
			g.order = g.order[1:]
		}
		g.seen[k] = g.pages
		g.order = append(g.order, k)
	}
	if page.Next == key {
		return s.noProgress(fmt.Sprintf("the page after cursor %s named that same cursor as the next one, so the walk would read it again for ever",
			showCursor(cursor)))
	}
	if n, ok := g.seen[cursorKey(page.Next)]; ok {
		return s.noProgress(fmt.Sprintf("the page after cursor %s named cursor %s as the next one, which this walk already requested (page %d of %d): the cursors form a cycle",
			showCursor(cursor), showCursor(page.Next), n, g.pages))
	}
	if len(page.Rows) == 0 {
		g.empty++
		if g.empty >= s.cfg.MaxEmptyPages {
			return s.noProgress(fmt.Sprintf("%d pages in a row came back without items but saying there is more (the last after cursor %s, next cursor %s)",
				g.empty, showCursor(cursor), showCursor(page.Next)))
		}
	} else {
		g.empty = 0
	}
	g.next = page.Next
	return nil
}

func (s *Source) noProgress(what string) error {
	s.guard.next, s.guard.seen, s.guard.order, s.guard.pages, s.guard.empty = "", nil, nil, 0, 0
	return &connector.StopError{
		Reason: "the changes API makes no progress: " + what,
		Hint: "tidemark stops rather than loop (the open transaction is aborted). Report the server's pagination to its owner; " +
			"once it is fixed, `tidemark status --config FILE` shows the watermark and `tidemark reset --config FILE --to-watermark <that watermark> --yes` " +
			"resumes there without losing rows (the open pass restarts from its lower bound), or `tidemark reset --config FILE --yes` re-reads everything",
	}
}
