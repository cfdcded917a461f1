#!/bin/sh
# notify.sh: a hook posting one short message per event to a chat or CI
# webhook, as the JSON {"text": "..."} (Slack, Mattermost, Rocket.Chat and
# Google Chat incoming webhooks read it).
#
# The event is a CloudEvent on stdin; LOOPBUS_EVENT_TYPE and LOOPBUS_SESSION
# say what happened where. Session and task ids are letters, digits, - and _,
# so the message needs no JSON escaping.
#
# Without WEBHOOK_URL it prints what it would send (the hook runner records
# the output in the hook.completed event).
set -eu

event=$(cat)

# data_id and data_status read the leading members of the event's data as
# loopbus writes them: "data":{"id":"...","status":"...",...
data_id() {
	printf '%s\n' "$event" | sed -n 's/.*"data":{"id":"\([^"]*\)".*/\1/p'
}
data_status() {
	printf '%s\n' "$event" | sed -n 's/.*"data":{"id":"[^"]*","status":"\([a-z]*\)".*/\1/p'
}

case "$LOOPBUS_EVENT_TYPE" in
loopbus.session.completed)
	text="loopbus: session $LOOPBUS_SESSION completed"
	;;
loopbus.session.failed)
	text="loopbus: session $LOOPBUS_SESSION FAILED (loopbus status $LOOPBUS_SESSION says why)"
	;;
loopbus.task.updated)
	# Only tasks that became done.
	[ "$(data_status)" = done ] || exit 0
	text="loopbus: task $(data_id) of session $LOOPBUS_SESSION is done"
	;;
*)
	exit 0
	;;
esac

body=$(printf '{"text":"%s"}' "$text")
if [ -z "${WEBHOOK_URL:-}" ]; then
	echo "WEBHOOK_URL is not set; would POST: $body"
	exit 0
fi
curl -fsS --max-time 20 -H 'Content-Type: application/json' -d "$body" "$WEBHOOK_URL"
echo
echo "posted: $body"
