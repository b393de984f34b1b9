# Two commands for a fresh machine: `make demo` and `make test` (both run `make setup` first).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.enhydra-installed
# The reference AsyncAPI parser (npm, pinned by package-lock.json) that validates our documents.
ASYNCAPI_STAMP := tools/asyncapi/node_modules/.enhydra-installed
PYTEST_ARGS ?=

.PHONY: setup demo test test-fast lint clean bench

setup: $(STAMP) $(ASYNCAPI_STAMP)
	@$(VENV)/bin/enhydra kafka fetch
	@$(PY) -m enhydra.spark.jars >/dev/null
	@# Toxiproxy for tests/faults, built with go once into ~/.cache/enhydra (skipped when there).
	@$(PY) -m enhydra.devtools.toxiproxy >/dev/null || echo "enhydra: tests/faults need Toxiproxy (see above)"

$(STAMP): pyproject.toml examples/ledger/pyproject.toml
	@command -v java >/dev/null || { echo "java is missing: apt-get install openjdk-17-jre-headless"; exit 1; }
	@command -v mvn >/dev/null || { echo "mvn is missing: apt-get install maven"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,tracing,postgres]' -e examples/ledger
	@touch $(STAMP)

$(ASYNCAPI_STAMP): tools/asyncapi/package.json tools/asyncapi/package-lock.json
	@command -v npm >/dev/null || { echo "npm is missing (it installs the AsyncAPI parser): apt-get install nodejs npm"; exit 1; }
	cd tools/asyncapi && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error
	@touch $(ASYNCAPI_STAMP)

demo: setup
	$(PY) scripts/demo.py

# Two lanes by default (what CI runs), one after the other: the suite without the `timing`
# tests on PARALLEL xdist workers (each starts its own broker on free ports; the query tests
# share one cluster on one worker), then the `timing` tests alone, so a failover or stop bound
# never competes with a Spark job for the cores. Both lanes always run; a lane that selects
# nothing (pytest's exit 5, e.g. PYTEST_ARGS=tests/unit) is not a failure. PARALLEL= (empty):
# one serial run. Measured on the 2-core machine, quiet: serial 38 min, two lanes 30 min.
PARALLEL ?= 2

test: setup
ifeq ($(strip $(PARALLEL)),)
	$(PY) -m pytest $(PYTEST_ARGS)
else
	@$(PY) -m pytest -n $(PARALLEL) --dist loadgroup -m "not timing" $(PYTEST_ARGS); lane=$$?; \
	$(PY) -m pytest -m timing $(PYTEST_ARGS); timing=$$?; \
	for code in $$lane $$timing; do test $$code -eq 0 -o $$code -eq 5 || exit $$code; done
endif

# No broker, no Spark, no containers, no service processes: tests/conftest.py fails a test of
# this lane that starts one (its marker is missing), and gives property tests fewer examples.
# Pure tests share nothing, so they run on FAST_WORKERS processes (0: in this one).
FAST_MARKERS := not integration and not slow and not template and not spark and not containers
FAST_WORKERS ?= 2

test-fast: setup
	ENHYDRA_TEST_LANE=fast $(PY) -m pytest -p no:schemathesis -n $(FAST_WORKERS) \
		-m "$(FAST_MARKERS)" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check runtime tests examples scripts
	$(VENV)/bin/ruff format --check runtime tests examples scripts

# The competitors, the profiler and the plots (`.[bench]`), for `make bench` only: `make setup`
# and `make test` stay as fast as before.
BENCH_STAMP := $(VENV)/.enhydra-bench-installed

$(BENCH_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	@touch $(BENCH_STAMP)

bench: setup $(BENCH_STAMP)
	$(PY) -m bench $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
