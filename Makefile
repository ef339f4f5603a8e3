# Every target sets up what it needs: a virtual environment in .venv with torch 2.13.0 (CPU),
# pinned by constraints.txt so pip never pulls a CUDA build, and this package installed editable.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
JOB ?= -j 2x2

# The agent's end-to-end tests also run on the oldest torch the package declares and on the
# newest release, each in a venv of its own (.venv-torch<version>): torch first, then this
# package with its test extra under constraints that keep that torch and torchx 0.7.
# These two pull CUDA builds (about 5 GB each on disk; pip's cache keeps the downloads
# unless PIP_NO_CACHE_DIR is set, as CI does).
TORCH_VERSIONS ?= 2.4.0 2.15.0
# The suites are pytest markers (pyproject.toml; tests/conftest.py marks whole folders and every
# test that uses a real backend's fixture): `torch_lines` runs again on each torch version, with
# `torchrun_sample` (a sample of the torchrun forms; every form runs in `make test`);
# `torchx_dev` runs again on torchx's development line.
OTHER_TORCH_SUITE := torch_lines or torchrun_sample
# the real backends: `make test` runs them in a lane of their own, one at a time (each starts
# its cluster or hosts), beside the lane of everything else
BACKENDS := docker or kubernetes or slurm or netns
PYTEST := pytest -q -rfEs -p no:cacheprovider --durations=15
LANE := ci/lane.sh
export PIP_CACHE_DIR ?= $(HOME)/.cache/pip

DEV_VENV ?= .venv-torchx-nightly
# Kubeflow Pipelines' SDK (2.x) pins an older kubernetes client than this package: the KFP
# compile test runs in a venv of its own, without torch (compiling a pipeline needs none)
KFP_VENV ?= .venv-kfp

.PHONY: setup setup-torchx-dev test-torchx-dev example image test test-fast test-torch-versions lint bench
.PHONY: setup-torch-versions setup-other-lines test-other-lines clean setup-kfp test-kfp
.PHONY: test-local test-cli-jobs test-backends test-torchx-dev-lane docs test-wheel

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml hatch_build.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,ft]'
	touch $@

# torchx's development line (torchx-nightly) in a second venv, this package built for it
setup-torchx-dev: $(DEV_VENV)/.installed

$(DEV_VENV)/.installed: pyproject.toml hatch_build.py constraints.txt ci/torchx-nightly-venv.sh
	ci/torchx-nightly-venv.sh $(DEV_VENV) $(PYTHON)
	touch $@

# The compatibility tests (CLI, components, run options, whole lines of a local run, its
# terminal and its stop by a signal: marker torchx_dev) with torchx's development line;
# `make test` runs them (and everything else) with torchx 0.7.
test-torchx-dev: setup-torchx-dev
	$(DEV_VENV)/bin/$(PYTEST) -m torchx_dev

# KFP's SDK and torchx 0.7 (what the components import), then this package without its
# requirements (torch, our kubernetes client): what `pip install torchx-elastic[kfp]` gives a
# pipeline author's machine, less torch
setup-kfp: $(KFP_VENV)/.installed

$(KFP_VENV)/.installed: pyproject.toml hatch_build.py constraints.txt
	$(PYTHON) -m venv $(KFP_VENV)
	$(KFP_VENV)/bin/python -m pip install -q --upgrade pip
	$(KFP_VENV)/bin/python -m pip install -q -c constraints.txt 'kfp>=2,<3' 'torchx>=0.7,<0.8' \
		PyYAML pytest pytest-timeout
	$(KFP_VENV)/bin/python -m pip install -q --no-deps -e .
	touch $@

# The pipelines compiled by the real KFP SDK (docs/kfp_pipeline.yaml and the real-node step)
test-kfp: setup-kfp
	$(KFP_VENV)/bin/pytest -q -p no:cacheprovider tests/pipelines/test_kfp_compile.py

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

