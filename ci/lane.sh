#!/usr/bin/env bash
# Run one lane of the tests (a command) with its name before each of its lines, so lanes that
# run side by side stay readable; end with the lane's time and result on one line, then the
# lane's failed tests (pytest's FAILED/ERROR lines), so a CI log's last lines name them:
#   ci/lane.sh NAME COMMAND [ARGS...]
#   [local] ....................................................... [ 12%]
#   lane local: passed in 1234 s
# The exit code is the command's. With LANE_DONE_DIR set, the lane also leaves a file named
# after it there when it ends (whatever its result: its verdict, then its failed tests): CI
# starts other work once a lane is done and repeats the failures at its end.
set -uo pipefail
name=$1
shift
start=$(date +%s)
failures=$(mktemp)
trap 'rm -f "$failures"' EXIT
"$@" 2>&1 | sed -u "s/^/[$name] /" | tee >(grep -E "^\[$name\] (FAILED|ERROR) " >"$failures")
code=${PIPESTATUS[0]}
verdict=passed
[ "$code" -eq 0 ] || verdict="failed (exit $code)"
# tee's process substitution may still be writing: wait for it
wait
summary="lane $name: $verdict in $(($(date +%s) - start)) s"
echo "$summary"
cat "$failures"
[ -z "${LANE_DONE_DIR:-}" ] || { echo "$summary"; cat "$failures"; } >"$LANE_DONE_DIR/$name"
exit "$code"
