"""Where the project keeps what it makes: caches, engine environments, Dagster's home.

Everything lives under the project folder by default so that `make run` on a fresh clone is
self-contained; `EAGLE_ASSETS_CACHE` moves the large, shareable things (converted targets,
downloaded packages) elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Converted targets and downloaded packages: kept between runs, safe to delete."""
    return Path(os.environ.get("EAGLE_ASSETS_CACHE", PROJECT_ROOT / ".cache")).resolve()


def targets_dir() -> Path:
    return cache_dir() / "targets"


def engine_venv(engine: str = "vllm") -> Path:
    """The serving engine's own virtual environment (its own container in production)."""
    default = PROJECT_ROOT / ".venvs" / engine
    return Path(os.environ.get(f"EAGLE_ASSETS_{engine.upper()}_VENV", default)).resolve()


def runs_dir() -> Path:
    """Server logs and other per-run scratch files."""
    return Path(os.environ.get("EAGLE_ASSETS_RUNS", PROJECT_ROOT / ".runs")).resolve()


def data_dir() -> Path:
    """Where the assets store their outputs (corpus, shards, checkpoints, reports)."""
    return Path(os.environ.get("EAGLE_ASSETS_DATA", PROJECT_ROOT / "data")).resolve()
