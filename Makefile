# Every target sets up what it needs: a virtual environment in .venv with torch 2.13.0 (CPU),
# pinned by constraints.txt so pip never pulls a CUDA build, and this package installed editable.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOB ?= -j 2x2

DEV_VENV ?= .venv-torchx-nightly

.PHONY: setup setup-torchx-dev test-torchx-dev example image test test-fast lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml hatch_build.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

# torchx's development line (torchx-nightly) in a second venv, this package built for it
setup-torchx-dev: $(DEV_VENV)/.installed

$(DEV_VENV)/.installed: pyproject.toml hatch_build.py constraints.txt ci/torchx-nightly-venv.sh
	ci/torchx-nightly-venv.sh $(DEV_VENV) $(PYTHON)
	touch $@

# The compatibility tests (CLI, components, run options, whole lines of a local run) with
# torchx's development line; `make test` runs them (and everything else) with torchx 0.7.
COMPAT_TESTS := tests/compat tests/unit/test_cli_integration.py tests/e2e/test_local_cwd_lines.py
test-torchx-dev: setup-torchx-dev
	$(DEV_VENV)/bin/pytest -q -p no:cacheprovider $(COMPAT_TESTS)

# The main job: a real gloo DDP run through the torchx CLI on our local_cwd scheduler.
example: setup
	$(BIN)/torchx run -s local_cwd dist.ddp $(JOB) --script examples/main.py

# torchx-elastic:latest for the docker scheduler (debootstrapped base + torch CPU + this
# package); rebuilt only when its inputs change
image: setup
	PYTHON=$(BIN)/python docker/build-image.sh

lint: setup
	$(BIN)/ruff check torchx_elastic torchx_plugins hatch_build.py tests bench examples
	$(BIN)/mypy

# Everything, slow end-to-end runs included (Docker tests need an engine: ci/docker-engine.sh).
test: lint
	$(BIN)/pytest -q -rs --durations=15

# Unit tests only.
test-fast: setup
	$(BIN)/pytest -q -m "not slow"

bench: setup
	$(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) $(DEV_VENV) torchx_logs .pytest_cache .mypy_cache .ruff_cache
