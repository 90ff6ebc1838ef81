# The two commands a new user needs: `make demo` and `make test`. Both set themselves up.
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: help setup demo test bench lint format typecheck clean

help:  ## list targets
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## create .venv and install stoker (idempotent)
	@bash scripts/bootstrap.sh

demo: setup  ## run the main job on the embedded stack
	$(BIN)/stoker demo

test: setup  ## run the test suite against real Kafka (Tansu), redis-server and Qdrant
	$(BIN)/python -m pytest -q

bench: setup  ## run benchmarks/, one JSON object per line
	@for f in benchmarks/bench_*.py; do $(BIN)/python $$f || exit 1; done

lint: setup  ## ruff check + format check
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

format: setup  ## ruff format + autofix
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

typecheck: setup  ## mypy strict on the packages
	$(BIN)/mypy

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
