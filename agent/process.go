package agent

import (
	"context"
	"fmt"

	"github.com/loopbus/loopbus/workspace/procrun"
)

// RunProcess runs argv as job's agent, the way every command-line backend
// does: in job.Dir with job.Env, job.Prompt on stdin, in its own process
// group (killed whole when ctx ends or job.Timeout expires). Each line of
// its stdout goes through p (when not nil) and the events p returns go to
// emit as they come. The error is procrun's: argv could not be started.
func RunProcess(ctx context.Context, job Job, argv []string, p Parser, emit func(Event)) (Result, error) {
	spec := procrun.Spec{
		Argv:      argv,
		Dir:       job.Dir,
		Env:       job.Env,
		Stdin:     []byte(job.Prompt),
		Timeout:   job.Timeout,
		TailBytes: job.TailBytes,
	}
	if p != nil {
		spec.OnStdoutLine = func(line []byte) {
			for _, ev := range p.Line(line) {
				emit(ev)
			}
		}
	}
	res, err := procrun.Run(ctx, spec)
	if err == nil && res.HandlerPanic != "" {
		err = fmt.Errorf("%w: reading the agent's output crashed: %s", ErrOutput, res.HandlerPanic)
	}
	return Result{ExitCode: res.ExitCode, Duration: res.Duration, TimedOut: res.TimedOut, Canceled: res.Canceled, Tail: res.Tail}, err
}
