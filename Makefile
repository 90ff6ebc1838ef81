# The two commands a new user needs: `make demo` and `make test`. Both set themselves up.
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: help setup lock demo test bench lint format typecheck docs clean

help:  ## list targets
	@grep -E '^[a-z]+:.*##' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

setup:  ## create .venv and install stoker (idempotent)
	@bash scripts/bootstrap.sh

# pip-compile (pip-tools) uses pip and its config, so the CPU torch comes from find-links
# (/opt/wheels) or PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu. Pins already in the
# lock are kept when they still fit pyproject.toml; `make lock UPGRADE=1` moves all to the newest.
LOCK_FLAGS := --generate-hashes --extra dev --allow-unsafe --strip-extras \
	--no-emit-index-url --no-emit-find-links

lock:  ## refresh requirements.lock from pyproject.toml
	@[ -x $(BIN)/pip-compile ] || bash scripts/bootstrap.sh --lock-only
	CUSTOM_COMPILE_COMMAND="make lock" $(BIN)/pip-compile -q $(LOCK_FLAGS) \
		$(if $(UPGRADE),--upgrade) -o requirements.lock pyproject.toml
	@grep -q '^torch==[^ ]*+cpu ' requirements.lock && ! grep -qiE '^(nvidia-|triton)' requirements.lock || { \
		echo "lock: pip found the CUDA torch, not the CPU one: set" \
			"PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu, git checkout requirements.lock" \
			"and run make lock again" >&2; exit 1; }

demo: setup  ## run the main job on the embedded stack and the real model (llama-server)
	$(BIN)/stoker demo

# Two workers (pytest-xdist), each with its own brokers, Redis and llama-server (-t 1: one per
# core): serially the suite kept 1.05 of the 2 cores busy, waiting on brokers and subprocesses.
TEST_WORKERS ?= 2

test: setup  ## run the test suite against real Kafka (Tansu), redis-server and Qdrant
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25

# Every line also goes to a results file that opens with the commit, date, machine and load.
BENCH_STAMP := $(shell date -u +%Y%m%dT%H%M%SZ)
BENCH_RESULTS ?= out/bench/results-$(BENCH_STAMP).jsonl

bench: setup  ## run benchmarks/ (BENCH_SLOW=1: the slow rows too), one JSON line each, also into out/bench/results-*.jsonl
	@mkdir -p $(dir $(BENCH_RESULTS))
	@$(BIN)/python benchmarks/_provenance.py $(if $(BENCH_SLOW),--slow) $(if $(BENCH_ONLY),--only $(BENCH_ONLY)) > $(BENCH_RESULTS)
	@BENCH_RESULTS_FILE=$(BENCH_RESULTS) $(BIN)/python benchmarks/_run.py $(if $(BENCH_SLOW),--slow) $(if $(BENCH_ONLY),--only $(BENCH_ONLY))
	@$(BIN)/python benchmarks/_provenance.py --end >> $(BENCH_RESULTS)
	@echo "bench: results in $(BENCH_RESULTS)"

lint: setup  ## ruff check + format check + the import-linter layer contract
	$(BIN)/ruff check . && $(BIN)/ruff format --check . && $(BIN)/lint-imports

format: setup  ## ruff format + autofix
	$(BIN)/ruff format . && $(BIN)/ruff check --fix .

typecheck: setup  ## mypy strict on the packages
	$(BIN)/mypy

docs: setup  ## regenerate docs/settings.md from stoker/settings.py (tests/test_docs.py checks it)
	$(BIN)/python scripts/gen_settings_doc.py

clean:  ## remove the venv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
