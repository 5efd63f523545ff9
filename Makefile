# Two commands do all set-up on a fresh clone:
#   make demo   -> creates .venv, installs the package, runs the crash demo on SQLite
#   make test   -> creates .venv, installs the test extras, runs every test on every backend
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint test-deep test-lowest langgraph-suite bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test,bench]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m checkpointers demo

# 4 workers (pytest-xdist): the tests wait on servers and subprocesses more
# than they compute, so this 2-core machine runs the suite in ~7 minutes
# (3,013 tests, clean clone, 396 s); one at a time, a run under load reached
# 77% in 23 minutes. One test alone: $(PY) -m pytest tests/test_x.py -k name
test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 4

# Lint gate (.ci/run runs it after `make test`): ruff and strict mypy, their
# settings in pyproject.toml, their versions pinned in the test extra.
lint: $(STAMP)
	$(PY) -m ruff check checkpointers adapters
	$(PY) -m mypy checkpointers adapters

test-deep: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -n 4 --deep

# The lowest versions pyproject.toml allows, in a venv of their own: the saver
# and Agent Framework tests must pass on them (.ci/run runs it after `make test`).
# Raise a pin here together with the lower bound in pyproject.toml.
# agent-framework-core: the extra allows 1.13, but tests/af_workflows.py needs
# 1.19 (before it, @response_handler rejects its string annotations, from
# `from __future__ import annotations`); the adapter itself was checked on 1.13.
LOWEST_VENV  := .venv-lowest
LOWEST_PY    := $(LOWEST_VENV)/bin/python
LOWEST_STAMP := $(LOWEST_VENV)/.installed
LOWEST_PINS  := 'langgraph-checkpoint==4.3.0' 'langgraph==1.0.6' \
                'redis[hiredis]==8.0.0' 'hiredis==3.2.0' 'boto3==1.35.69' 'botocore==1.35.69' \
                'agent-framework-core==1.19.0' 'langgraph-checkpoint-sqlite==3.0.2' \
                'pytest==8.2.0' 'pytest-asyncio==0.24.0' 'pytest-timeout==2.3.1' \
                'hypothesis==6.100.0' 'moto[server,s3]==5.1.22'
LOWEST_TESTS := tests/test_saver.py tests/test_graphs.py tests/test_langgraph_conformance.py \
                tests/test_agent_framework.py

$(LOWEST_STAMP): pyproject.toml Makefile
	rm -rf $(LOWEST_VENV)
	$(PYTHON) -m venv $(LOWEST_VENV)
	$(LOWEST_PY) -m pip install --quiet --upgrade pip
	$(LOWEST_PY) -m pip install --quiet -e '.[test]' $(LOWEST_PINS)
	touch $(LOWEST_STAMP)

test-lowest: $(LOWEST_STAMP)
	$(LOWEST_PY) -m pip list 2>/dev/null | grep -iE '^(langgraph|langgraph-checkpoint|redis|hiredis|boto3|botocore|agent-framework-core|pytest|moto) '
	$(LOWEST_PY) -m pytest -q -p no:cacheprovider $(LOWEST_TESTS)

# LangGraph's own test suite (from the installed version's sdist) on our
# savers, against InMemorySaver and SqliteSaver. Slow (~12-16 min): not part of
# `make test`. Options: make langgraph-suite ARGS="--savers memory,sqlite -k interrupt"
LG_SUITE_STAMP := $(VENV)/.installed-langgraph-suite

$(LG_SUITE_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install --quiet -e '.[test,bench,langgraph-suite]'
	touch $(LG_SUITE_STAMP)

langgraph-suite: $(LG_SUITE_STAMP)
	$(PY) -m tests.langgraph_suite $(ARGS)

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run --quick

bench: $(STAMP)
	$(PY) -m benchmarks.run

clean:
	rm -rf $(VENV) $(LOWEST_VENV) .cache build *.egg-info .pytest_cache .hypothesis
