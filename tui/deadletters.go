package tui

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"

	"github.com/loopbus/loopbus/bus"
)

// DeadLetters writes a dead-letter listing: Add writes one letter (a JSON
// object per line with JSON, else a line for people) and counts it; Total
// is the closing count by consumer.
type DeadLetters struct {
	w          io.Writer
	json       bool
	total      int
	byConsumer map[string]int
}

// NewDeadLetters returns a listing written to w, as JSON lines when asJSON.
func NewDeadLetters(w io.Writer, asJSON bool) *DeadLetters {
	return &DeadLetters{w: w, json: asJSON, byConsumer: map[string]int{}}
}

// Add writes one dead letter.
func (d *DeadLetters) Add(dl bus.DeadLetter) error {
	d.total++
	d.byConsumer[dl.Consumer]++
	if d.json {
		line, err := json.Marshal(dl)
		if err != nil {
			return err
		}
		_, err = d.w.Write(append(line, '\n'))
		return err
	}
	_, err := fmt.Fprintf(d.w, "%6d  %s  event seq %-6d %-40s by %-12s %s\n", dl.Seq,
		dl.Stored.Format("2006-01-02T15:04:05.000Z"), dl.SourceSeq, dl.Subject, dl.Consumer, dl.Reason)
	return err
}

// Total writes "N dead letter(s), n by consumer, …" as one line to w.
func (d *DeadLetters) Total(w io.Writer) {
	fmt.Fprintf(w, "%d dead letter(s)", d.total)
	for _, c := range slices.Sorted(maps.Keys(d.byConsumer)) {
		fmt.Fprintf(w, ", %d by %s", d.byConsumer[c], c)
	}
	fmt.Fprintln(w)
}
