# Two commands for a fresh Debian/Ubuntu machine with only Python: `make run` and `make test`.
VENV ?= .venv
PYTHON ?= python3
STAMP := $(VENV)/.installed-stamp
BIN := $(VENV)/bin
PYTEST_ARGS ?=
BENCH_ARGS ?=

.PHONY: run test test-fast lint typecheck system-deps bench clean

# pip's output goes to a log (shown when it fails): a first `make run` prints the addresses, not pip.
# constraints.txt pins every package to the versions the tests passed with.
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	@echo "installing chordbeat and its dependencies into $(VENV) (log: $(VENV)/install.log)"
	@$(BIN)/pip install --progress-bar off --upgrade pip > $(VENV)/install.log 2>&1 \
	  && $(BIN)/pip install --progress-bar off -c constraints.txt -e '.[test,postgres,run]' >> $(VENV)/install.log 2>&1 \
	  || { tail -n 40 $(VENV)/install.log; exit 1; }
	@touch $@

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

# axe-core from the npm registry, pinned, for the dashboard's accessibility test
# (tests/test_accessibility.py); installed once into .run/npm, nothing fetched while tests run.
AXE_VERSION := 4.14.1
AXE_STAMP := .run/npm/.axe-core-$(AXE_VERSION)
$(AXE_STAMP): | system-deps
	@mkdir -p .run/npm
	@npm install --prefix .run/npm --no-save --no-package-lock --no-audit --no-fund --loglevel=error \
	  axe-core@$(AXE_VERSION) > .run/npm/install.log 2>&1 || { tail -n 20 .run/npm/install.log; exit 1; }
	@touch $@

# Everything, slow tests included (-m "" undoes pyproject's -m 'not slow'); CI's command.
# Four processes on two cores: a slow test mostly waits on its workers (docs/testing.md).
test: $(STAMP) system-deps $(AXE_STAMP) lint typecheck
	$(BIN)/pytest -n 4 --dist loadfile -m "" $(PYTEST_ARGS)

# A developer's quick loop, not CI's, as plain `pytest` is: leaves out the tests marked slow
# (subprocess workers, beat, Flower, browsers, Sentinel, network namespaces, outages;
# tests/support/slowness.py finds them).
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
