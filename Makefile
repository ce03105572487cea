# growpipe: every target sets up .venv on first use (and again when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
STAMP  := $(VENV)/.installed
BIN    := $(VENV)/bin

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	@touch $(STAMP)

## demo: the main job on the embedded default (digits, a growable AL net, one growth step).
## RAY_AUTH_MODE=token is what Ray 2.60 chooses for a new local Ray when unset, said here (before Ray is imported)
## so that Ray does not warn about it at every start; a value of your own wins.
demo: $(STAMP)
	RAY_AUTH_MODE=$${RAY_AUTH_MODE:-token} $(BIN)/growpipe train --config configs/demo.yaml --json-out runs/demo/result.json --save runs/demo/checkpoint

## test: lint (ruff, then mypy on src/: its settings are in pyproject.toml), then the whole test suite, its files
## shared out among TEST_WORKERS pytest processes (pytest-xdist), each with one local Ray of its own for its tests
TEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/mypy

clean:
	rm -rf runs .pytest_cache .mypy_cache
