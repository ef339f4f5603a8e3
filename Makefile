# Every target sets up what it needs: a virtual environment in .venv with torch 2.13.0 (CPU),
# pinned by constraints.txt so pip never pulls a CUDA build, and this package installed editable.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOB ?= -j 2x2

.PHONY: setup example image test test-fast lint bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test]'
	touch $@

# The main job: a real gloo DDP run through the torchx CLI on our local_cwd scheduler.
example: setup
	$(BIN)/torchx run -s local_cwd dist.ddp $(JOB) --script examples/main.py

# torchx-elastic:latest for the docker scheduler (debootstrapped base + torch CPU + this
# package); rebuilt only when its inputs change
image: setup
	PYTHON=$(BIN)/python docker/build-image.sh

lint: setup
	$(BIN)/ruff check torchx_elastic tests bench examples
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
	rm -rf $(VENV) torchx_logs .pytest_cache .mypy_cache .ruff_cache
