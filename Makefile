# The two commands a newcomer needs: `make run` and `make test`. Everything else is a helper.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)

.PHONY: help install lock run manage stop test test-fast services browser peers promtool lint fmt bench bench-size bench-smoke clean

# The client is its own distribution (clients/python); the server, the demo and the tests use it
# as an integrator does, installed editable beside the server.
# The server's runtime dependencies at constraints.txt's versions, as the image installs them
# (deploy/docker/install.sh), so the suite tests what ships; the tools resolve around them.
$(VENV)/.installed: pyproject.toml clients/python/pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ./clients/python -e '.[dev,local]'
	touch $@

install: $(VENV)/.installed ## Install the server, the client and the tools into .venv

# constraints.txt again from the venv's versions of the server's runtime dependencies
# (scripts/lock_dependencies.py; docs/DEPLOY.md, "Releases"). Not through install: a range raised
# in pyproject.toml is installed first (`.venv/bin/pip install -e . -U NAME`), then locked.
lock: ## Write constraints.txt from the venv (after upgrading a dependency in it)
	$(PY) scripts/lock_dependencies.py

# Make sure the machine's PostgreSQL and Redis are up (starting them with the documented
# commands when they are not).
services: ## Make sure PostgreSQL and Redis are up
	bash scripts/ensure-services.sh

# Debian's Chromium for the browser tests; Playwright never downloads a browser here.
browser: ## Make sure Debian's Chromium is there for the browser tests
	bash scripts/ensure-chromium.sh

# Debian's promtool: the alert rules' unit tests and the scrapes' checks (tests/test_promtool.py).
promtool: ## Make sure Debian's promtool is there (package prometheus)
	bash scripts/ensure-promtool.sh

# The OpenID Provider the single sign-on tests start (tests/peers/oidc), from its npm lock file;
# Debian's PgBouncer, which the pooler tests start in front of PostgreSQL (tests/support/pgbouncer.py).
peers: ## Install the test peers (npm ci of tests/peers/oidc; Debian's pgbouncer)
	bash scripts/ensure-oidc-peer.sh
	bash scripts/ensure-pgbouncer.sh

# Lint first: a type error or an unformatted file fails fast, before the suite.
# Static files are collected as production serves them (hashed, with the manifest DEBUG=0 pages
# need); collectstatic signs nothing, but the settings refuse to load without a SECRET_KEY.
# The suite runs in TEST_WORKERS parallel pytest-xdist workers (tests/support/parallel.py): each
# its own test database and Redis database (REDIS_URL's and the next ones). 3 measured fastest on
# a 2-core machine: the tests mostly wait on worker processes, browsers and the network.
# TEST_WORKERS=0 runs serially; PYTEST_ARGS adds to (or overrides) the command line. The 40 slowest
# tests are listed at the end (--durations), so a run says where the suite's time goes.
TEST_WORKERS ?= 3
COLLECTSTATIC := DEBUG=0 SECRET_KEY=collectstatic-signs-nothing $(PY) manage.py collectstatic --noinput -v0
test: lint services browser peers promtool ## Lint, then the whole suite (TEST_WORKERS, PYTEST_ARGS)
	$(COLLECTSTATIC)
	$(PY) -m pytest -n $(TEST_WORKERS) --durations=40 $(PYTEST_ARGS)

# The unit lanes, for the loop between two edits: no lint, no browser tests (e2e), no fault
# injection (reliability), none of the tests marked slow (pyproject's markers; tests/conftest.py
# gives the folders theirs). `make test` stays the whole suite, as .ci/run runs it.
FAST_LANES := not slow and not e2e and not reliability
test-fast: install services ## The unit lanes only: no lint, browser, reliability or slow tests
	$(COLLECTSTATIC)
	$(PY) -m pytest -n $(TEST_WORKERS) -m "$(FAST_LANES)" $(PYTEST_ARGS)

