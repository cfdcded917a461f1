#!/bin/sh
# make-repo.sh DIR: makes DIR a git repository holding the example project
# (whose tests fail), on branch main, in one commit.
set -eu
[ $# -eq 1 ] || { echo "usage: sh make-repo.sh DIR" >&2; exit 2; }
[ ! -e "$1" ] || { echo "$1 exists; name a new directory" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
cp -R "$here/project/." "$1/"
cd "$1"
git init -q -b main
git add -A
git -c user.name=example -c user.email=example@localhost commit -q -m "greet: tests for four functions, none written yet"
echo "made $1 (branch main); sh test.sh there fails until the functions exist"
