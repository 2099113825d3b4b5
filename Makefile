# The two commands a newcomer runs (each installs whatever is missing first, idempotently):
#   make grade   grade the reference at level 4 under faults; report in reports/runs/<run id>/
#   make test    the test suite on real services (what CI runs); `make test-long` runs the long runs it leaves out
SHELL := /bin/bash
PYTEST_ARGS ?=
LEVEL ?= 4
SEED ?=

.PHONY: bootstrap grade lint test test-long stack-up stack-down

bootstrap:
	@bash scripts/bootstrap.sh

grade: bootstrap
	.venv/bin/harness grade --sut reference --level $(LEVEL) $(if $(SEED),--seed $(SEED))

lint: bootstrap
	.venv/bin/ruff check .
	.venv/bin/mypy  # the strictly typed modules: files in [tool.mypy] of pyproject.toml

test: lint
	.venv/bin/pytest $(PYTEST_ARGS)

# The long runs (marker `long`): the TypeScript example's grade, explore, soak, a sharded class, a load curve, the wheel.
test-long: bootstrap
	.venv/bin/pytest --long -m long $(PYTEST_ARGS)

stack-up: bootstrap
	.venv/bin/harness stack up

stack-down:
	.venv/bin/harness stack down
