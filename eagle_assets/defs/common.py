"""Helpers shared by the asset modules: data versions, metadata, the target in use (code versions:
`code_versions.py`)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Iterable

import dagster as dg

from eagle_assets.targets import TargetPreset
from eagle_assets.targets.embedded import resolve_target

GROUP = "eagle3"


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


def image_markdown(path: Path, title: str) -> dg.MetadataValue:
    """A PNG as Markdown metadata with the image inline, which the UI draws (a path it would only print)."""
    data = base64.b64encode(Path(path).read_bytes()).decode()
    return dg.MetadataValue.md(f"**{title}**\n\n![{title}](data:image/png;base64,{data})")
