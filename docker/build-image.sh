#!/usr/bin/env bash
# Build torchx-elastic:latest (torch CPU + this package + examples/) with no network:
#   1. docker/build-base.sh (the debootstrapped base; cached by its own hash);
#   2. a wheelhouse made on the host with pip (its configured indexes and find-links,
#      e.g. the local torch CPU wheel), pinned by constraints.txt;
#   3. `docker build` of docker/Dockerfile, installing from the wheelhouse with --no-index.
# Cached: the image is labelled with the sha256 of its inputs (the Dockerfile, this
# script, pyproject.toml, constraints.txt, the package sources, examples/ and the base
# image's id); when they did not change nothing is rebuilt. FORCE=1 rebuilds anyway.
# PYTHON picks the interpreter whose pip builds the wheelhouse (default: python3).
set -euo pipefail

IMAGE="${IMAGE:-torchx-elastic:latest}"
BASE_IMAGE="${BASE_IMAGE:-torchx-elastic-base:bookworm}"
PYTHON="${PYTHON:-python3}"
HASH_LABEL=org.torchx-elastic.inputs-sha256

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
start_s=$SECONDS

BASE_IMAGE="$BASE_IMAGE" docker/build-base.sh
base_id="$(docker image inspect --format '{{.Id}}' "$BASE_IMAGE")"

inputs_hash="$(
    {
        echo "$base_id"
        # shellcheck disable=SC2046  # examples/ may not exist yet
        find docker/Dockerfile docker/build-image.sh pyproject.toml constraints.txt \
            torchx_elastic $(ls -d examples 2>/dev/null) -type f \
            -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 \
            | sort -z | xargs -0 sha256sum
    } | sha256sum | cut -c1-64
)"

existing="$(docker image inspect --format "{{ index .Config.Labels \"$HASH_LABEL\" }}" \
    "$IMAGE" 2>/dev/null || true)"
if [ "${FORCE:-0}" != 1 ] && [ "$existing" = "$inputs_hash" ]; then
    echo "build-image: $IMAGE is up to date (inputs $inputs_hash)" >&2
    exit 0
fi

context="$repo/build/docker-context"
rm -rf "$context"
mkdir -p "$context/wheelhouse"
echo "build-image: wheelhouse in $context/wheelhouse" >&2
pip_log="$repo/build/pip-wheel.log"
if ! "$PYTHON" -m pip wheel --disable-pip-version-check \
    --wheel-dir "$context/wheelhouse" -c constraints.txt "$repo[ft]" >"$pip_log" 2>&1; then
    tail -n 30 "$pip_log" >&2
    echo "build-image: pip wheel failed (full log: $pip_log)" >&2
    exit 1
fi
cp docker/Dockerfile "$context/Dockerfile"
mkdir -p "$context/examples"
if [ -d examples ]; then cp -r examples/. "$context/examples/"; fi
find "$context/examples" -name __pycache__ -prune -exec rm -rf {} +

old_id="$(docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null || true)"
echo "build-image: docker build $IMAGE" >&2
docker build --quiet \
    --build-arg BASE_IMAGE="$BASE_IMAGE" \
    --build-arg INPUTS_SHA256="$inputs_hash" \
    --tag "$IMAGE" "$context" >/dev/null
rm -rf "$context"
# the install stage's image (it holds the wheelhouse) is of no further use
docker image prune --force --filter label=org.torchx-elastic.stage=install >/dev/null
# the previous build, now untagged, unless a container still uses it
new_id="$(docker image inspect --format '{{.Id}}' "$IMAGE")"
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then
    docker image rm "$old_id" >/dev/null 2>&1 || true
fi
echo "build-image: $IMAGE built in $((SECONDS - start_s))s" >&2
