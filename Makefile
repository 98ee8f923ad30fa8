# The two commands a newcomer needs: `make run` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: install run test services browser lint bench bench-smoke clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,local]'
	touch $@

install: $(VENV)/.installed

# Make sure the machine's PostgreSQL and Redis are up (starting them with the documented
# commands when they are not).
services:
	bash scripts/ensure-services.sh

# Debian's Chromium for the browser tests; Playwright never downloads a browser here.
browser:
	bash scripts/ensure-chromium.sh

test: install services browser
	$(PY) -m pytest $(PYTEST_ARGS)

run: install
	bash scripts/run.sh

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

clean:
	rm -rf $(VENV) staticfiles artifacts
