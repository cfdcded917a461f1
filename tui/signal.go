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
	who := r.Session
	if r.Step != "" {
		who += "/" + r.Step
	}
	var err error
	switch {
	case r.Result == client.ResultRecorded:
		_, err = fmt.Fprintf(w, "%s %s: recorded at stream sequence %d — %s\n", r.Signal, who, r.Seq, r.Detail)
	case r.Detail == "":
		_, err = fmt.Fprintf(w, "%s %s: %s\n", r.Signal, who, r.Result)
	default:
		_, err = fmt.Fprintf(w, "%s %s: %s — %s\n", r.Signal, who, r.Result, r.Detail)
	}
	return err
}
