package diagnose

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// waitingAfter is when a running check first says it is still waiting, and
// how often after that.
const (
	waitingAfter = 2 * time.Second
	waitingEvery = 5 * time.Second
)

// Text prints each check as it ends, for a person watching; a check that
// takes long says what it is waiting for. It implements Progress.
type Text struct {
	w io.Writer
	// waitingAfter is when a running check first says it still waits.
	waitingAfter time.Duration
	mu           sync.Mutex
	timer        *time.Timer
	start        time.Time
	name         string
}

// NewText returns a Text writing to w.
func NewText(w io.Writer) *Text { return &Text{w: w, waitingAfter: waitingAfter} }

// Started implements Progress.
func (t *Text) Started(name string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.name, t.start = name, time.Now()
	t.timer = time.AfterFunc(t.waitingAfter, t.waiting)
}

func (t *Text) waiting() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer == nil {
		return
	}
	fmt.Fprintf(t.w, "  ...  %-*s still waiting (%s)\n", nameWidth, t.name, time.Since(t.start).Round(time.Second))
	t.timer.Reset(waitingEvery)
}

// Finished implements Progress.
func (t *Text) Finished(c Check) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
	writeCheck(t.w, c)
}

// Close stops a pending waiting message; call it when the run has ended.
func (t *Text) Close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.timer != nil {
		t.timer.Stop()
		t.timer = nil
	}
}

// nameWidth fits the longest built-in check name, "upstream /workflows".
const nameWidth = 19

// indent is where details start: under the first line's detail.
var indent = strings.Repeat(" ", 2+4+1+nameWidth+1)

func writeCheck(w io.Writer, c Check) {
	lines := strings.Split(c.Detail, "\n")
	fmt.Fprintf(w, "  %-4s %-*s %s\n", strings.ToUpper(string(c.Status)), nameWidth, c.Name, lines[0])
	for _, l := range lines[1:] {
		fmt.Fprintf(w, "%s%s\n", indent, l)
	}
	if c.Hint != "" {
		fmt.Fprintf(w, "%shint: %s\n", indent, c.Hint)
	}
}

// WriteSummary ends the text output with the verdict.
func WriteSummary(w io.Writer, r Report) {
	var failed, warned []string
	for _, c := range r.Checks {
		switch c.Status {
		case Fail:
			failed = append(failed, c.Name)
		case Warn:
			warned = append(warned, c.Name)
		}
	}
	switch {
	case len(failed) > 0:
		fmt.Fprintf(w, "\nFAILED: %s. Start with the first failure: the checks after it often fail because of it.\n", strings.Join(failed, ", "))
	case len(warned) > 0:
		fmt.Fprintf(w, "\nOK, with warnings: %s.\n", strings.Join(warned, ", "))
	default:
		fmt.Fprintln(w, "\nOK: every check passed.")
	}
}

// WriteText writes the whole report as text (what Text prints as it goes,
// and the summary).
func WriteText(w io.Writer, r Report) {
	for _, c := range r.Checks {
		writeCheck(w, c)
	}
	WriteSummary(w, r)
}

// WriteJSON writes the report as one JSON object.
func WriteJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}
