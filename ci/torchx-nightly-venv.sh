#!/usr/bin/env bash
# A second virtual environment with torchx's development line (the torchx-nightly package)
# instead of torchx 0.7: torch 2.13.0 (CPU, pinned by constraints.txt), torchx-nightly, this
# package's other dependencies and test tools, then this package editable WITHOUT its
# dependencies (they name torchx 0.7, which would replace the development line's files).
# Usage: ci/torchx-nightly-venv.sh VENV_DIR [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:?usage: $0 VENV_DIR [PYTHON]}"
PYTHON="${2:-python3}"
TORCHX_NIGHTLY="${TORCHX_NIGHTLY:-torchx-nightly==2026.10.26}"

"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
# this package's dependencies and test extras, less torchx itself (read from pyproject.toml)
mapfile -t DEPS < <("$VENV/bin/python" - <<'PY'
import re, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
for dep in project["dependencies"] + project["optional-dependencies"]["test"]:
    if re.match(r"torchx\b(?!-)", dep) is None:
        print(dep)
PY
)
"$VENV/bin/python" -m pip install -q -c constraints.txt torch==2.13.0 "$TORCHX_NIGHTLY" "${DEPS[@]}"
"$VENV/bin/python" -m pip install -q --no-deps -e .
"$VENV/bin/python" -c "import importlib.metadata as m; print('torchx line:', m.version('torchx-nightly'))"
