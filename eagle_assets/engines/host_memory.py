"""What launched vLLM servers take of a CPU host's memory, and whether several fit at once.

    server_footprint_bytes(target_folder, drafter_folder, kv_cache_gib)   one server's share
    config_footprint_bytes(target_folder, speculative_config, kv_cache_gib) the same, from its config
    why_not_at_once(footprints, available, device)                        None when they all fit

The benchmark serves its configurations interleaved when they fit at once (`bench/interleaved.py`);
the InferenceServer resource stops idle warm servers to make room for a new one. Both ask here.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import psutil

# What a launched vLLM holds on a CPU host beyond its float32 weights and its KV cache: the API
# server, the engine core and the worker with their libraries (docs/serving.md, "Warm servers and memory").
ENGINE_OVERHEAD_BYTES = 2 << 30
# Memory left to the rest of the run (the pipeline's own process, the page cache) after a start.
HEADROOM_BYTES = 1 << 30
GIB = 1 << 30


def available_memory_bytes() -> int | None:
    """Memory available for new work: psutil's `available` (the kernel's MemAvailable on Linux),
    or None where psutil cannot read it."""
    try:
        return int(psutil.virtual_memory().available)
    except (OSError, RuntimeError):
        return None


def server_footprint_bytes(target_folder: Path, drafter: str | Path | None, kv_cache_gib: int) -> int:
    """Host memory a vLLM server of this target takes on a CPU host: the target's (and drafter's)
    weights as float32, which the CPU engine serves whatever their stored dtype, the KV cache, and
    the engine's own."""
    weights = _float32_bytes(Path(target_folder))
    if drafter is not None:
        weights += _float32_bytes(Path(drafter).expanduser())
    return weights + (kv_cache_gib << 30) + ENGINE_OVERHEAD_BYTES


def config_footprint_bytes(target_folder: Path, speculative: dict | None, kv_cache_gib: int) -> int:
    """`server_footprint_bytes` of a server of this speculative config: its drafter, if it names
    one (`"model"`; n-gram and no speculation name none)."""
    return server_footprint_bytes(target_folder, (speculative or {}).get("model"), kv_cache_gib)


def why_not_at_once(footprints: Sequence[int], available: int | None, device: str) -> str | None:
    """Why servers of these footprints cannot all be up together on this host, or None when they
    can (also where the host does not say what it has available: the start then tells)."""
    if device != "cpu":
        return f"on {device} each vLLM takes most of the accelerator's memory"
    needed = sum(footprints) + HEADROOM_BYTES
    if not footprints or available is None or needed <= available:
        return None
    return f"{len(footprints)} more servers at once need ~{needed / GIB:.1f} GiB with headroom, and {available / GIB:.1f} GiB is available"


def _float32_bytes(folder: Path) -> int:
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    stored = str(config.get("torch_dtype") or config.get("dtype") or (config.get("text_config") or {}).get("torch_dtype") or "bfloat16")
    per_param = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}.get(stored.replace("torch.", ""), 2)
    return sum(f.stat().st_size for f in folder.glob("*.safetensors")) * 4 // per_param
