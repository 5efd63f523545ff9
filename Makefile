# Two commands do all set-up on a fresh clone:
#   make demo   -> creates .venv, installs the package, runs the crash demo on SQLite
#   make test   -> creates .venv, installs the test extras, runs every test on every backend
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test test-deep bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m checkpointers demo

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

test-deep: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --deep

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run --quick

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
