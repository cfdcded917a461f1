#!/bin/sh
# Validates summary.md: a "# " title first, then three to five "- " bullets.
f="$LOOPBUS_OUTPUT_DIR/summary.md"
head -n 1 "$f" | grep -q '^# ..' || { echo "summary.md must start with a '# ' title line"; exit 1; }
n=$(grep -c '^- ..' "$f")
if [ "$n" -lt 3 ] || [ "$n" -gt 5 ]; then
  echo "summary.md has $n '- ' bullet lines; want 3 to 5"
  exit 1
fi
