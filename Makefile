# The README's two commands: `make demo` and `make test`. Both set up .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo demo-headless lock test test-fast check lint typecheck contract bench soak fmt clean

EXTRAS := tokens,demo,test,dev

# The exact versions of requirements.lock (`make lock` makes it anew), then runwatch itself.
$(STAMP): pyproject.toml requirements.lock
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e '.[$(EXTRAS)]'
	$(BIN)/python -m pip check
	touch $(STAMP)

# Resolve pyproject.toml's dependencies afresh in a scratch environment and pin what it installed.
lock:
	rm -rf .lockenv && $(PYTHON) -m venv .lockenv
	.lockenv/bin/python -m pip install --quiet -e '.[$(EXTRAS)]'
	{ echo "# make lock: every package that make installs, pinned (runwatch itself excluded)"; \
	  .lockenv/bin/python -m pip freeze --exclude-editable; } > requirements.lock
	rm -rf .lockenv

demo: $(STAMP)
	$(BIN)/runwatch demo

demo-headless: $(STAMP)
	$(BIN)/runwatch demo --headless --seconds 20

# Every test: tests/unit/ (fast: no sshd, Slurm, Prometheus, tmux or second user) and tests/e2e/,
# first the tests marked `serial`, by themselves (when a test file marks any), then all the
# others on TEST_WORKERS processes, each with its own sshd, Slurm and Prometheus (the tests wait
# on processes more than they compute: 6 measured fastest on 2 cores, 759 s against 983 s with 4);
# the 20 slowest are listed.
# Property tests try their full count of examples here (the hypothesis profile `long`, see
# tests/properties.py); elsewhere a bounded few.
TEST_WORKERS ?= 6
test: $(STAMP)
	if grep -rqE 'mark\.serial' tests; then HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest -q -p no:xdist -m serial --durations=20; fi
	HYPOTHESIS_PROFILE=long $(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not serial" --durations=20

# The unit tier alone, in under half a minute: the loop to run while editing (the hypothesis
# profile `unit`: a bounded number of examples per property test).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m unit tests/unit

lint: $(STAMP)
	$(BIN)/ruff format --check supervisor tui tests
	$(BIN)/ruff check supervisor tui tests
	$(BIN)/vermin --quiet --no-tips --violations -t=3.8- supervisor/agent

# mypy's files: supervisor/ and tui/ (strict) and tests/ (ordinary checking); see pyproject.toml.
typecheck: $(STAMP)
	$(BIN)/mypy

contract: $(STAMP)
	$(BIN)/lint-imports

# lint (ruff, and vermin: the agent runs on Python 3.8), mypy on the code and the tests,
# the import contracts, then every test.
check: lint typecheck contract test

# `make bench LONG=1`: instead, the long mode of the dashboard's and the watcher's benchmarks, side
# by side (the demo + 8 live runs + strangers' processes, LONG_MINUTES each; RSS slope judged).
LONG ?=
LONG_MINUTES ?= 60
bench: $(STAMP)
ifeq ($(LONG),)
	@failed=""; for f in tests/perf/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || failed="$$failed $$f"; done; \
	if [ -n "$$failed" ]; then echo "benchmarks that failed or missed a target:$$failed"; exit 1; fi
else
	@$(BIN)/python tests/perf/bench_tui.py --long --minutes $(LONG_MINUTES) & tui=$$!; \
	$(BIN)/python tests/perf/bench_watch.py --long --minutes $(LONG_MINUTES) & watch=$$!; \
	failed=""; wait $$tui || failed="$$failed bench_tui.py"; wait $$watch || failed="$$failed bench_watch.py"; \
	if [ -n "$$failed" ]; then echo "long benchmarks that failed or missed a target:$$failed"; exit 1; fi
endif

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
	rm -rf $(VENV) .lockenv .pytest_cache .mypy_cache .ruff_cache
