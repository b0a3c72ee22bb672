"""Shared fixtures: the embedded target and one real vLLM CPU server per test session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_assets.embedded_target import pull
from eagle_assets.paths import engine_venv
from eagle_assets.targets import EMBEDDED_TARGET


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The converted SmolLM2 folder (pulled once; a no-op when the checksum verifies)."""
    return pull(EMBEDDED_TARGET, log=lambda m: None)


@pytest.fixture(scope="session")
def smollm2_config(smollm2_path) -> dict:
    return json.loads((smollm2_path / "config.json").read_text())


@pytest.fixture(scope="session")
def engine_python() -> Path:
    """The engine venv's interpreter. `make test` builds it; its absence is a failure, not a skip."""
    py = engine_venv("vllm") / "bin" / "python"
    if not py.is_file():
        pytest.fail(f"no vLLM environment at {py.parent.parent}: run `make setup` first")
    return py


@pytest.fixture(scope="session")
def vllm_server(smollm2_path, engine_python):
    """A real vLLM CPU server serving SmolLM2 without speculation, shared by the whole session."""
    from eagle_assets.engines.serving import launch_vllm

    with launch_vllm(EMBEDDED_TARGET, log=lambda m: None) as server:
        yield server
