# Each target creates .venv when it is missing and installs what it needs into it.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
export OMP_NUM_THREADS ?= 1
export MKL_NUM_THREADS ?= 1
export LANDSCAPE_THREADS ?= 1

.PHONY: install install-dev demo test docs docs-demo docs-numbers figures bench lint clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip

$(VENV)/.installed: $(PY) pyproject.toml
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1
	$(PY) -m pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

install-dev: $(VENV)/.installed-dev

demo: install
	$(VENV)/bin/landscape --threads 1 --root demo-out/checkpoints demo --out demo-out

test: install-dev
	$(PY) -m pytest -q -n auto --maxprocesses 8

# The documentation site (docs/, mkdocs.yml) into site/; --strict: a broken link or docstring reference fails.
docs: install-dev
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# Regenerate the demo output the docs quote (docs/generated/demo-output.txt) from a fresh run.
docs-demo: install
	rm -rf demo-out
	$(VENV)/bin/landscape --threads 1 --root demo-out/checkpoints demo --out demo-out > docs/generated/demo-output.txt

# Regenerate every other number the docs quote (docs/generated/*: the blocks marked `run: record`), each page's
# commands at the page's own size in a scratch directory (tests/test_docs.py checks them at test scale).
docs-numbers: install-dev docs-demo
	$(PY) tests/test_docs.py --record

# The paper-figure gallery (figures/README.md), in portable mode (bit for bit the same on any x86-64 CPU); finished
# recipes with unchanged settings are skipped (from an empty store: --root a new folder). Not in `test`.
figures: install
	$(VENV)/bin/landscape --portable figures all --scale cpu --out figures/

bench: install-dev
	$(PY) benchmarks/run_all.py

lint: install-dev
	$(VENV)/bin/ruff check landscape cli tests benchmarks

clean:
	rm -rf demo-out .pytest_cache site
