#!/usr/bin/env bash
# Make a Docker engine answer on this machine (Debian, as root). Idempotent:
#   1. installs Debian's docker.io (and debootstrap, for docker/build-base.sh) if missing;
#   2. starts dockerd in the background if no engine answers;
#   3. waits until `docker info` works (DOCKER_ENGINE_WAIT_S, default 60).
# The engine's log is /var/log/dockerd.log.
set -euo pipefail

wait_s="${DOCKER_ENGINE_WAIT_S:-60}"
log_file=/var/log/dockerd.log

engine_answers() { docker info >/dev/null 2>&1; }

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
    echo "docker-engine: installing Debian's docker.io and debootstrap" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends docker.io debootstrap iptables ca-certificates
fi

if engine_answers; then
    echo "docker-engine: an engine already answers" >&2
    exit 0
fi

if [ -z "${DOCKER_HOST:-}" ] && ! pgrep -x dockerd >/dev/null 2>&1; then
    echo "docker-engine: starting dockerd (log: $log_file)" >&2
    # setsid: the engine outlives this script and the CI step that ran it
    setsid dockerd >>"$log_file" 2>&1 </dev/null &
fi

for _ in $(seq "$wait_s"); do
    if engine_answers; then
        echo "docker-engine: engine ready ($(docker version --format '{{.Server.Version}}'))" >&2
        exit 0
    fi
    sleep 1
done
echo "docker-engine: no engine answered within ${wait_s}s; last lines of $log_file:" >&2
tail -n 20 "$log_file" >&2 || true
exit 1
