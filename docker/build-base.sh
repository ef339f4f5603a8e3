#!/usr/bin/env bash
# Build the base image torchx-elastic-base:bookworm with no image registry:
# debootstrap a minimal Debian bookworm (python3 and venv from Debian's packages,
# debootstrap's default mirror), then `docker import` the root file system. Needs root
# and a Docker engine (ci/docker-engine.sh).
#
# Cached: the image carries a label with the sha256 of this script; when an image of
# that name already has the same hash, nothing is rebuilt. FORCE=1 rebuilds anyway.
set -euo pipefail

BASE_IMAGE="${BASE_IMAGE:-torchx-elastic-base:bookworm}"
SUITE=bookworm
PACKAGES=python3,python3-venv,ca-certificates,procps
HASH_LABEL=org.torchx-elastic.inputs-sha256

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
inputs_hash="$(sha256sum "$here/build-base.sh" | cut -c1-64)"

existing="$(docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" \
    "$BASE_IMAGE" 2>/dev/null || true)"
if [ "${FORCE:-0}" != 1 ] && [ "$existing" = "$inputs_hash" ]; then
    echo "build-base: $BASE_IMAGE is up to date (inputs $inputs_hash)" >&2
    exit 0
fi

command -v debootstrap >/dev/null || {
    echo "build-base: debootstrap is missing: run ci/docker-engine.sh (installs it) or apt-get install debootstrap" >&2
    exit 1
}

rootfs="$(mktemp -d /var/tmp/torchx-elastic-rootfs.XXXXXX)"
trap 'rm -rf "$rootfs"' EXIT

start_s=$SECONDS
log_file=/var/tmp/torchx-elastic-debootstrap.log
echo "build-base: debootstrap $SUITE into $rootfs (log: $log_file)" >&2
if ! debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$rootfs" >"$log_file" 2>&1; then
    tail -n 30 "$log_file" >&2
    echo "build-base: debootstrap failed (full log: $log_file)" >&2
    exit 1
fi

# smaller image: no package lists, caches or docs
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/archives/*.deb \
    "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*

echo "build-base: docker import as $BASE_IMAGE" >&2
tar --numeric-owner -C "$rootfs" -c . | docker import \
    --change "LABEL $HASH_LABEL=$inputs_hash" \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    - "$BASE_IMAGE" >/dev/null
echo "build-base: $BASE_IMAGE built in $((SECONDS - start_s))s" >&2
