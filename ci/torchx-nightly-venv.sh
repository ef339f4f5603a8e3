#!/usr/bin/env bash
# A second virtual environment with torchx's development line (the torchx-nightly package)
# instead of torchx 0.7: torch 2.13.0 (CPU, pinned by constraints.txt), torchx-nightly, then
# this package editable, built for that line (TORCHX_ELASTIC_TORCHX_LINE=dev: it requires
# torchx-nightly, not torchx 0.7, and registers its schedulers through torchx's plugin
# registry instead of 0.7's entry points; see hatch_build.py).
# Usage: ci/torchx-nightly-venv.sh VENV_DIR [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:?usage: $0 VENV_DIR [PYTHON]}"
PYTHON="${2:-python3}"
TORCHX_NIGHTLY="${TORCHX_NIGHTLY:-torchx-nightly==2026.10.26}"

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q -c constraints.txt torch==2.13.0 "$TORCHX_NIGHTLY"
TORCHX_ELASTIC_TORCHX_LINE=dev "$VENV/bin/python" -m pip install -q -c constraints.txt -e '.[test]'
"$VENV/bin/python" -c "import importlib.metadata as m; print('torchx line:', m.version('torchx-nightly'))"
