#!/usr/bin/env bash
# Run one lane of the tests (a command) with its name before each of its lines, so lanes that
# run side by side stay readable; end with the lane's time and result on one line:
#   ci/lane.sh NAME COMMAND [ARGS...]
#   [local] ....................................................... [ 12%]
#   lane local: passed in 1234 s
# The exit code is the command's. With LANE_DONE_DIR set, the lane also leaves a file named
# after it there when it ends (whatever its result): CI starts other work once a lane is done.
set -uo pipefail
name=$1
shift
start=$(date +%s)
"$@" 2>&1 | sed -u "s/^/[$name] /"
code=${PIPESTATUS[0]}
verdict=passed
[ "$code" -eq 0 ] || verdict="failed (exit $code)"
echo "lane $name: $verdict in $(($(date +%s) - start)) s"
[ -z "${LANE_DONE_DIR:-}" ] || echo "$verdict" >"$LANE_DONE_DIR/$name"
exit "$code"
