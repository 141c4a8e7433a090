# Every target does its own set-up: a fresh machine with Python 3.11 needs nothing else.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` needs only the package; the test targets add the `test` extra.
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# Your data folder (a `shared/data` folder beside the checkout by default): the real-data
# quality runs get it as --config.data.data_dir, the tests that read it as MULTIPOD_DATA_DIR.
DATA_DIR ?= ../shared/data
WORKDIR ?= /tmp/multipod
CPU_ENV := JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 MULTIPOD_DATA_DIR=$(abspath $(DATA_DIR))

.PHONY: run test test-system test-ci-slow test-slow quality quality-real results-table tpu-table lint format clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST_STAMP)

venv: $(STAMP)

# The main job: tiny BERT time-to-accuracy run on 8 fake CPU devices (2x4 data x model mesh).
run: $(STAMP)
	rm -rf $(WORKDIR)/bert_tiny  # a fresh run: a left-over checkpoint there would be resumed
	$(CPU_ENV) $(PY) -m launch.train --config configs/bert.py:tiny --workdir $(WORKDIR)/bert_tiny

# The test targets' pytest runs share one persistent compilation cache each
# (tests/with_test_cache.sh: fresh for the run and removed after it, or the one `.ci/run`
# names for all of them), so a program compiled by several tests or training subprocesses
# is compiled once. The full-size TPU compiles of tests/aot run without it: each is
# compiled once, and its entry would be hundreds of megabytes.
WITH_TEST_CACHE := bash tests/with_test_cache.sh

# The suite without the tests marked slow (long end-to-end runs; see test-slow).
test: $(TEST_STAMP)
	$(CPU_ENV) $(WITH_TEST_CACHE) $(PY) -m pytest -q -n 2 --dist loadgroup \
	  --durations=15 -m "not slow" tests

# Tests live in folders by kind: tests/unit (the code's parts), tests/tools (benchmarks,
# planners, table writers, the docs checks), tests/system (multi-client runs and their
# failures, checkpoint/resume/preemption, whole runs with the work directory in a bucket,
# supervised restarts), tests/aot (full-size TPU compiles), tests/quality (tiny runs to their
# targets as tests; CI runs them as `make quality`). `make test` runs every test not marked
# slow, in every folder.
SYSTEM_TESTS := tests/system
AOT_SYSTEM_TESTS := tests/aot
# Two lanes side by side: the system tests in one pytest process, and the full-size TPU
# compiles one at a time, each in a pytest process of its own, so a compile's host memory
# goes with its process: BERT-large's full-size compiles peak at 10.6-11.4 GB resident each,
# and two of them beside the system lane do not fit CI's 24 GiB.
test-system: $(TEST_STAMP)
	@bash -c 'set -u; $(CPU_ENV) $(WITH_TEST_CACHE) $(PY) -m pytest -q --durations=15 -m slow $(SYSTEM_TESTS) & lane=$$!; \
	  fail=0; ids=$$($(CPU_ENV) $(PY) -m pytest -q --collect-only -m slow $(AOT_SYSTEM_TESTS) | grep "::"); \
	  test -n "$$ids" || { echo "no AOT system tests collected"; fail=1; }; \
	  for id in $$ids; do $(CPU_ENV) MULTIPOD_TEST_CACHE= $(PY) -m pytest -q -p no:cacheprovider -m slow "$$id" || fail=1; done; \
	  wait $$lane || fail=1; exit $$fail'

# The other slow tests CI runs: those marked slow in tests/unit and tests/tools (e.g. the
# spatial-partitioning equivalences, 2-process evals, the planner's compiles, every model's
# predict and export from a tiny checkpoint).
CI_SLOW_TESTS := tests/unit tests/tools
test-ci-slow: $(TEST_STAMP)
	$(CPU_ENV) $(WITH_TEST_CACHE) $(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 -m slow $(CI_SLOW_TESTS)

# Every slow test: test-system's two lanes, then test-ci-slow's and tests/quality's on two
# workers.
test-slow: test-system
	$(CPU_ENV) $(WITH_TEST_CACHE) $(PY) -m pytest -q -n 2 --dist loadgroup --durations=15 -m slow \
	  $(CI_SLOW_TESTS) tests/quality

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

format: $(TEST_STAMP)
	$(VENV)/bin/ruff format . && $(VENV)/bin/ruff check --fix .

# Time-to-accuracy runs that CI checks: every model's tiny run, and BERT wikitext when the data exists.
quality: $(STAMP)
	$(CPU_ENV) $(PY) -m launch.quality --runs bert:tiny,transformer:tiny,ssd:tiny,maskrcnn:tiny --workdir $(WORKDIR)/quality
	@if [ -d "$(DATA_DIR)" ]; then \
	  $(CPU_ENV) $(PY) -m launch.quality --runs bert:wikitext --data_dir $(DATA_DIR) --workdir $(WORKDIR)/quality; \
	else echo "quality: $(DATA_DIR) not found, skipping real-data runs"; fi

# Real-data runs (minutes each).
quality-real: $(STAMP)
	$(CPU_ENV) $(PY) -m launch.quality --runs bert:wikitext,transformer:multi30k,ssd:coco128,maskrcnn:coco128 --data_dir $(DATA_DIR) --workdir $(WORKDIR)/quality-real

# The README's results table, from the result.json of every quality run found.
results-table: $(STAMP)
	$(PY) -m launch.results_table --results '$(WORKDIR)/quality/*,$(WORKDIR)/quality-real/*' --readme README.md

# docs/tpu-table.md and the README's TPU rows, from docs/results/tpu-table-rows.json.
tpu-table: $(STAMP)
	$(PY) -m launch.tpu_table

clean:
	rm -rf $(VENV) *.egg-info
