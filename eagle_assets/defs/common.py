"""Helpers shared by the asset modules: code versions, data versions, the target in use."""

from __future__ import annotations

import hashlib
import inspect
import json
from pathlib import Path
from typing import Iterable

import dagster as dg

from eagle_assets.embedded_target import resolve_target
from eagle_assets.targets import TargetPreset

PACKAGE = Path(__file__).resolve().parent.parent
GROUP = "eagle3"


def stage_version(*parts: object) -> str:
    """A code version from the source of a stage's modules and the defaults of its settings.

    Each part is a module, a package folder name under eagle_assets/, or a `dg.Config` class
    (its field defaults are hashed: changing a default setting makes the asset stale).
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, str):
            folder = PACKAGE / part
            files = sorted(folder.rglob("*.py")) if folder.is_dir() else [PACKAGE / part]
            for f in files:
                h.update(f.read_bytes())
        elif isinstance(part, type) and issubclass(part, dg.Config):
            defaults = {name: repr(field.default) for name, field in part.model_fields.items()}
            h.update(json.dumps(defaults, sort_keys=True).encode())
        else:
            h.update(inspect.getsource(part).encode())
    return h.hexdigest()[:16]


def hash_files(paths: Iterable[Path]) -> str:
    """Content hash of files (names relative to their common folder, and bytes)."""
    h = hashlib.sha256()
    for p in sorted(Path(x) for x in paths):
        h.update(p.name.encode())
        with open(p, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()[:16]


def hash_tree(folder: Path, pattern: str = "*") -> str:
    return hash_files(p for p in Path(folder).rglob(pattern) if p.is_file())


def target_of(inference_server) -> tuple[TargetPreset, Path]:
    """The target every stage works on: the one the inference server resource serves."""
    return resolve_target(inference_server.target, log=lambda m: None)


def check_result(passed: bool, metadata: dict, blocking_severity=dg.AssetCheckSeverity.ERROR, **kw) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=bool(passed), metadata=_metadata(metadata), severity=blocking_severity, **kw)


def _metadata(meta: dict) -> dict:
    """Dagster metadata values must be simple: nested structures become JSON."""
    out = {}
    for k, v in meta.items():
        if isinstance(v, (dict, list, tuple)):
            out[k] = dg.MetadataValue.json(v if not isinstance(v, tuple) else list(v))
        elif v is None:
            out[k] = dg.MetadataValue.text("none")
        else:
            out[k] = v
    return out


metadata = _metadata
