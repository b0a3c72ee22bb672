"""Runs the whole graph (or only its stale part) as Dagster runs of the local instance.

The graph goes in four stages (docs/design.md: one job may not mix partitioned and unpartitioned
assets): the corpus stage, the hidden-state partitions (one run each, side by side as the run
queue allows), the benchmark reference (from the partitions' extraction server, while it is
up), then the drafter stage. The hidden-state stage's whole disk need is checked before its
first partition starts (and before an extraction server is launched for it). Every run is submitted to the instance in $DAGSTER_HOME,
whose run queue and daemon launch it with dagster.yaml's run launcher (instance_runs.py), so the
web UI shows it with its lineage and checks. Each stage waits for its runs; the first failed run
stops the graph with its error.

Runs execute in other processes, so everything a run needs from here travels as run config:
the preset's settings as op config, and a server launched here for several runs (the shared
extraction server) as the config of the resource that uses it.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

import dagster as dg

from eagle_assets.defs import ASSETS
from eagle_assets.defs.hidden_states import (
    HiddenStatesConfig,
    engine_layer_ids,
    engine_max_model_len,
    extraction_settings,
    hidden_states_source,
    shard_partitions,
    stage_bytes,
)
from eagle_assets.defs.instance_runs import WORKSPACE_FILE, RunSession, RunSpec
from eagle_assets.defs.jobs import CORPUS_STAGE, EXTRACTION_STAGES, HIDDEN_STAGE, JOBS, REFERENCE_STAGE, STAGES
from eagle_assets.defs.resources import default_resources
from eagle_assets.defs.staleness import STALE_ONLY_TAG, StaleRun, Step, run_stale
from eagle_assets.embedded_target import resolve_target
from eagle_assets.engines.serving import launch_extraction_server
from eagle_assets.hidden_states.budget import check_free_space
from eagle_assets.paths import PROJECT_ROOT
from eagle_assets.run_presets import run_config

DEFAULT_PRESET = "smollm2-default"
EXTRACTION_TAG = "eagle_assets/extraction"
"""Tag on hidden-state runs: "engine" or "hf", the source of their states (dagster.yaml limits
"hf" runs, which each load the target, to one at a time)."""
STAGE_TAG = "eagle_assets/stage"
"""Tag on every run `eagle-assets run` submits: its stage's job."""


def ensure_dagster_home() -> Path:
    """$DAGSTER_HOME (default ./.dagster_home) with the project's dagster.yaml in it."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home")))
    home.mkdir(parents=True, exist_ok=True)
    src = PROJECT_ROOT / "dagster.yaml"
    if not (home / "dagster.yaml").is_file() or (home / "dagster.yaml").read_bytes() != src.read_bytes():
        shutil.copyfile(src, home / "dagster.yaml")
    return home


PATH_VARIABLES = ("EAGLE_ASSETS_DATA", "EAGLE_ASSETS_CACHE", "EAGLE_ASSETS_RUNS", "EAGLE_ASSETS_VLLM_VENV", "EAGLE_ASSETS_SGLANG_VENV")
MAYBE_PATH_VARIABLES = ("EAGLE_ASSETS_TARGET", "EAGLE_ASSETS_PROMPTS_URL")
"""A preset name or a URL, or a path where one exists here."""


def absolute_path_variables() -> None:
    """Make relative paths in the environment absolute: the daemon and the runs inherit it but
    work in the project's folder, where a relative path would point elsewhere."""
    for name in PATH_VARIABLES + MAYBE_PATH_VARIABLES:
        value = os.environ.get(name)
        if not value or "://" in value or os.path.isabs(value) or (name in MAYBE_PATH_VARIABLES and not os.path.exists(value)):
            continue
        os.environ[name] = os.path.abspath(value)


def resource_run_config(name: str, resource: dg.ConfigurableResource, **changes) -> dict:
    """Run config that gives the resource `name` the values of `resource` with `changes`.

    Every field goes in: run config given for a resource replaces the values the Definitions
    bound it with, and a field left out takes the class's default, not the bound value."""
    return {"resources": {name: {"config": {**resource.model_dump(), **changes}}}}


PARTS = {
    "corpus": tuple(CORPUS_STAGE),
    "hidden_states": (*HIDDEN_STAGE, *REFERENCE_STAGE),
    "drafter": ("drafter_checkpoint",),
    "benchmark": ("benchmark_report",),
}
"""The parts of the graph `eagle-assets run --part` can run alone, by name, in graph order: where
one host serves the target, extracts its states and trains in turn, each part runs while its
own server holds the GPUs (docs/kimi-k2.5.md)."""


