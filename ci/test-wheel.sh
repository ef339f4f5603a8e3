#!/usr/bin/env bash
# The package as a user installs it: build the wheel and the sdist, check their metadata, install
# the wheel into a new virtual environment in a temporary directory outside the repository
# (torch 2.13.0 first, pinned by constraints.txt, so no CUDA build is pulled) and run the
# example job there: `torchx run dist.ddp -j 1x2 --script main.py`, with no -s and no
# .torchxconfig, on a small gloo script. Every step says how long it took.
# Usage: ci/test-wheel.sh TOOLS_PYTHON [PYTHON]
#   TOOLS_PYTHON: an interpreter with the dist extra (build, twine): the repo's .venv
#   PYTHON: the interpreter of the new venv (default python3)
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
TOOLS_PYTHON="${1:?usage: $0 TOOLS_PYTHON [PYTHON]}"
PYTHON="${2:-python3}"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/torchx_elastic_wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
start=$(date +%s)
step() { echo "test-wheel: $1 ($(($(date +%s) - start)) s)"; }

# the sdist first, then the wheel built from it (python -m build's default): what a user's pip
# gets from either
"$TOOLS_PYTHON" -m build -q --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log"; exit 1; }
wheel=$(ls "$WORK"/dist/torchx_elastic-*.whl)
sdist=$(ls "$WORK"/dist/torchx_elastic-*.tar.gz)
step "built $(basename "$wheel") and $(basename "$sdist")"
"$TOOLS_PYTHON" -m twine check --strict "$wheel" "$sdist"
step "metadata checked"

"$PYTHON" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q -c "$REPO/constraints.txt" torch==2.13.0
"$WORK/venv/bin/python" -m pip install -q -c "$REPO/constraints.txt" "$wheel"
step "installed into $WORK/venv"

# the version: one place, the same for the package and its metadata
version=$(basename "$wheel" | cut -d- -f2)
(cd "$WORK" && "$WORK/venv/bin/python" - "$version" <<'EOF'
import importlib.metadata
import sys

import torchx_elastic

assert torchx_elastic.__file__.startswith(sys.prefix), torchx_elastic.__file__
assert torchx_elastic.__version__ == importlib.metadata.version("torchx-elastic") == sys.argv[1], (
    torchx_elastic.__version__, importlib.metadata.version("torchx-elastic"), sys.argv[1]
)
EOF
)

# the job, from a directory of its own with no .torchxconfig, a home without one, and nothing
# of the repository on the path
mkdir -p "$WORK/job" "$WORK/home"
cat >"$WORK/job/main.py" <<'EOF'
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
print(f"rank {dist.get_rank()} of world size {dist.get_world_size()}: sum {total.item():g}")
dist.destroy_process_group()
EOF
(
    cd "$WORK/job"
    unset PYTHONPATH TORCHXCONFIG VIRTUAL_ENV
    HOME="$WORK/home" PATH="$WORK/venv/bin:/usr/bin:/bin" \
        torchx run dist.ddp -j 1x2 --script main.py >"$WORK/job.log" 2>&1
) || { echo "test-wheel: the job failed:"; cat "$WORK/job.log"; exit 1; }
for line in "rank 0 of world size 2: sum 3" "rank 1 of world size 2: sum 3" "local_cwd://"; do
    grep -qF "$line" "$WORK/job.log" \
        || { echo "test-wheel: '$line' missing from the job's output:"; cat "$WORK/job.log"; exit 1; }
done
[ -d "$WORK/job/torchx_logs" ] || { echo "test-wheel: no torchx_logs/ in the job's directory"; exit 1; }
step "torchx run dist.ddp -j 1x2 --script main.py ran on local_cwd from the wheel"