# The playground, in the foreground until Ctrl-C. One per data directory (.data, or SAGA_RUN_DATA):
# a second start refuses and says how to reach or stop the first (scripts/run.sh). Stopped by
# Ctrl-C or `make stop` it exits 0. Its refusal is exit status 3 for scripts that call run.sh;
# here it is the answer to "is my playground up?" (yes, there), so make ends quietly instead of
# printing an "Error 3" that reads like a crash under the message.
run: install ## The playground: PostgreSQL, Redis, web, worker and saga-mcp, with a seeded demo
	@bash scripts/run.sh || { rc=$$?; [ $$rc = 3 ] || exit $$rc; }

# manage.py against the running playground, with the environment it wrote to .data/env:
#   make manage ARGS="create_agent_key --tenant acme --name my-agent"
# (scripts/manage.sh takes arguments with spaces). Refuses when no playground is running.
manage: ## manage.py against the running playground: make manage ARGS="..."
	bash scripts/manage.sh $(ARGS)

# Stop the running playground (as Ctrl-C in its terminal does), or what a killed one left behind.
stop: ## Stop the running playground
	$(PY) scripts/devservers.py stop "$${SAGA_RUN_DATA:-.data}"

# The same tools as .pre-commit-config.yaml: ruff (lint + format) and mypy (with django-stubs,
# whose plugin loads the settings: development mode, as they fail closed without a SECRET_KEY).
# Then the deployment files: the Dockerfile (hadolint), compose.yaml against the Compose
# specification's schema, and both Kustomize trees rendered (kubectl kustomize, offline) and checked
# against Kubernetes' schemas. tests/test_deploy_files.py checks what the schemas cannot.
KUSTOMIZE_TREES := deploy/kubernetes/base deploy/kubernetes/overlays/example
lint: install ## ruff check, ruff format --check, mypy and the deployment files' linters
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DEBUG=1 $(VENV)/bin/mypy .
	$(VENV)/bin/hadolint Dockerfile
	$(VENV)/bin/check-jsonschema --builtin-schema vendor.compose-spec compose.yaml
	set -eo pipefail; for tree in $(KUSTOMIZE_TREES); do \
		kubectl kustomize $$tree | $(VENV)/bin/kubernetes-validate --strict --quiet -; done

# What ruff can fix, fixed: the formatter, then the linter's safe fixes (what is left, it lists).
fmt: install ## Format and fix what ruff can (ruff format, ruff check --fix)
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# Benchmarks against this machine's own limits (docs/BENCHMARKS.md); not part of `make test`,
# which runs a smoke-sized harness run instead (tests/bench). Uses its own database and Redis db.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(PY) -m pip install -q -e '.[dev,local,bench]'
	touch $@

bench: install services $(VENV)/.bench-installed ## The benchmarks (docs/BENCHMARKS.md; BENCH_ARGS)
	$(PY) -m bench.run $(BENCH_ARGS)

# The "At size" phase alone: a year of history (10M actions, ~30M audit events) in its
# own database, then the pages, the append, a governed tool call and retention against it.
bench-size: install services $(VENV)/.bench-installed ## The 'At size' phase of the benchmarks alone (BENCH_ARGS)
	$(PY) -m bench.run --only size --out artifacts/bench-size/BENCHMARKS.md --log-dir artifacts/bench-size $(BENCH_ARGS)

bench-smoke: install services ## The benchmark harness at smoke size
	$(PY) -m bench.run --smoke --redis-url auto --database-url postgres://postgres@127.0.0.1:5432/saga_bench_smoke --out artifacts/bench-smoke/BENCHMARKS.md --log-dir artifacts/bench-smoke

clean: ## Remove .venv, the collected static files and artifacts/
	rm -rf $(VENV) staticfiles artifacts

# Every target with a `## ` description, in the order they are written here.
help: ## List the targets, one line each
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## /\1\t/' | expand -t 14