def selected_stages(parts: Sequence[str] | None) -> list[list[str]]:
    """STAGES cut down to the assets of `parts` (all of them for None), stages left empty dropped."""
    if not parts:
        return [list(stage) for stage in STAGES]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown part {', '.join(map(repr, unknown))}: give one of {', '.join(PARTS)}")
    wanted = {asset for part in parts for asset in PARTS[part]}
    return [[asset for asset in stage if asset in wanted] for stage in STAGES]


_graph_order = [asset.key for asset in ASSETS]


def missing_upstream(instance: dg.DagsterInstance, stages: Sequence[Sequence[str]]) -> list[str]:
    """The assets outside `stages` that an asset in them reads and `instance` has never
    materialised (for a partitioned one: some partition never materialised), by name."""
    selected = {asset for stage in stages for asset in stage}
    missing: list[str] = []
    for asset in ASSETS:
        if asset.key.to_user_string() not in selected:
            continue
        for dep in sorted(asset.dependency_keys, key=_graph_order.index):  # a set: its order varies by run
            name = dep.to_user_string()
            if name in selected or name in missing:
                continue
            if name in HIDDEN_STAGE:  # partitioned: every partition must be there
                done = instance.get_materialized_partitions(dep)
                if set(shard_partitions.get_partition_keys()) - done:
                    missing.append(name)
            elif instance.get_latest_materialization_event(dep) is None:
                missing.append(name)
    return missing


def run_resources(target: str | None = None) -> tuple[dict, dict]:
    """(resources, resource run config) for runs on `target` (None: the environment's).

    The target travels in each run's config, not in the environment: a daemon already running
    (the UI's, a deployment's) launches the runs with the environment it started with."""
    resources = default_resources()
    if target is None:
        return resources, {}
    resources["inference_server"] = resources["inference_server"].model_copy(update={"target": target})
    return resources, resource_run_config("inference_server", resources["inference_server"])


def materialize_graph(preset: str = DEFAULT_PRESET, log: Callable[[str], None] = print, instance: dg.DagsterInstance | None = None,
                      workspace_file: Path = WORKSPACE_FILE, parts: Sequence[str] | None = None,
                      changes: dict[str, dict] | None = None, target: str | None = None) -> list[dg.DagsterRun]:  # fmt: skip
    """Materialise every asset (or those of `parts`, see PARTS), stage by stage, as runs of
    `instance` (default: $DAGSTER_HOME's); raises RunFailed at the first failed run. Returns the
    finished runs in stage order. Parts whose upstream this instance never materialised are
    refused before any run starts. `changes` ({asset: settings}) go on top of the preset's;
    `target` replaces the environment's."""
    stages = selected_stages(parts)
    absolute_path_variables()
    if instance is None:
        ensure_dagster_home()
        instance = dg.DagsterInstance.get()
    missing = missing_upstream(instance, stages)
    if missing:
        needed = [part for part, assets in PARTS.items() if set(assets) & set(missing)]
        raise ValueError(f"--part {' --part '.join(parts or ())} reads {', '.join(missing)}, which this instance ({instance.root_directory}) "
                         f"has never materialised: run --part {' --part '.join(needed)} first (or the whole graph)")  # fmt: skip
    resources, target_config = run_resources(target)
    runs: list[dg.DagsterRun] = []
    with RunSession(instance, workspace_file, log=log) as session:
        extraction = ExitStack()  # the extraction server of the hidden-state and reference stages, while they run
        server_config, source = {}, None
        with extraction:
            for job, stage in zip(JOBS, stages):
                if not stage:
                    continue
                config = {**run_config(preset, stage, changes), **target_config}
                tags = {STAGE_TAG: job.name}
                if stage not in EXTRACTION_STAGES:
                    extraction.close()  # stopped before the drafter stage trains on its GPUs
                    runs += session.run([RunSpec(job.name, tuple(stage), run_config=config, tags=tags)])
                    continue
                if source is None:
                    hidden = {**run_config(preset, HIDDEN_STAGE, changes), **target_config}
                    server_config, source = extraction.enter_context(
                        shared_extraction_server(resources, hidden, log, check_disk=HIDDEN_STAGE in stages)
                    )
                if stage == HIDDEN_STAGE:
                    specs = [RunSpec(job.name, tuple(stage), partition=key, run_config={**config, **server_config},
                                     tags={**tags, EXTRACTION_TAG: source}) for key in shard_partitions.get_partition_keys()]  # fmt: skip
                else:
                    specs = [RunSpec(job.name, tuple(stage), run_config={**config, **server_config}, tags=tags)]
                runs += session.run(specs)
    return runs


def _hidden_settings(config: dict) -> HiddenStatesConfig:
    return HiddenStatesConfig(**config.get("ops", {}).get("hidden_state_shards", {}).get("config", {}))


