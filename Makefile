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

.PHONY: run test setup clean browser

run: $(STAMP)
	$(VENV)/bin/pipesim demo -o reports

# Two pytest workers (pytest-xdist): the tests that start processes run one at a time on one of them
# (tests/conftest.py puts them in one group), the in-process ones on both. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

test: $(STAMP) browser
	$(PY) -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadgroup)

# The interactive pages' tests (tests/test_pages_browser.py) drive a real headless browser: Debian's chromium and
# chromium-driver. Installed with apt when missing and we may (root, apt present); otherwise the reason is printed
# and those tests skip saying why. A no-op when both are there.
browser:
	@if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then :; \
	elif ! command -v apt-get >/dev/null 2>&1; then \
		echo "pipesim: no apt-get here: install chromium and its chromedriver yourself, or the browser tests skip"; \
	elif [ "$$(id -u)" != 0 ]; then \
		echo "pipesim: not root: run 'sudo apt-get install chromium chromium-driver', or the browser tests skip"; \
	else \
		echo "pipesim: installing chromium and chromium-driver with apt (for tests/test_pages_browser.py)"; \
		(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver \
			>/dev/null) || echo "pipesim: apt could not install chromium: the browser tests skip"; \
	fi

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[validate,megatron,dev]'
	touch $(STAMP)

clean:
	rm -rf $(VENV)
