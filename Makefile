# Two commands do everything on a fresh clone: `make bench` and `make test`.
comma   := ,
VENV    ?= .venv
PYTHON  ?= python3
EXTRAS  ?= test
PY      := $(VENV)/bin/python
CLI     := $(VENV)/bin/kvblock-bench
STAMP   := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: setup test lint bench bench-quick report clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[$(EXTRAS)]'
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q
	$(PY) -m ruff check .

# The default matrix (all scenarios, all implementations, both regimes): about ten minutes on two cores.
bench: setup
	$(CLI) run --figures

# A reduced matrix (short traces, one repetition): about a minute.
bench-quick: setup
	$(CLI) run --quick --figures

# Reports and figures of the latest run (RUN=<id or path> for another).
report: setup
	$(CLI) report $(RUN)

lint: setup
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
