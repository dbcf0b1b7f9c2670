# Fresh machine: `make demo` and `make test` each create .venv (if missing) and install ncjax into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ncjax-installed

.PHONY: demo test test-unit test-all bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -e '.[test]'
	$(PY) -m pip install --quiet --no-deps 'open-clip-torch==3.3.0'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m ncjax.demo

# Tests are compile-bound (XLA compiles per process): one worker per core.
test: $(STAMP)
	$(PY) -m pytest -q -n auto -m "not slow" tests

test-unit: $(STAMP)
	$(PY) -m pytest -q -n auto -m "not slow and not e2e" tests

test-all: $(STAMP)
	$(PY) -m pytest -q -n auto tests

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) demo_out bench_results *.egg-info
