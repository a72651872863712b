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

.PHONY: setup test lint bench bench-quick bench-scale report clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(if $(findstring torch,$(EXTRAS)),$(PY) -m pip install --quiet --disable-pip-version-check '$(TORCH_PIN)')
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q
	$(PY) -m ruff check .

# The long tests (differential fuzzing at length, every contender on every scenario): run by .ci/run too.
test-slow: setup
	$(PY) -m pytest -q -m slow

# The default matrix (harness/measure/matrix.py): about ten minutes on two cores (README, "Time budget").
bench: setup
	$(CLI) run --figures

# A reduced matrix (short traces, one repetition): about a minute.
bench-quick: setup
	$(CLI) run --quick --figures

# The scale sweeps (README, "How cost and memory grow"): context, pool and concurrency families, memory
# measured, growth figures and slopes. Not part of `make bench` (see the README for its time).
bench-scale: setup
	$(CLI) run --sweep context,pool,concurrency --label scale --figures

# Reports and figures of the latest run (RUN=<id or path> for another).
report: setup
	$(CLI) report $(RUN)

lint: setup
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +

# -- CI comparison of the designs (README, "Benchmarks in CI") ---------------------------------------------
BASELINE    ?= results/baselines/bench-ci.json
BENCH_LAST  := results/bench-ci-latest

.PHONY: bench-ci bench-compare bench-baseline gate

# Times every (operation x implementation) benchmark; the JSON goes to a fresh results/<time>-bench-ci/.
bench-ci: setup
	@dir=$$($(PY) -c 'from harness.output.results import new_run_dir; print(new_run_dir(label="bench-ci"))') && \
	$(PY) -m pytest benchmarks -q --benchmark-only --benchmark-json=$$dir/benchmarks.json && \
	ln -sfn $$(basename $$dir) $(BENCH_LAST) && echo "wrote $$dir/benchmarks.json"

# The latest bench-ci run against $(BASELINE), side by side with the change of each figure.
bench-compare: setup
	@test -f $(BENCH_LAST)/benchmarks.json || { echo "no bench-ci run yet: run make bench-ci first"; exit 1; }
	$(VENV)/bin/pytest-benchmark compare --between=min,median $(BASELINE) $(BENCH_LAST)/benchmarks.json

# Runs bench-ci and saves it as $(BASELINE) (e.g. make bench-baseline BASELINE=results/baselines/mybox.json).
bench-baseline: bench-ci
	$(CLI) baseline $(BENCH_LAST)/benchmarks.json $(BASELINE)

# The deterministic gate: allocations, callgrind instruction counts, a wide wall-clock floor.
gate: setup
	$(CLI) gate
