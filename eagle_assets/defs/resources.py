"""Binds the resources in one place; environment values come in through `dg.EnvVar` here only."""

from __future__ import annotations

import os

from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.targets import EMBEDDED_TARGET


def default_resources() -> dict:
    return {
        "inference_server": InferenceServerResource(
            target=os.environ.get("EAGLE_ASSETS_TARGET", EMBEDDED_TARGET),
            url=os.environ.get("EAGLE_ASSETS_SERVER_URL") or None,
            api_key_env="EAGLE_ASSETS_SERVER_API_KEY",
        ),
    }
