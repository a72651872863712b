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

lint: setup
	$(PY) -m ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .benchmarks
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