# Everything, slow end-to-end runs included (Docker tests need an engine: ci/docker-engine.sh),
# in three lanes side by side, each line of output named by its lane: the real backends (one
# at a time), the jobs through the torchx CLI (marker cli_jobs) and everything else.
test: lint
	$(MAKE) --no-print-directory -j3 test-local test-cli-jobs test-backends

test-local: setup
	$(LANE) local $(BIN)/$(PYTEST) -m "not ($(BACKENDS) or cli_jobs)"

test-cli-jobs: setup
	$(LANE) cli-jobs $(BIN)/$(PYTEST) -m "cli_jobs and not ($(BACKENDS))"

test-backends: setup
	$(LANE) backends $(BIN)/$(PYTEST) -m "$(BACKENDS)"

setup-torch-versions: $(foreach v,$(TORCH_VERSIONS),.venv-torch$(v)/.installed)

# the venvs of the other torch versions and of torchx's development line
setup-other-lines: setup-torch-versions setup-torchx-dev setup-kfp

# the tests again on the other torch versions and on torchx's development line, then KFP's
# compile tests: three lanes, OTHER_LINES_JOBS of them side by side
OTHER_LINES_JOBS ?= 3
test-other-lines: setup-other-lines
	$(MAKE) --no-print-directory -j$(OTHER_LINES_JOBS) -k $(foreach v,$(TORCH_VERSIONS),test-torch$(v)) \
		test-torchx-dev-lane

test-torchx-dev-lane: setup-torchx-dev setup-kfp
	$(LANE) torchx-dev $(MAKE) --no-print-directory test-torchx-dev test-kfp

test-torch-versions: setup-torch-versions
	$(MAKE) --no-print-directory -j2 -k $(foreach v,$(TORCH_VERSIONS),test-torch$(v))

test-torch%: .venv-torch%/.installed
	$(LANE) torch$* .venv-torch$*/bin/$(PYTEST) -m "$(OTHER_TORCH_SUITE)"

# A machine-wide pip configuration may cap torch (a global constraints file): these venvs pin
# their own torch, so pip reads no configuration file for them (PIP_* variables still apply).
.venv-torch%/.installed: pyproject.toml
	$(PYTHON) -m venv .venv-torch$*
	.venv-torch$*/bin/python -m pip install -q --upgrade pip
	printf 'torch==%s\ntorchx>=0.7,<0.8\n' $* > .venv-torch$*/constraints.txt
	PIP_CONFIG_FILE=/dev/null .venv-torch$*/bin/python -m pip install -q \
		-c .venv-torch$*/constraints.txt torch==$*
	PIP_CONFIG_FILE=/dev/null .venv-torch$*/bin/python -m pip install -q \
		-c .venv-torch$*/constraints.txt -e '.[test]'
	touch $@

# Unit tests only.
test-fast: setup
	$(BIN)/pytest -q -m "not slow"

bench: setup
	$(BIN)/python bench/run.py

# The tools of the two targets below (the docs and dist extras, pinned in pyproject.toml)
$(VENV)/.tools-installed: $(VENV)/.installed
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[test,ft,docs,dist]'
	touch $@

# The documentation site: docs/ (Markdown through MyST; the reference generated from the code
# by docs/_ext/generated.py and autodoc), every page read again (-E), warnings and unresolved
# references failing it; the site is docs/_build/html/index.html
docs: $(VENV)/.tools-installed
	$(BIN)/sphinx-build -E -W --keep-going -n -q -b html docs docs/_build/html
	@echo "docs: docs/_build/html/index.html"

# The package as a user gets it: the wheel and the sdist built and their metadata checked, the
# wheel installed in a new venv outside the repository, where `torchx run dist.ddp -j 1x2`
# (no -s, no .torchxconfig) runs a small gloo job
test-wheel: $(VENV)/.tools-installed
	ci/test-wheel.sh $(BIN)/python $(PYTHON)

clean:
	rm -rf $(VENV) .venv-torch* $(KFP_VENV) torchx_logs .pytest_cache .mypy_cache .ruff_cache
