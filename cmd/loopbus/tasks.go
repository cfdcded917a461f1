package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/loopbus/loopbus/backlog"
	"github.com/loopbus/loopbus/bus"
	"github.com/loopbus/loopbus/client"
	"github.com/loopbus/loopbus/schemas"
	"github.com/loopbus/loopbus/tui"
	"github.com/spf13/cobra"
)

// listingFlags adds the flags of a task listing (tasks, tasks list and
// replay --tasks).
func listingFlags(cmd *cobra.Command, l *tui.TaskListing) {
	cmd.Flags().StringSliceVar(&l.Status, "status", nil, "only tasks of these statuses (todo, doing, done, blocked; comma-separated or repeated)")
	cmd.Flags().BoolVar(&l.JSON, "json", false, "print the task list view as JSON")
}

func newTasksCmd(g *globals) *cobra.Command {
	list := func(listing *tui.TaskListing) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			if err := listing.Validate(); err != nil {
				return usageErr(err)
			}
			return g.withBus(cmd, "tasks", func(ctx context.Context, b *bus.Bus) error {
				v, err := client.Tasks(ctx, b, args[0])
				if err != nil {
					return err
				}
				return tui.WriteTasks(g.stdout, v, *listing)
			})
		}
	}
	var listing, listListing tui.TaskListing
	cmd := &cobra.Command{
		Use:   "tasks SESSION | tasks COMMAND",
		Short: "Show, add to and change a backlog session's tasks; check and format task files",
		Long: `tasks SESSION lists a backlog session's tasks: a header with the session's
phase and the number of tasks per status, then one line per task in the order
they are worked (doing, then todo and blocked by priority, then done) with the
tasks each waits for and its blockers. It reads the projector's view when it
is up to date with the stream, else folds the stream. A session named like a
command below is listed with 'tasks list SESSION'.

add and set-status change a running (or paused or stopped) backlog session's
task list with task.added and task.updated events (by "cli"), checked first
against the task list folded from the stream; the orchestrator takes them
into account in its next decision. validate and fmt work on task files
(to-do.json) without a server.`,
		Example: `  loopbus tasks todo-20261122-a1b2 --status todo,blocked
  loopbus tasks add todo-20261122-a1b2 --title "Document exit codes" --priority 2 --depends-on T003
  loopbus tasks set-status todo-20261122-a1b2 T004 blocked --blocker "needs a release tag"
  loopbus tasks validate to-do.json
  loopbus tasks fmt -w to-do.json
  loopbus tasks export todo-20261122-a1b2 -o to-do.json`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageErr(fmt.Errorf("tasks: want SESSION, or a command: list, add, set-status, validate, fmt, export (got %d arguments)", len(args)))
			}
			return nil
		},
		RunE: list(&listing),
	}
	listingFlags(cmd, &listing)

	listCmd := &cobra.Command{
		Use:     "list SESSION",
		Aliases: []string{"ls"},
		Short:   "List a backlog session's tasks (as 'tasks SESSION')",
		Args:    cobra.ExactArgs(1),
		RunE:    list(&listListing),
	}
	listingFlags(listCmd, &listListing)

	cmd.AddCommand(listCmd, newTasksAddCmd(g), newTasksSetStatusCmd(g), newTasksValidateCmd(g), newTasksFmtCmd(g), newTasksExportCmd(g))
	return cmd
}

func newTasksAddCmd(g *globals) *cobra.Command {
	var task schemas.Task
	var reason string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add SESSION --title T",
		Short: "Add a task to a backlog session (id T001-style when not given)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(task.Title) == "" {
				return usageErr(errors.New("tasks add: --title is required"))
			}
			if task.Priority < 0 {
				return usageErr(fmt.Errorf("tasks add: --priority %d: want 1 (highest) or more, or 0 for none", task.Priority))
			}
			return g.withBus(cmd, "tasks", func(ctx context.Context, b *bus.Bus) error {
				c, err := client.AddTask(ctx, b, args[0], task, reason)
				if err != nil {
					return err
				}
				return tui.WriteTaskChange(g.stdout, c, asJSON, "added")
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&task.Title, "title", "", "what the task is, in one line (required)")
	f.StringVar(&task.ID, "id", "", "task id ([A-Za-z0-9_-], at most 64; not bootstrap, repair or review); default the next free T001-style id")
	f.StringVar(&task.Description, "description", "", "what the task is, at length")
	f.StringVar(&task.Details, "details", "", "implementation details")
	f.StringVar(&task.Reference, "reference", "", "where the task comes from (a document section, an issue)")
	f.IntVar(&task.Priority, "priority", 0, "1 is the highest; 0 is none (after every set priority)")
	f.StringSliceVar(&task.DependsOn, "depends-on", nil, "ids of tasks that must be done first (comma-separated or repeated)")
	f.StringArrayVar(&task.Tags, "tag", nil, "a label (repeatable)")
	f.StringArrayVar(&task.Files, "file", nil, "a file the task touches (repeatable)")
	f.StringVar(&reason, "reason", "", "why, kept in the task's history")
	f.BoolVar(&asJSON, "json", false, "print the added task as JSON")
	return cmd
}

