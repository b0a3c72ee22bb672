"""Where the project keeps what it makes: caches, engine environments, Dagster's home.

Everything lives under the project folder by default so that `make run` on a fresh clone is
self-contained; `EAGLE_ASSETS_CACHE` moves the large, shareable things (converted targets,
downloaded packages) elsewhere. Each variable is checked where it is read
(`settings_env.env_path`): one that names a file is refused with its name.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from eagle_assets.settings_env import env_path, env_path_or_url

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Converted targets and downloaded packages: kept between runs, safe to delete."""
    return env_path("EAGLE_ASSETS_CACHE", PROJECT_ROOT / ".cache")


def targets_dir() -> Path:
    return cache_dir() / "targets"


def engine_venv(engine: str = "vllm") -> Path:
    """The serving engine's own virtual environment (its own container in production)."""
    return env_path(f"EAGLE_ASSETS_{engine.upper()}_VENV", PROJECT_ROOT / ".venvs" / engine)


def runs_dir() -> Path:
    """Server logs and other per-run scratch files."""
    return env_path("EAGLE_ASSETS_RUNS", PROJECT_ROOT / ".runs")


def data_location() -> Path | str:
    """Where the assets store their outputs (corpus, shards, checkpoints, reports): a folder, or
    an fsspec URL (`resources/storage.py` syncs it through a local mirror)."""
    return env_path_or_url("EAGLE_ASSETS_DATA", PROJECT_ROOT / "data")


def data_dir() -> Path:
    """The local folder holding the assets' outputs: EAGLE_ASSETS_DATA's folder, or its URL's mirror."""
    location = data_location()
    return mirror_dir(location) if isinstance(location, str) else location


def mirror_dir(url: str) -> Path:
    """The default local mirror of a storage URL: one folder per URL under the cache."""
    return cache_dir() / "storage" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
