# The two commands: `make demo` and `make test`. Each builds its own .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint clean

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

test: lint
	./scripts/ensure-postgres
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