func newTasksSetStatusCmd(g *globals) *cobra.Command {
	var reason string
	var blockers []string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "set-status SESSION ID STATUS",
		Short: "Set a task's status (todo, doing, done, blocked) in a backlog session",
		Long: `Set a task's status. --blocker replaces the task's blockers; moving a task out of
blocked without --blocker clears them. A blocked task is tried again after
another task is done or added; todo makes it selectable at once.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) != 3 {
				return usageErr(fmt.Errorf("tasks set-status: want SESSION ID STATUS (status: %s), got %d arguments", strings.Join(schemas.TaskStatuses(), ", "), len(args)))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			var bl []string
			if cmd.Flags().Changed("blocker") {
				bl = blockers
			}
			return g.withBus(cmd, "tasks", func(ctx context.Context, b *bus.Bus) error {
				c, err := client.SetTaskStatus(ctx, b, args[0], args[1], args[2], reason, bl)
				if err != nil {
					return err
				}
				return tui.WriteTaskChange(g.stdout, c, asJSON, "set")
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why, kept in the task's history")
	cmd.Flags().StringArrayVar(&blockers, "blocker", nil, "what keeps the task from going on (repeatable); replaces its blockers")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the changed task as JSON")
	return cmd
}

func newTasksValidateCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "validate FILE",
		Short: "Check a task file (to-do.json): exit 0 when valid, else 1 listing every problem",
		Long: `Check a task file as a backlog session imports it: JSON syntax (with line and
column), the task file schema, unique ids, no reserved id (bootstrap,
repair, review), known dependencies and no dependency cycle (named as a
path). Every problem is printed with its JSON pointer.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			data, err := client.ReadRegular(args[0])
			if err != nil {
				return usageErr(err)
			}
			f, errs := backlog.ParseFile(args[0], data)
			if len(errs) > 0 {
				fmt.Fprintf(g.stdout, "%s: %s\n", args[0], tui.Plural(len(errs), "problem"))
				tui.WriteProblems(g.stdout, errs)
				return errFailed
			}
			fmt.Fprintf(g.stdout, "%s: %s, valid\n", args[0], tui.Plural(len(f.Tasks), "task"))
			return nil
		},
	}
}

func newTasksFmtCmd(g *globals) *cobra.Command {
	var check, write bool
	cmd := &cobra.Command{
		Use:   "fmt FILE [--check | -w]",
		Short: "Print a task file in canonical form; --check tests it, -w rewrites it",
		Long: `Print a task file in canonical form (two-space indentation, members in a fixed
order, a final newline) on stdout. --check prints nothing and exits 1 naming
the file when it is not in that form; -w rewrites the file in place
(atomically, keeping its mode) when it is not. A file that is not JSON, or
whose members are unknown or of the wrong type, is refused: formatting would
lose them. Other problems are left to 'tasks validate'.`,
		Args: cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			if check && write {
				return usageErr(errors.New("tasks fmt: --check and -w exclude each other"))
			}
			path := args[0]
			data, err := client.ReadRegular(path)
			if err != nil {
				return usageErr(err)
			}
			out, formatted, problems := client.FormatTaskFile(path, data)
			if len(problems) > 0 {
				fmt.Fprintf(g.stderr, "%s: not formatted: it would lose content (%s; see loopbus tasks validate)\n", path, tui.Plural(len(problems), "problem"))
				tui.WriteProblems(g.stderr, problems)
				return errFailed
			}
			switch {
			case check:
				if !formatted {
					fmt.Fprintf(g.stderr, "%s: not in canonical form (loopbus tasks fmt -w %s rewrites it)\n", path, path)
					return errFailed
				}
				return nil
			case write:
				if formatted {
					return nil
				}
				return client.WriteFileAtomic(path, out, 0o644)
			}
			_, err = g.stdout.Write(out)
			return err
		},
	}
	cmd.Flags().BoolVar(&check, "check", false, "exit 1 naming the file when it is not in canonical form; print nothing")
	cmd.Flags().BoolVarP(&write, "write", "w", false, "rewrite the file in canonical form")
	return cmd
}

func newTasksExportCmd(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "export SESSION [-o FILE]",
		Short: "Write a backlog session's task list as a task file (to-do.json)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.withBus(cmd, "tasks", func(ctx context.Context, b *bus.Bus) error {
				v, err := client.Tasks(ctx, b, args[0])
				if err != nil {
					return err
				}
				data := backlog.Format(v.Export())
				if out == "" || out == "-" {
					_, err := g.stdout.Write(data)
					return err
				}
				if err := client.WriteFileAtomic(out, data, 0o644); err != nil {
					return err
				}
				fmt.Fprintf(g.stderr, "wrote %s: %s of session %s (stream seq %d)\n", out, tui.Plural(len(v.Tasks), "task"), v.Session, v.LastSeq)
				return nil
			})
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "file to write (replaced atomically); default stdout")
	return cmd
}
