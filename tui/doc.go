// Package tui shows loopbus to people in a terminal: status text, event
// lines and the live screen.
//
// WriteStatus is the text of `loopbus status` and `replay`; EventLine is
// the line per event `loopbus watch` prints when its output is not a
// terminal, and Progress the lines of `run` and `wait`. The live screen is
// a bubbletea program (Model, run by Start or NewView) fed with the events
// a caller reads (client.Watch) and sending signals through a Signaler; it
// imports neither the bus nor NATS.
package tui
