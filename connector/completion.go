package connector

import (
	"fmt"
	"strings"
	"time"

	"github.com/tidemark/tidemark/schemas"
)

// Completion is the record a run ends with (docs/design.md, "Proof"): what was done,
// up to where, and the evidence that the end was reached.
type Completion struct {
	Connector   string `json:"connector"`
	RunID       string `json:"run_id"`
	Fingerprint string `json:"fingerprint"`
	// ResumedFrom says where the run started: fresh, or resumed at which
	// committed position.
	ResumedFrom string `json:"resumed_from"`
	// View is the boundary of what the run covered.
	View View `json:"view"`
	// Committed transactions and pages of this run.
	Transactions int64 `json:"transactions"`
	Pages        int64 `json:"pages"`
	Passes       int   `json:"passes"`
	// Row counts of this run.
	Raw        int64 `json:"raw"`
	Published  int64 `json:"published"`
	Deduped    int64 `json:"deduped"`
	Tombstones int64 `json:"tombstones"`
	// Reread rows came from the window below the watermark a pass started
	// from (the margin's cost); DedupeEntries is the size of the dedupe
	// set at the end.
	Reread        int64 `json:"reread"`
	DedupeEntries int64 `json:"dedupe_entries"`
	// Termination says why the run ended and the evidence for the end.
	Termination string `json:"termination"`
	// Reconciliation is the result of the hard-delete sweep, if one ran.
	Reconciliation string `json:"reconciliation"`
	// Checkpoint seq committed last.
	Seq        int64   `json:"seq"`
	StartedAt  string  `json:"started_at"`
	FinishedAt string  `json:"finished_at"`
	Seconds    float64 `json:"seconds"`
	RowsPerSec float64 `json:"rows_per_second"`
}

// View is the boundary of the source view a run reached.
type View struct {
	// Watermark committed at the end (W); "" = minus infinity.
	Watermark string `json:"watermark"`
	// PassLow is the lower bound of the last finished pass.
	PassLow string `json:"pass_low"`
	// EndCursor is the cursor after which the source returned the end.
	EndCursor string `json:"end_cursor"`
	// EndObservedAt is when the end was observed.
	EndObservedAt string `json:"end_observed_at"`
}

func (e *Engine) completion(started time.Time, why string) *Completion {
	cp := e.committed
	c := &Completion{
		Connector:      e.cfg.Name,
		RunID:          e.runID,
		Fingerprint:    e.cfg.Fingerprint,
		ResumedFrom:    e.resumedFrom,
		Transactions:   cp.Counters.Transactions - e.startCounters.Transactions,
		Pages:          cp.Counters.Pages - e.startCounters.Pages,
		Passes:         e.passesRun,
		Raw:            cp.Counters.Raw - e.startCounters.Raw,
		Published:      cp.Counters.Published - e.startCounters.Published,
		Deduped:        cp.Counters.Deduped - e.startCounters.Deduped,
		Tombstones:     cp.Counters.Tombstones - e.startCounters.Tombstones,
		DedupeEntries:  cp.Boundary.Entries,
		Reconciliation: "not run",
		Seq:            cp.Seq,
		StartedAt:      schemas.FormatTime(started),
	}
	// Rows of a pass that committed nothing (all deduplicated) are not in
	// the committed counters; report what this process actually read.
	if e.cp != nil {
		c.Raw = e.cp.Counters.Raw - e.startCounters.Raw
		c.Deduped = e.cp.Counters.Deduped - e.startCounters.Deduped
		c.Reread = e.cp.Counters.Reread - e.startCounters.Reread
		c.Pages = e.cp.Counters.Pages - e.startCounters.Pages
	}
	c.View.Watermark = cp.Watermark
	if !e.lastEnd.at.IsZero() {
		c.View.PassLow = e.lastEnd.since
		c.View.EndCursor = e.lastEnd.cursor
		c.View.EndObservedAt = schemas.FormatTime(e.lastEnd.at)
		if why == "caught up" {
			why = fmt.Sprintf("caught up: the source returned no rows after cursor %q (pass from updated_at >= %s, %d pages) at %s, and that position is committed",
				e.lastEnd.cursor, e.lastEnd.since, e.lastEnd.pages, c.View.EndObservedAt)
		}
	}
	c.Termination = why
	if e.lastSweep != nil {
		c.Reconciliation = e.lastSweep.String()
	} else if cp.LastSweep != nil {
		c.Reconciliation = fmt.Sprintf("not run in this run; last sweep at %s tombstoned %d and repaired %d", cp.LastSweep.At, cp.LastSweep.Tombstoned, cp.LastSweep.Repaired)
	}
	now := e.cfg.Now()
	c.FinishedAt = schemas.FormatTime(now)
	c.Seconds = now.Sub(started).Seconds()
	if c.Seconds > 0 {
		c.RowsPerSec = float64(c.Raw) / c.Seconds
	}
	return c
}

// Text renders the completion record for people.
func (c *Completion) Text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "tidemark run %s of connector %q\n", c.RunID, c.Connector)
	fmt.Fprintf(&b, "  started:      %s (%s)\n", c.StartedAt, c.ResumedFrom)
	fmt.Fprintf(&b, "  finished:     %s after %.1fs\n", c.FinishedAt, c.Seconds)
	fmt.Fprintf(&b, "  fingerprint:  %s\n", c.Fingerprint)
	fmt.Fprintf(&b, "  watermark:    %s\n", orInf(c.View.Watermark))
	fmt.Fprintf(&b, "  committed:    %d transactions, %d pages, %d passes (checkpoint seq %d)\n", c.Transactions, c.Pages, c.Passes, c.Seq)
	fmt.Fprintf(&b, "  rows:         %d read (%d re-read below the watermark), %d published (%d tombstones), %d deduplicated; dedupe set %d entries\n",
		c.Raw, c.Reread, c.Published, c.Tombstones, c.Deduped, c.DedupeEntries)
	fmt.Fprintf(&b, "  throughput:   %.0f rows/s\n", c.RowsPerSec)
	fmt.Fprintf(&b, "  termination:  %s\n", c.Termination)
	fmt.Fprintf(&b, "  reconciliation: %s\n", c.Reconciliation)
	return b.String()
}
