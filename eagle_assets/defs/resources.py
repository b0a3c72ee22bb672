"""Binds the resources in one place; environment values come in here only, each checked as it
is read (`eagle_assets.settings_env`), so a bad one is refused with its name when the
definitions load rather than deep inside a run.

In the Definitions (`default_resources(deferred=True)`) a field set from a variable is bound as
`dg.EnvVar(NAME)`: each run reads the variable when it starts, and the UI lists it among the
resource's environment variables. The check still runs as the definitions load, in the code
server and in each run's own process, so a run never reads a value that was not checked.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import dagster as dg

from eagle_assets.defs.settings import location_settings
from eagle_assets.paths import data_location
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.resources.trainer import TrainerResource
from eagle_assets.settings_env import env_flag, env_holds, env_int, env_str
from eagle_assets.targets import EMBEDDED_TARGET, PRESETS
from eagle_assets.targets.hub import hub_folder, is_hub_id, is_pulled

HTTP_URL = "an http:// or https:// URL with a host"


def default_resources(deferred: bool = False) -> dict:
    """The resources, their fields from the environment. `deferred`: bound as the Definitions
    bind them, a field set from a variable as that variable (`_from_env`); else as values, for
    code that reads the fields in this process (defs/runner.py: a deferred field reads as the
    variable's name there, and its model_dump() would put that name into run config)."""

    def bound(name: str, value):
        return _from_env(name, value) if deferred else value

    data = str(data_location()) if env_str("EAGLE_ASSETS_DATA") else ""
    file_target = location_settings().target  # a run file the code location reads may name it
    if file_target is not None and not is_target(file_target):
        raise ValueError(f"{location_settings().run_file}: target {file_target!r} is not {TARGET_EXPECTED}")
    return {
        "inference_server": InferenceServerResource(
            target=file_target
            or bound("EAGLE_ASSETS_TARGET", env_str("EAGLE_ASSETS_TARGET", EMBEDDED_TARGET, check=is_target, expect=TARGET_EXPECTED)),
            url=bound("EAGLE_ASSETS_SERVER_URL", env_str("EAGLE_ASSETS_SERVER_URL", None, check=_is_http_url, expect=HTTP_URL)),
            speculative_url=bound("EAGLE_ASSETS_SPECULATIVE_URL", env_str("EAGLE_ASSETS_SPECULATIVE_URL", None, check=_is_http_url, expect=HTTP_URL)),
            extraction_url=bound("EAGLE_ASSETS_EXTRACTION_URL", env_str("EAGLE_ASSETS_EXTRACTION_URL", None, check=_is_http_url, expect=HTTP_URL)),
            # The name of the variable, never its value: the key is read when a request is made
            # (from the variable, or from the file EAGLE_ASSETS_SERVER_API_KEY_FILE names); an
            # EnvVar field would drop the file and make the key part of the resource's config.
            api_key_env="EAGLE_ASSETS_SERVER_API_KEY",
            # A value, not an EnvVar: Dagster's EnvVar is text or a whole number, which a bool
            # field refuses; the flag is read (and checked) as the definitions load.
            compiled=env_flag("EAGLE_ASSETS_SERVE_COMPILED"),
        ),
        # A folder (as data_location() checked and resolved it), or an fsspec URL the storage
        # syncs through a local mirror (the only path variable that may be a URL: the assets'
        # files are fetched before and published after). An EnvVar only where the variable
        # already holds that text (`eagle-assets run` makes a relative folder absolute for its runs).
        "storage": StorageResource(root=bound("EAGLE_ASSETS_DATA", data) if data else ""),
        # A value, not an EnvVar: the trainer checks its launch settings as it is built, and an
        # EnvVar.int stands for 0 until a run reads it; the variable is checked (>= 1) here.
        "trainer": TrainerResource(nproc_per_node=env_int("EAGLE_ASSETS_NPROC_PER_NODE", 1, min=1)),
    }


def _from_env(name: str, value):
    """`value`, read and checked from the variable `name`, as a field: `dg.EnvVar(name)` (or
    `dg.EnvVar.int`) when the variable holds exactly that text, so a run reads the same value;
    else `value` itself (unset: the default; blanks around the text: the text without them,
    which an EnvVar would pass on)."""
    if not env_holds(name, value):
        return value
    return dg.EnvVar.int(name) if type(value) is int else dg.EnvVar(name)


TARGET_EXPECTED = f"a target preset ({', '.join(sorted(PRESETS))}), a model folder with config.json or a pulled hub id ORG/NAME"


def is_target(value: str) -> bool:
    if value in PRESETS or (Path(value).expanduser() / "config.json").is_file():
        return True
    return is_hub_id(value) and is_pulled(hub_folder(value))


def _is_http_url(value: str) -> bool:
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)
