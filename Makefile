# Two commands on a fresh machine with only Python 3.11 and make: `make demo` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo demo-serve test test-quick check lint e2e constraints stack-up stack-down clean

# Let Python cache bytecode (__pycache__) even where the environment says not to: with
# PYTHONDONTWRITEBYTECODE=1 every `airflow dags test`, component, local cloud and trainer process compiles
# Airflow, the Google clients and FastAPI from source again (measured: ~25 s -> ~13 s per `dags test`).
unexport PYTHONDONTWRITEBYTECODE

# Install once; again only when the requirements, the constraints or the package layout change.
$(STAMP): requirements.txt constraints.txt pyproject.toml include/devtools/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# uv (from PyPI) installs the pinned tree in seconds; output is kept quiet unless a step fails.
	@$(PY) -m pip install -q "uv>=0.5" > $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; exit 1; }
	@# The project (runtime deps from requirements.txt) with its test, dev and workload extras, and the tooling distribution
	@# (include/devtools, interlude_dev), every version pinned by constraints.txt.
	@$(VENV)/bin/uv pip install -q --python $(PY) -c constraints.txt -e '.[test,dev,workload]' -e include/devtools >> $(VENV)/install.log 2>&1 \
		|| { cat $(VENV)/install.log; exit 1; }
	@touch $(STAMP)
	@echo "installed into $(VENV) (log: $(VENV)/install.log)"

demo: $(STAMP)
	$(PY) include/scripts/demo.py

# Continues from `make demo` (runs it first if its fine-tuned checkpoint is not on disk): serve it on GKE.
demo-serve: $(STAMP)
	$(PY) include/scripts/demo_serve.py

# pytest-xdist: seven workers on two cores. The end-to-end tests mostly wait on the processes they start: with four
# workers the machine sat idle 24 % of the run, with six 14-20 %, with seven 14 % (back to back at 6b04912: six
# 7 min 36 s, seven 6 min 58 s, the same 12.0 CPU-min; README, "How long the suite takes"). Eight cost more CPU than
# they fill. Two of the workers run the stack's shards, which mostly wait too; tests/xdist_scheduling.py runs the
# stack's tests in two shards (TEST_STACK_SHARDS) and each file's module fixtures together.
# TEST_WORKERS=0 runs everything in one process, in file order.
TEST_WORKERS ?= 7
# The run of real length (the default model, 2,000 steps through a maintenance, ~4 CPU-minutes: issue 43) runs after
# the rest, alone: beside the seven workers it was one more core-hog on a 2-core machine for 7 minutes.
LONG_TESTS := tests/include/interlude_workload/test_real_length.py
test: check
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup --ignore=$(LONG_TESTS) $(PYTEST_ARGS)
	$(PY) -m pytest $(LONG_TESTS) $(PYTEST_ARGS) || [ $$? -eq 5 ]

# The loop while editing: the tests that start no real process (Airflow, the stack, a local cloud process, trainers,
# agents, Chromium) and train no model; tests/quick.py decides from what each test and its fixtures call. No checks
# first; `make test` (the whole suite) is what CI runs. 3,448 tests, 187-199 CPU-s (three workers' collection ~40 of
# them), so 95-100 s at the least on two idle cores; 3 min 29 s beside other work at load 4-7, 6 min 24 s at load 11.
# Three workers, not two: many of these tests wait on the local cloud's clock or on GCS, and another worker's CPU
# fills the wait (two: 9 min 13 s at load 11-17).
QUICK_WORKERS ?= 3
test-quick: $(STAMP)
	$(PY) -m pytest --quick -n $(QUICK_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# Format, lint (incl. blind excepts, stale noqa, complexity <= 10) and types: seconds, before the suite.
check: $(STAMP)
	$(VENV)/bin/ruff format --check --quiet dags plugins include tests benchmarks
	$(VENV)/bin/ruff check dags plugins include tests benchmarks
	$(PY) -m mypy

lint: check

# Pin the whole tree from a known-good venv (Airflow's own constraints files are not reachable here).
constraints: $(STAMP)
	$(PY) -m pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

# A production-shaped Airflow on this machine: PostgreSQL, Redis, api-server, scheduler, dag-processor,
# triggerer and a Celery worker from one airflow.cfg, plus the local cloud (state and logs in var/stack).
stack-up: $(STAMP)
	$(PY) include/scripts/stack.py up

stack-down:
	$(PY) include/scripts/stack.py down

clean:
	rm -rf var .pytest_cache
