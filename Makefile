# The two commands a newcomer runs (each installs whatever is missing first, idempotently):
#   make grade   grade the reference at level 4 under faults; report in reports/runs/<run id>/
#   make test    the whole test suite on real services (what CI runs)
SHELL := /bin/bash
PYTEST_ARGS ?=
LEVEL ?= 4
SEED ?=

.PHONY: bootstrap grade lint test stack-up stack-down

bootstrap:
	@bash scripts/bootstrap.sh

grade: bootstrap
	.venv/bin/harness grade --sut reference --level $(LEVEL) $(if $(SEED),--seed $(SEED))

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/mypy  # the strictly typed modules: files in [tool.mypy] of pyproject.toml

# Two workers (pytest-xdist): the suite's grades in turn on one, every other test of the real stack in order on the
# other, each on a stack of its own; the unit tests fill in (the split: tests/conftest.py). PYTEST_WORKERS=0 runs
# everything in one process.
PYTEST_WORKERS ?= 2

test: lint
	.venv/bin/pytest -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

stack-up: bootstrap
	.venv/bin/harness stack up

stack-down:
	.venv/bin/harness stack down
