// Package e2e holds end-to-end tests that build the loopbus binary and drive
// it as a user would: pipelines on disk, the embedded NATS default, real
// processes, real signals.
package e2e
