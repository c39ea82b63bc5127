# Every target does its own set-up: a fresh machine needs only python3 and make.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install run test bench lint typecheck format clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/dpmm demo --out out/demo

test: $(STAMP)
	$(BIN)/ruff check pipeline kernels flows tests
	$(BIN)/ruff format --check pipeline kernels flows tests
	$(BIN)/mypy
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/pytest -q -m bench tests/benchmarks -s -p no:cacheprovider

lint: $(STAMP)
	$(BIN)/ruff check pipeline kernels flows tests
	$(BIN)/mypy

format: $(STAMP)
	$(BIN)/ruff format pipeline kernels flows tests
	$(BIN)/ruff check --fix pipeline kernels flows tests

clean:
	rm -rf $(VENV) out .pytest_cache .mypy_cache .ruff_cache
