"""Binds the resources in one place; environment values come in here only, each checked as it
is read (`eagle_assets.settings_env`), so a bad one is refused with its name when the
definitions load rather than deep inside a run."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.resources.trainer import TrainerResource
from eagle_assets.paths import data_location
from eagle_assets.settings_env import env_flag, env_int, env_str
from eagle_assets.targets import EMBEDDED_TARGET, PRESETS


HTTP_URL = "an http:// or https:// URL with a host"


def default_resources() -> dict:
    return {
        "inference_server": InferenceServerResource(
            target=env_str("EAGLE_ASSETS_TARGET", EMBEDDED_TARGET, check=is_target, expect=TARGET_EXPECTED),
            url=env_str("EAGLE_ASSETS_SERVER_URL", None, check=_is_http_url, expect=HTTP_URL),
            speculative_url=env_str("EAGLE_ASSETS_SPECULATIVE_URL", None, check=_is_http_url, expect=HTTP_URL),
            extraction_url=env_str("EAGLE_ASSETS_EXTRACTION_URL", None, check=_is_http_url, expect=HTTP_URL),
            # The name of the variable, never its value: the key is read when a request is made
            # (from the variable, or from the file EAGLE_ASSETS_SERVER_API_KEY_FILE names).
            api_key_env="EAGLE_ASSETS_SERVER_API_KEY",
            compiled=env_flag("EAGLE_ASSETS_SERVE_COMPILED"),
        ),
        # A folder, or an fsspec URL the storage syncs through a local mirror (the only path
        # variable that may be a URL: the assets' files are fetched before and published after).
        "storage": StorageResource(root=str(data_location()) if env_str("EAGLE_ASSETS_DATA") else ""),
        "trainer": TrainerResource(nproc_per_node=env_int("EAGLE_ASSETS_NPROC_PER_NODE", 1, min=1)),
    }


TARGET_EXPECTED = f"a target preset ({', '.join(sorted(PRESETS))}) or a model folder with config.json"


def is_target(value: str) -> bool:
    return value in PRESETS or (Path(value).expanduser() / "config.json").is_file()


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)
