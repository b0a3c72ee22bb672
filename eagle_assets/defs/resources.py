"""Binds the resources in one place; environment values come in here only."""

from __future__ import annotations

import os

from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.resources.trainer import TrainerResource
from eagle_assets.targets import EMBEDDED_TARGET


def default_resources() -> dict:
    return {
        "inference_server": InferenceServerResource(
            target=os.environ.get("EAGLE_ASSETS_TARGET", EMBEDDED_TARGET),
            url=os.environ.get("EAGLE_ASSETS_SERVER_URL") or None,
            speculative_url=os.environ.get("EAGLE_ASSETS_SPECULATIVE_URL") or None,
            extraction_url=os.environ.get("EAGLE_ASSETS_EXTRACTION_URL") or None,
            # The name of the variable, never its value: the key is read when a request is made.
            api_key_env="EAGLE_ASSETS_SERVER_API_KEY",
            compiled=_flag("EAGLE_ASSETS_SERVE_COMPILED"),
        ),
        "storage": StorageResource(root=os.environ.get("EAGLE_ASSETS_DATA", "")),
        "trainer": TrainerResource(nproc_per_node=int(os.environ.get("EAGLE_ASSETS_NPROC_PER_NODE", "1"))),
    }


def _flag(name: str) -> bool:
    """An on/off environment variable: unset, empty or 0 is off, 1 is on; anything else is refused
    rather than read as off."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{name}={value!r}: set it to 1 (on) or 0 (off)")
    return value == "1"
