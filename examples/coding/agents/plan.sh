#!/bin/sh
# A scripted plan agent: splits the work into two specs, one "## " section
# each. A real agent would read the task (in/task.md) and the repository.
set -eu
task=$(head -n 1 "$LOOPBUS_INPUT_DIR/task.md")
cat > "$LOOPBUS_OUTPUT_DIR/plan.md" <<PLAN
# Plan: $task

## Greetings
Functions that greet someone by name.
- hello: prints "Hello, NAME!"
- goodbye: prints "Goodbye, NAME!"

## Transformations
Functions that transform a word.
- shout: prints the word in capitals, then "!"
- repeat: prints the word repeated N times
PLAN
