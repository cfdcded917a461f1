#!/bin/sh
# A scripted code agent. It runs in a git worktree of the repository: it
# writes lib/NAME.sh for the function its part of the spec (in/spec.md)
# names. Its first try at repeat is wrong; with the validator's feedback
# (a non-empty $LOOPBUS_FEEDBACK_FILE) it gets it right.
set -eu
name=$(sed -n 's/^## //p' "$LOOPBUS_INPUT_DIR/spec.md" | head -n 1)
mkdir -p lib
case "$name" in
hello) echo 'hello() { echo "Hello, $1!"; }' > lib/hello.sh ;;
goodbye) echo 'goodbye() { echo "Goodbye, $1!"; }' > lib/goodbye.sh ;;
shout) echo 'shout() { printf "%s!\n" "$1" | tr "[:lower:]" "[:upper:]"; }' > lib/shout.sh ;;
repeat)
	start=0
	[ -s "$LOOPBUS_FEEDBACK_FILE" ] || start=1 # the first try is off by one
	cat > lib/repeat.sh <<CODE
repeat() { i=$start; out=; while [ \$i -lt "\$2" ]; do out="\$out\$1"; i=\$((i + 1)); done; echo "\$out"; }
CODE
	;;
*) echo "code.sh: no recipe for '$name'" >&2; exit 1 ;;
esac
echo "wrote lib/$name.sh"
