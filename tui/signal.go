package tui

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/loopbus/loopbus/client"
)

// WriteSignalResult writes what became of one signal: a JSON object per
// line, or "pause s1/b: applied — step b paused", or "pause s1: recorded
// at stream sequence 42 — takes effect when …".
func WriteSignalResult(w io.Writer, r client.SignalResult, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(w).Encode(r)
	}
	_, err := fmt.Fprintln(w, r)
	return err
}
