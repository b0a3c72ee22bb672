"""Which engine a drafter export is for: the marker our exports write, and the refusal when a
folder meant for one engine is handed to the other. Read by preflight and by the launcher,
which reaches serving without preflight where `eagle-assets bench` starts it."""

from __future__ import annotations

from pathlib import Path

from eagle_assets.formats import NUMBERING_KEY

DRAFTER_CONFIG_FIX = "re-export the drafter, or pass its export folder (config.json + model.safetensors)"

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def wrong_engine_export(drafter_config: dict, config_path: Path, engine: str) -> str | None:
    """Why a drafter folder must not be served by `engine`, or None.

    Our exports mark how their aux layer ids count (SGLang's are one lower than vLLM's for the
    same layers). Served by the other engine, the drafter reads the wrong target layers and
    acceptance collapses without an error. A folder without the marker passes: its ids are
    taken as vLLM's, as `load_drafter` takes them."""
    marker = drafter_config.get(NUMBERING_KEY)
    if marker is None or marker == engine:
        return None
    if marker not in ENGINE_NAMES:
        return f"{config_path}: {NUMBERING_KEY} is {marker!r}, which names no engine (our exports write 'vllm' or 'sglang'): re-export the drafter"
    right = config_path.parent.parent / f"drafter-{engine}"
    if right.is_dir():
        where = f"pass {right}"
    else:
        where = f"pass the drafter's {ENGINE_NAMES[engine]} export (training writes it as {right})"
    return (
        f"{config_path} is the {ENGINE_NAMES[marker]} export (layer ids numbered for {ENGINE_NAMES[marker]}); "
        f"{ENGINE_NAMES[engine]} would read the wrong target layers: {where}"
    )
