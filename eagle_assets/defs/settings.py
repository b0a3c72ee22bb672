"""The code location's settings: each asset's Config defaults are its run preset's, with a run
file's on top, so every run of the location (the UI's "Materialize", an automation condition's,
`eagle-assets run`'s) computes with the same settings and needs no run config.

    EAGLE_ASSETS_PRESET=smollm2-tiny      # the run preset (run_presets.py); default: the target's own
    EAGLE_ASSETS_RUN_FILE=/path/run.yaml  # a run file (defs/run_file.py): its sections change the preset's settings

The defaults are part of each asset's code version (`code_versions.code_version`), so a location
started with other settings shows the assets they change as stale, with the cause "has a new
code version", and rebuilds exactly those. The run file is read each time the definitions load:
edit it and reload the code location (the UI's "Reload definitions") to see what it makes stale.
Why Config defaults rather than run config: a run that Dagster's automation or the UI's
"Materialize" starts carries no run config, and Dagster offers no run-config default for the
asset jobs it builds itself.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field
from pathlib import Path

import pydantic
import yaml

from eagle_assets.run_presets import REFERENCE_FROM, RUN_PRESETS, default_preset
from eagle_assets.settings_env import env_choice, env_str
from eagle_assets.targets import EMBEDDED_TARGET

PRESET_ENV = "EAGLE_ASSETS_PRESET"
RUN_FILE_ENV = "EAGLE_ASSETS_RUN_FILE"


@dataclass(frozen=True)
class LocationSettings:
    """What the code location computes with."""

    preset: str
    """The run preset."""
    changes: dict[str, dict] = field(default_factory=dict)
    """{asset: settings} from the run file, on top of the preset's."""
    target: str | None = None
    """The run file's target, if it names one (else EAGLE_ASSETS_TARGET's)."""
    run_file: str | None = None

    def asset_settings(self, asset: str) -> dict:
        """The settings `asset` takes from the preset and the run file, by field."""
        return {**RUN_PRESETS[self.preset].sections().get(asset, {}), **self.changes.get(asset, {})}


def read_location_settings() -> LocationSettings:
    """The settings from the environment (module doc), read now."""
    path = env_str(RUN_FILE_ENV)
    raw: dict = {}
    if path:
        file = Path(path).expanduser()
        if not file.is_file():
            raise ValueError(f"{RUN_FILE_ENV}={path}: no such file; give a run file (eagle_assets/defs/run_file.py shows one) or unset it")
        raw = yaml.safe_load(file.read_text()) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{RUN_FILE_ENV}={path} holds a YAML {type(raw).__name__}, not a mapping of settings")
    target = raw.pop("target", None)
    preset = raw.pop("preset", None) or env_choice(PRESET_ENV, "", RUN_PRESETS) or None
    if preset is None:
        preset = default_preset(target or env_str("EAGLE_ASSETS_TARGET", EMBEDDED_TARGET))
    if preset not in RUN_PRESETS:
        raise ValueError(f"{path}: unknown run preset {preset!r}; known: {', '.join(RUN_PRESETS)}")
    for asset, values in raw.items():
        if not isinstance(values, dict):
            raise ValueError(f"{path}: section {asset!r} must be a mapping of that asset's settings")
    return LocationSettings(preset, raw, target, path)


@functools.cache
def location_settings() -> LocationSettings:
    """`read_location_settings()`, once per process: the definitions read it as they load."""
    return read_location_settings()


def reference_settings(settings: LocationSettings | None = None) -> dict:
    """`benchmark_reference`'s settings: those it shares with the benchmark, the hidden-state
    stage and the drafter (`run_presets.REFERENCE_FROM`), as the location sets them for those
    assets, with its own section on top."""
    settings = settings or location_settings()
    shared = {key: value for asset, keys in REFERENCE_FROM.items() for key, value in settings.asset_settings(asset).items() if key in keys}
    return {**shared, **settings.asset_settings("benchmark_reference")}


def with_defaults(config: type, asset: str, settings: LocationSettings | None = None, values: dict | None = None) -> type:
    """`config` (an asset's dg.Config) with the location's settings for `asset` (or `values`) as
    its defaults, each field keeping its description; `config` itself where they change nothing."""
    settings = settings or location_settings()
    values = settings.asset_settings(asset) if values is None else values
    unknown = sorted(set(values) - set(config.model_fields))
    if unknown:
        where = settings.run_file or f"run preset {settings.preset}"
        raise ValueError(f"{where}: {asset} has no setting {', '.join(unknown)}; known: {', '.join(config.model_fields)}")
    if not values:
        return config
    fields = {
        name: (config.model_fields[name].annotation, pydantic.Field(default=value, description=config.model_fields[name].description))
        for name, value in values.items()
    }
    try:
        config(**values)  # the defaults must fit the fields' types and checks (pydantic never checks a default)
    except pydantic.ValidationError as exc:
        raise ValueError(f"settings of {asset} from {settings.run_file or 'run preset ' + settings.preset} do not fit its Config: {exc}") from None
    made = pydantic.create_model(config.__name__, __base__=config, __module__=config.__module__, **fields)
    made.__doc__ = config.__doc__
    return made


def session_environment(preset: str, run_file: str | None, target: str | None) -> dict[str, str]:
    """The variables that give a code location started for `eagle-assets run` these settings."""
    env = {PRESET_ENV: preset}
    if run_file:
        env[RUN_FILE_ENV] = os.path.abspath(run_file)
    if target:
        env["EAGLE_ASSETS_TARGET"] = target
    return env
