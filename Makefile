# Fresh machine: `make demo` and `make test` each create .venv (if missing) and install ncjax into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ncjax-installed
BROWSER_STAMP := $(VENV)/.ncjax-browser

.PHONY: demo demo-all test test-unit test-all chaos bench clean

# pip's own byte-compilation of all ~17,000 installed files ran serially and took 64 of the install's 111 s; the
# packages are installed without it and then compiled on every core, skipping trees that neither ncjax nor its tests
# import (transformers' other model families, tfds' dataset catalogue, test suites, build tools). A skipped module
# still imports, compiled in memory. Files written for a newer Python fail to compile and are skipped, as pip does.
NOT_IMPORTED := /tests/|/transformers/models/(?!(auto|clip)/)|/tensorflow_datasets/(?!core/|proto/|__init__|public_api|version)|/(networkx|pip|setuptools|pyarrow|pydantic|pydantic_core)/

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet --no-compile -e '.[test]'
	$(PY) -m pip install --quiet --no-compile --no-deps 'open-clip-torch==3.3.0'
	$(PY) -m compileall -q -j 0 -x '$(NOT_IMPORTED)' "$$($(PY) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" > /dev/null || true
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m ncjax.demo

# + concept unlearning (AC/HAC, MERU) and region-feature retrieval (SGRAF, GSC on SGRAF, DisNCL): ~25 minutes
demo-all: $(STAMP)
	$(PY) -m ncjax.demo --all

# Tests are compile-bound (XLA compiles per process): one worker per usable core, counted from
# the cgroup quota and memory, not `-n auto` (which sees the host's CPUs inside a container).
WORKERS ?= $(shell $(PYTHON) tests/worker_count.py)

# The suite starts ~60 Python processes (the commands under test, multi-process jobs, fault injection), and each
# compiled ncjax's sources to bytecode again where PYTHONDONTWRITEBYTECODE is set (as on the 2-core machines):
# ncjax and the tests are compiled first, and pytest keeps its assertion-rewritten test modules (a worker's
# collection: 12.8 -> 7.7 s of CPU on a second run).
BYTECODE := $(PY) -m compileall -q -j 0 ncjax tests benchmarks > /dev/null && PYTHONDONTWRITEBYTECODE=

test: $(STAMP)
	$(BYTECODE) $(PY) -m pytest -q -n $(WORKERS) -m "not slow" --durations=30 tests

test-unit: $(STAMP)
	$(BYTECODE) $(PY) -m pytest -q -n $(WORKERS) -m "not slow and not e2e" tests

test-all: $(STAMP) $(BROWSER_STAMP)
	$(BYTECODE) $(PY) -m pytest -q -n $(WORKERS) tests

# `make test-all` also installs the `tpu` extra (libtpu, ~680 MB): tests/test_pod_compile.py compiles a step for a TPU
# v5e slice on this CPU machine.
# `ncjax audit`'s report is rendered by a headless browser in a slow test (tests/cli/test_audit.py): Chromium's
# engine from PyPI (Qt for Python's WebEngine, the `browser` extra, ~260 MB of wheels) — no root, no download from
# elsewhere; a chromium on PATH is used instead when there is one.
$(BROWSER_STAMP): $(STAMP)
	$(PY) -m pip install --quiet --no-compile -e '.[test,browser,tpu]'
	touch $(BROWSER_STAMP)

# Fault injection: 20 real runs (NCU two-stage, GSC) SIGKILLed 3 times each, resumed, compared bitwise.
chaos: $(STAMP)
	$(PY) -m tests.chaos --trials 20 --kills 3 --json chaos_results.json

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) demo_out bench_results *.egg-info
