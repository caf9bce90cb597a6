# The two commands: `make demo` and `make test`. Each builds its own .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast lint clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/marque demo

lint: $(STAMP)
	$(BIN)/ruff check src tests
	$(BIN)/mypy src

# The suite runs in JOBS pytest-xdist workers (each with its own PostgreSQL server and
# Chromium), a whole test file per worker at a time; `make test JOBS=1` runs it in one.
JOBS ?= 2

test: lint
	./scripts/ensure-postgres
	./scripts/ensure-chromium
	./scripts/ensure-faketime
	./scripts/ensure-oidc-provider
	$(BIN)/python -m pytest -q $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile,)

# The tiers that need no server and no system package: no PostgreSQL, Chromium, node or
# libfaketime (README: "Running tier by tier").
FAST := not pg and not browser and not oidc and not faketime

test-fast: lint
	$(BIN)/python -m pytest -q -m "$(FAST)" $(if $(filter-out 1,$(JOBS)),-n $(JOBS) --dist loadfile,)

# The reliability campaign (docs/reliability.md): `make soak` is bounded (at most 15
# minutes here); `make soak FULL=1` runs the fault matrix's full counts (hours).
.PHONY: soak

soak: $(STAMP)
	./scripts/ensure-postgres
	./scripts/ensure-faketime
	$(BIN)/python tests/soak/run.py $(if $(FULL),--full,)

# Benchmarks (bench/README.md): `make bench`, or `make bench QUICK=1` for a run under two minutes.
BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: bench

$(BENCH_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	./scripts/ensure-postgres
	QUICK="$(QUICK)" $(BIN)/python bench/run.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
