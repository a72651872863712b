# Two commands do everything on a fresh clone: `make bench` and `make test`.
comma   := ,
VENV    ?= .venv
PYTHON  ?= python3
# The design's packages are the default: torch brings the rule-3 study and the sglang contender.
# EXTRAS=test is the lighter path (torch rows are then marked skipped, with the reason).
EXTRAS  ?= test,torch,hashing
# torch's pin on our machines: a local CPU build (any other release pulls a multi-GB CUDA build).
TORCH_PIN ?= torch==2.13.0
PY      := $(VENV)/bin/python
CLI     := $(VENV)/bin/kvblock-bench
STAMP   := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: setup test lint bench bench-quick bench-scale report site clean

setup: $(STAMP)

# Each step says what it does before it starts: a fresh install is minutes of downloads.
$(STAMP): pyproject.toml
	@echo "setup: creating the virtual environment $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(if $(findstring torch,$(EXTRAS)),@echo "setup: installing $(TORCH_PIN)$(comma) a CPU build (the largest download)")
	$(if $(findstring torch,$(EXTRAS)),$(PY) -m pip install --quiet --disable-pip-version-check '$(TORCH_PIN)')
	@echo "setup: installing kvblock-bench with [$(EXTRAS)] (numpy, numba, pandas, matplotlib, pytest, ...)"
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $(STAMP)
	@echo "setup: done ($(VENV))"

test: setup
	$(PY) -m pytest -q
	$(PY) -m ruff check .

# The long tests (differential fuzzing at length, every contender on every scenario): run by .ci/run too.
test-slow: setup
	$(PY) -m pytest -q -m slow

# The default matrix (harness/run/matrix.py); each target's time: results/times/times.json (docs/time-budget.md).
bench: setup
	$(CLI) run --figures

# A reduced matrix (short traces, one repetition).
bench-quick: setup
	$(CLI) run --quick --figures

# The scale sweeps (docs/scale.md): context, pool and concurrency families, memory
# measured, growth figures and slopes. Not part of `make bench` (see the README for its time).
bench-scale: setup
	$(CLI) run --sweep context,pool,concurrency --label scale --figures

# Reports and figures of the latest run (RUN=<id or path> for another).
report: setup
	$(CLI) report $(RUN)

# The static site (docs/site.md): the reference run and the committed studies, or SITE_RUNS (run folders, or
# folders holding them: several machines side by side) into SITE_OUT; open $(SITE_OUT)/index.html, no server.
SITE_RUNS ?=
SITE_OUT  ?= build/site
site: setup
	$(CLI) site $(SITE_RUNS) --out $(SITE_OUT)

lint: setup
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# -- Benchmarks in CI (README, "Benchmarks in CI") ------------------------------------------------------------
# The CI profile (harness/ci/profile.py: every design batched and in the step regime on paper; its time:
# results/times/times.json) is measured by bench-ci and compared by bench-compare against BASELINE, a run of the
# same profile on the reference machine.
BASELINE     ?= results/baselines/bench-ci
BENCH_LAST   ?= results/bench-ci-latest
COMPARE_ARGS ?=

.PHONY: bench-ci bench-compare bench-baseline bench-ops gate ci-compare

# Runs the CI profile into results/<time>-bench-ci/ (results/bench-ci-latest points to it).
bench-ci: setup
	$(CLI) run $$($(PY) -m harness.ci.profile) --label bench-ci --no-progress && \
	ln -sfn $$(readlink results/latest) $(BENCH_LAST)

# The latest bench-ci run against $(BASELINE): fails when a figure is slower beyond the threshold, and refuses
# a baseline from another machine or other software (COMPARE_ARGS=--allow-other-machine compares anyway).
bench-compare: setup
	@test -f $(BENCH_LAST)/results.csv || { echo "no bench-ci run yet: run make bench-ci first"; exit 2; }
	@test -f $(BASELINE)/results.csv || { echo "no baseline at $(BASELINE): make bench-baseline makes one"; exit 2; }
	$(CLI) compare $(BASELINE) $(BENCH_LAST) $(COMPARE_ARGS)

# Runs bench-ci and keeps it as $(BASELINE) (e.g. make bench-baseline BASELINE=results/baselines/mybox).
bench-baseline: bench-ci
	$(CLI) baseline $(BENCH_LAST) $(BASELINE)

# The per-operation pytest-benchmark suite (benchmarks/), timed: one Python call per round (make test runs it
# once, untimed, as a smoke test).
bench-ops: setup
	$(PY) -m pytest benchmarks -q --benchmark-only --benchmark-enable

# The deterministic gate: allocations, callgrind instruction counts, a wide wall-clock floor; its rules are
# [tool.kvblock-bench.gate] in pyproject.toml.
gate: setup
	$(CLI) gate

# What CI runs for benchmarks (.ci/run, examples/ci/github-actions.yml): the gate, then `kvblock-bench ab` of
# BASE_REF (default: this commit again) against this checkout on the pull-request profile. `make ci-compare` ends
# with the script's exit status (README, "Benchmarks in CI"). GNU make itself exits 2 for any failed recipe, and
# can exit 1 only in question mode (-q); so, when ci-compare is the only goal (and make is not asked for a dry run),
# the script runs while this file is read (its output on stderr) and make then ends as it did: at once for 0, in
# question mode for 1, with an error (exit 2) for any other status, naming it (4, too few pairs, included).
CI_COMPARE ?= scripts/ci_compare.sh
ifeq ($(strip $(MAKECMDGOALS)) $(findstring n,$(firstword -$(MAKEFLAGS)))$(findstring q,$(firstword -$(MAKEFLAGS))),ci-compare )
CI_COMPARE_STATUS := $(shell $(MAKE) --no-print-directory -s setup 1>&2 && $(CI_COMPARE) $(BASE_REF) 1>&2; echo $$?)
ifeq ($(CI_COMPARE_STATUS),1)
MAKEFLAGS += --question
else ifneq ($(CI_COMPARE_STATUS),0)
$(error $(CI_COMPARE) exited with status $(CI_COMPARE_STATUS))
endif
ci-compare:
	@:
else
ci-compare: setup
	$(CI_COMPARE) $(BASE_REF)
endif
