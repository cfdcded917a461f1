#!/bin/sh
# record.sh: a post-iteration hook. For every completed step and every task
# that became done it appends one line to a log file:
#
#   <event time> <event subject> step <step> completed (event <id>, #<seq>)
#   <event time> <event subject> task <task> done (event <id>, #<seq>)
#
# The log is $RECORD_LOG, by default loopbus-hooks-finished.log in the
# temporary directory. If COMMIT_IN names a git work tree, the hook also
# commits everything changed there (git add -A; git commit), e.g. the files
# an agent changed; unset, it touches nothing else.
set -eu

log=${RECORD_LOG:-${TMPDIR:-/tmp}/loopbus-hooks-finished.log}
event=$(cat)

case "$LOOPBUS_EVENT_TYPE" in
loopbus.step.completed)
	what="step $LOOPBUS_STEP completed"
	;;
loopbus.task.updated)
	status=$(printf '%s\n' "$event" | sed -n 's/.*"data":{"id":"[^"]*","status":"\([a-z]*\)".*/\1/p')
	[ "$status" = done ] || exit 0
	task=$(printf '%s\n' "$event" | sed -n 's/.*"data":{"id":"\([^"]*\)".*/\1/p')
	what="task $task done"
	;;
*)
	exit 0
	;;
esac

printf '%s %s %s (event %s, #%s)\n' "$LOOPBUS_EVENT_TIME" "$LOOPBUS_EVENT_SUBJECT" "$what" \
	"$LOOPBUS_EVENT_ID" "$LOOPBUS_EVENT_SEQ" >>"$log"
echo "recorded in $log: $what"

if [ -n "${COMMIT_IN:-}" ]; then
	git -C "$COMMIT_IN" add -A
	if git -C "$COMMIT_IN" diff --cached --quiet; then
		echo "nothing to commit in $COMMIT_IN"
	else
		git -C "$COMMIT_IN" commit -q -m "loopbus: session $LOOPBUS_SESSION: $what"
		echo "committed in $COMMIT_IN"
	fi
fi
