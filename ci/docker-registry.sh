#!/usr/bin/env bash
# Install Debian's docker-registry (the CNCF distribution registry) for the workspace tests,
# which start it on 127.0.0.1:5000 themselves (tests/docker/conftest.py). Idempotent.
# The package's own service is not needed: the tests run `docker-registry serve CONFIG`.
set -euo pipefail

if command -v docker-registry >/dev/null 2>&1; then
    echo "docker-registry: already installed" >&2
    exit 0
fi
echo "docker-registry: installing Debian's docker-registry" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q --no-install-recommends docker-registry
