# The two commands of the README:
#   make run    simulate, draw, sweep and validate; writes reports/
#   make test   the test suite
# Both create .venv and install everything on first use.
#
# TORCH picks the PyTorch requirement. The default pins the release that this
# project is tested with; pip takes a CPU wheel if one is on its find-links path
# and otherwise PyPI's default build (CUDA on Linux x86-64). Examples:
#   make run TORCH="torch --index-url https://download.pytorch.org/whl/cu128"
#   make run TORCH="torch --index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENV ?= .venv
TORCH ?= torch==2.13.0
PY := $(VENV)/bin/python
STAMP := $(VENV)/.pipesim-installed

.PHONY: run test setup clean

run: $(STAMP)
	$(VENV)/bin/pipesim demo -o reports

test: $(STAMP)
	$(PY) -m pytest

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[validate,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV)
