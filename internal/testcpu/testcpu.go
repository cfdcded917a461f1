// Package testcpu measures CPU time for benchmarks.
package testcpu

import (
	"syscall"
	"testing"
	"time"
)

// Used is the user and system CPU time used so far by this process and its
// waited-for children (agents, commands): the difference of two readings
// is what a benchmark's work cost the machine, whichever process did it.
func Used(tb testing.TB) time.Duration {
	tb.Helper()
	var total time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			tb.Fatal(err)
		}
		total += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return total
}
