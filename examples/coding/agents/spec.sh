#!/bin/sh
# A scripted spec agent: turns each "- name: what" line of its part of the
# plan (in/plan.md) into a "## name" section naming the test to pass.
set -eu
out="$LOOPBUS_OUTPUT_DIR/spec.md"
sed -n '1s/^## /# Spec: /p' "$LOOPBUS_INPUT_DIR/plan.md" > "$out"
grep '^- ' "$LOOPBUS_INPUT_DIR/plan.md" | while IFS= read -r line; do
	name=${line#- }
	name=${name%%:*}
	printf '\n## %s\n%s\ntest: tests/%s.sh\n' "$name" "${line#*: }" "$name" >> "$out"
done
