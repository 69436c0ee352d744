# The README's two commands: `make demo` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-headless test check lint typecheck contract bench soak fmt clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/runwatch demo

demo-headless: $(STAMP)
	$(BIN)/runwatch demo --headless --seconds 20

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff format --check supervisor tui tests
	$(BIN)/ruff check supervisor tui tests

typecheck: $(STAMP)
	$(BIN)/mypy

contract: $(STAMP)
	$(BIN)/lint-imports

check: lint typecheck contract test

bench: $(STAMP)
	@failed=""; for f in tests/perf/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || failed="$$failed $$f"; done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed or missed a target:$$failed"; exit 1; fi

# Not part of `make test`: the demo workload under random faults with an invariant checker.
# `make soak MINUTES=2`; replay a soak with `make soak SEED=<the seed it printed>`.
MINUTES ?= 10
SEED ?=
soak: $(STAMP)
	$(BIN)/python -m tests.soak.run --minutes $(MINUTES) $(if $(SEED),--seed $(SEED))

fmt: $(STAMP)
	$(BIN)/ruff format supervisor tui tests
	$(BIN)/ruff check --fix supervisor tui tests

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
