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

test: lint
	.venv/bin/pytest $(PYTEST_ARGS)

stack-up: bootstrap
	.venv/bin/harness stack up

stack-down:
	.venv/bin/harness stack down
