"""One run's settings in one validated file: the target, the preset it starts from, and what
differs in each asset's settings.

    # run.yaml                              eagle-assets run --config run.yaml
    target: /models/Llama-3.1-8B-Instruct   # a preset name, a model folder or a pulled hub id
    preset: gpu-default                     # the run preset these settings change
    prompts: {source: file, file_url: s3://team/prompts.jsonl}
    drafter_checkpoint: {epochs: 8}

Each asset's section is checked against that asset's own Dagster config class, so the asset's
defaults stay the only defaults (the drafter's come from the trainer's `TrainConfig`). Unlike
Dagster's run config, which is checked only when a run is submitted, the whole file is checked
before anything starts, and a misspelt key is an error that names it and lists the known ones.
"""

# No `from __future__ import annotations`: pydantic resolves the section types from real annotations.

from pathlib import Path
from typing import Optional

import dagster as dg
import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from eagle_assets.defs.benchmark import BenchmarkConfig
from eagle_assets.defs.corpus import CorpusConfig, PromptsConfig
from eagle_assets.defs.drafter import DrafterAssetConfig
from eagle_assets.defs.hidden_states import HiddenStatesConfig, VocabConfig
from eagle_assets.run_presets import RUN_PRESETS


def _strict(config: type[dg.Config]) -> type[dg.Config]:
    """`config` refusing keys it does not have (a Dagster Config ignores them)."""
    return type(config.__name__, (config,), {"model_config": ConfigDict(**config.model_config, extra="forbid"), "__doc__": config.__doc__})


class RunFile(BaseModel):
    """A run: each asset section holds only what differs from the preset (and the preset only
    what differs from the asset's defaults)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: Optional[str] = None
    """A target preset, a model folder, or a hub id pulled with `eagle-assets target pull`;
    default: EAGLE_ASSETS_TARGET, else the embedded SmolLM2."""
    preset: Optional[str] = None
    """The run preset to start from (eagle_assets/run_presets.py); default: smollm2-default for
    the embedded target, gpu-default for any other."""
    prompts: Optional[_strict(PromptsConfig)] = None
    synthetic_corpus: Optional[_strict(CorpusConfig)] = None
    vocab_mapping: Optional[_strict(VocabConfig)] = None
    hidden_state_shards: Optional[_strict(HiddenStatesConfig)] = None
    drafter_checkpoint: Optional[_strict(DrafterAssetConfig)] = None
    benchmark_report: Optional[_strict(BenchmarkConfig)] = None

    def asset_settings(self) -> dict[str, dict]:
        """{asset: the settings this file gives it}, keys the file left out left out."""
        return {name: section.model_dump(exclude_unset=True) for name in ASSET_SECTIONS if (section := getattr(self, name)) is not None}


ASSET_SECTIONS = tuple(name for name in RunFile.model_fields if name not in ("target", "preset"))


def check_run_file(settings: dict, source: str) -> RunFile:
    """`settings` as a RunFile; a ValueError naming `source`, each wrong key and the fix."""
    try:
        run = RunFile.model_validate(settings)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            if error["type"] == "extra_forbidden":
                section = error["loc"][0] if len(error["loc"]) > 1 else None
                known = RunFile.model_fields[section].annotation.__args__[0].model_fields if section else RunFile.model_fields
                problems.append(f"{where}: no such setting; known: {', '.join(known)}")
            else:
                problems.append(f"{where}: {error['msg']}")
        raise ValueError(f"{source}: " + "; ".join(problems)) from None
    if run.preset is not None and run.preset not in RUN_PRESETS:
        raise ValueError(f"{source}: unknown run preset {run.preset!r}; known: {', '.join(RUN_PRESETS)}")
    return run


def read_run_file(path: Path) -> RunFile:
    """A run file (YAML or JSON), checked whole."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no run file {path}: give the path of a YAML file (eagle_assets/defs/run_file.py shows one)")
    try:
        settings = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not YAML: {exc}") from None
    if settings is None:
        settings = {}
    if not isinstance(settings, dict):
        raise ValueError(f"{path} holds a YAML {type(settings).__name__}, not a mapping of settings (target:, preset:, drafter_checkpoint: ...)")
    return check_run_file(settings, str(path))
