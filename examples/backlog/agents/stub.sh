#!/bin/sh
# A stand-in agent for the example backlog. loopbus runs it in a fresh
# workspace with the prompt in $LOOPBUS_PROMPT_FILE, the source files in in/
# and $LOOPBUS_STEP naming the run: a task id, or bootstrap, repair, review.
# It writes what a real agent would: out/to-do.json for bootstrap and
# repair, out/summary.json otherwise.
set -eu
out=${LOOPBUS_OUTPUT_DIR:-out}
case $LOOPBUS_STEP in
bootstrap | repair)
	# One task per "- " line of the plan, each depending on the one before.
	# (A real repair agent fixes the problems its prompt lists in the file
	# it finds in in/; this stand-in writes the plan's tasks instead.)
	{
		printf '{"schema_version": 1, "project": {"name": "Release notes"}, "source_files": ["plan.md"], "tasks": ['
		n=0
		sed -n 's/^- //p' in/plan.md | while IFS= read -r line; do
			n=$((n + 1))
			[ "$n" -gt 1 ] && printf ','
			dep=''
			[ "$n" -gt 1 ] && dep=$(printf ', "depends_on": ["T%03d"]' $((n - 1)))
			printf '\n  {"id": "T%03d", "title": "%s", "priority": %d, "status": "todo"%s}' "$n" "$line" "$n" "$dep"
		done
		printf '\n]}\n'
	} >"$out/to-do.json"
	;;
review)
	printf '{"task_id": "review", "status": "done", "summary": "Every item of the plan has a finished task."}\n' >"$out/summary.json"
	;;
*)
	printf '{"task_id": "%s", "status": "done", "summary": "Did %s.", "files": ["notes/%s.md"]}\n' \
		"$LOOPBUS_STEP" "$LOOPBUS_STEP" "$LOOPBUS_STEP" >"$out/summary.json"
	;;
esac
