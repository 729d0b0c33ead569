# Two commands for a fresh Debian/Ubuntu machine with only Python: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-stamp
BIN := $(VENV)/bin
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: run test test-fast lint typecheck system-deps bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,postgres,run]'
	touch $@

# Redis and PostgreSQL server binaries from Debian's packages (installed when missing, as root).
system-deps:
	@bash deploy/local/system-deps.sh

run: $(STAMP) system-deps
	@bash deploy/local/run.sh

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

test: $(STAMP) system-deps lint typecheck
	$(BIN)/pytest -n 2 --dist loadfile $(PYTEST_ARGS)

# A developer's quick loop, not CI's: leaves out the tests marked slow (subprocess workers, beat,
# Flower, browsers, Sentinel, network namespaces, outages; tests/slowness.py finds them).
test-fast: $(STAMP) system-deps
	$(BIN)/pytest -n 2 --dist loadfile -m "not slow" $(PYTEST_ARGS)

# Own Redis and PostgreSQL; 12-15 minutes on 2 cores. BENCH_ARGS=--quick: a smoke test (quick.json).
bench: $(STAMP) system-deps
	$(BIN)/python -m bench.run --readme $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .run .pytest_cache .mypy_cache .ruff_cache

# Rewrites the README's generated tables (service tasks, errors, variables) from their source.
.PHONY: docs
docs: $(STAMP)
	$(BIN)/python -m celeryapp.interfaces.docs_tables