def extraction_source(resources: dict, config: dict, log: Callable[[str], None]) -> str:
    """ "engine" or "hf": where hidden-state runs with this run config take their states from."""
    preset, path = resolve_target(resources["inference_server"].target, log=log)
    return hidden_states_source(_hidden_settings(config), preset, path)


@contextmanager
def shared_extraction_server(resources: dict, config: dict, log: Callable[[str], None], check_disk: bool = True) -> Iterator[tuple[dict, str]]:
    """(resource run config, source) for the hidden-state and reference runs. Where those take the
    states from the serving engine and no extraction server is given, one is launched here for
    all of them (one model load for every partition and the benchmark reference, not one per
    run) and handed to them as the `inference_server` resource's `extraction_url`, in run
    config; else the run config is empty. A server of the user's for serving (`url`) is no
    extraction server: one is launched beside it only where none is given. With `check_disk`,
    the free space for every shard of the stage is checked first, before any model loads."""
    server_resource = resources["inference_server"]
    preset, path = resolve_target(server_resource.target, log=log)
    settings = _hidden_settings(config)
    source = hidden_states_source(settings, preset, path)
    storage = resources["storage"]
    if check_disk:
        storage.fetch(storage.corpus(preset.name), log=log)
        need = stage_bytes(settings, preset, str(storage.corpus(preset.name)))
        check_free_space(storage.hidden_states(preset.name), need)
        log(
            f"hidden states: {need / 1e9:.3f} GB for {len(shard_partitions.get_partition_keys())} shards fit the disk of {storage.hidden_states(preset.name)}"
        )
    if server_resource.extraction_url or source != "engine":
        yield {}, source
        return
    ids = engine_layer_ids(extraction_settings(settings, preset), preset)
    storage.fetch(storage.corpus(preset.name), log=log)  # the server's context fits the longest sample
    with launch_extraction_server(path, ids, engine_max_model_len(preset, str(storage.corpus(preset.name))), log=log) as server:
        log(f"one extraction server for every hidden-state partition and the benchmark reference: {server.base_url}")
        yield resource_run_config("inference_server", server_resource, extraction_url=server.base_url), source


def materialize_stale(preset: str | None = None, log: Callable[[str], None] = print, instance: dg.DagsterInstance | None = None,
                      workspace_file: Path = WORKSPACE_FILE, changes: dict[str, dict] | None = None,
                      target: str | None = None) -> StaleRun:  # fmt: skip
    """Materialise only the stale and missing assets and partitions, wave by wave (staleness.py),
    as runs of `instance`; a wave's runs go side by side.

    With `preset`, its settings are wanted: an asset last built with other settings is stale
    too. Without it, each rebuilt asset keeps the settings it last ran with (a never-built one
    gets the default preset's). `changes` go on top of the preset's; `target` replaces the
    environment's.
    """
    absolute_path_variables()
    if instance is None:
        ensure_dagster_home()
        instance = dg.DagsterInstance.get()
    resources, target_config = run_resources(target)
    settings = run_config(preset, changes=changes)["ops"] if preset else None
    stages = {job.name: stage for job, stage in zip(JOBS, STAGES)}
    sources: dict[str, str] = {}  # hidden-state settings -> source, asked once

    def extraction_tag(step: Step, config: dict) -> dict:
        if list(stages[step.stage]) != HIDDEN_STAGE:
            return {}
        key = json.dumps(config, sort_keys=True)
        if key not in sources:
            sources[key] = extraction_source(resources, config, log)
        return {EXTRACTION_TAG: sources[key]}

    with RunSession(instance, workspace_file, log=log) as session:
        return run_stale(ASSETS, stages, instance, resources, settings=settings, fallback=run_config(DEFAULT_PRESET)["ops"],
                         log=log, execute=wave_submitter(session, extraction_tag, target_config))  # fmt: skip


def wave_submitter(session: RunSession, tags_for: Callable[[Step, dict], dict] = lambda step, config: {}, extra_config: dict | None = None):
    """`run_stale`'s execute: a wave's steps submitted together as runs of `session` (side by side,
    as the queue allows), tagged as stale-only runs of their stage plus `tags_for(step, config)`,
    their run config with `extra_config` (the target's resource config) added."""

    def execute(steps: list[Step], configs: list[dict]) -> list[dg.DagsterRun]:
        return session.run([RunSpec(step.stage, step.assets, step.partition, {**config, **(extra_config or {})},
                                    {STALE_ONLY_TAG: "true", STAGE_TAG: step.stage, **tags_for(step, config)})
                            for step, config in zip(steps, configs)])  # fmt: skip

    return execute
