"""Runs the whole graph (or only its stale part) as real Dagster runs in the local instance.

The graph goes in three runs (docs/design.md: one job may not mix partitioned and unpartitioned
assets): the corpus stage, one run per hidden-state partition, then the drafter stage. Each
run is recorded in $DAGSTER_HOME, so the web UI shows it with its lineage and checks.
"""

from __future__ import annotations

import os
import shutil
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator

import dagster as dg

from eagle_assets.defs import ASSETS
from eagle_assets.defs.hidden_states import (
    HiddenStatesConfig,
    engine_layer_ids,
    engine_max_model_len,
    extraction_settings,
    hidden_states_source,
    shard_partitions,
)
from eagle_assets.defs.jobs import JOBS, STAGES
from eagle_assets.defs.resources import default_resources
from eagle_assets.defs.staleness import StaleRun, run_stale
from eagle_assets.embedded_target import resolve_target
from eagle_assets.engines.serving import launch_extraction_server
from eagle_assets.paths import PROJECT_ROOT
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.run_presets import run_config

DEFAULT_PRESET = "smollm2-default"


def ensure_dagster_home() -> Path:
    """$DAGSTER_HOME (default ./.dagster_home) with the project's dagster.yaml in it."""
    home = Path(os.environ.setdefault("DAGSTER_HOME", str(PROJECT_ROOT / ".dagster_home")))
    home.mkdir(parents=True, exist_ok=True)
    src = PROJECT_ROOT / "dagster.yaml"
    if not (home / "dagster.yaml").is_file() or (home / "dagster.yaml").read_bytes() != src.read_bytes():
        shutil.copyfile(src, home / "dagster.yaml")
    return home


def materialize_graph(preset: str = "smollm2-default", log: Callable[[str], None] = print,
                      instance: dg.DagsterInstance | None = None, resources: dict | None = None) -> list[dg.ExecuteInProcessResult]:  # fmt: skip
    """Materialise every asset, stage by stage; raises on the first failed run."""
    if instance is None:
        ensure_dagster_home()
        instance = dg.DagsterInstance.get()
    resources = resources or default_resources()
    results = []
    for stage in STAGES:
        keys = [None]
        stage_resources = resources
        with ExitStack() as stack:
            if stage == ["hidden_state_shards"]:
                keys = shard_partitions.get_partition_keys()
                stage_resources = stack.enter_context(shared_extraction_server(resources, run_config(preset, stage), log))
            for key in keys:
                label = ", ".join(stage) + (f" [partition {key}]" if key else "")
                log(f"materialising {label}")
                result = dg.materialize(
                    ASSETS,
                    selection=stage,
                    instance=instance,
                    resources=stage_resources,
                    run_config=run_config(preset, stage),
                    partition_key=key,
                    raise_on_error=True,
                )
                results.append(result)
                log(f"done: {label} (run {result.run_id})")
    return results


@contextmanager
def shared_extraction_server(resources: dict, config: dict, log: Callable[[str], None]) -> Iterator[dict]:
    """`resources` for the hidden-state runs: where those take the states from the serving engine
    and no extraction server is given, one is launched here for all of them (one model load for
    every partition, not one per run) and handed to them as `extraction_url`."""
    server_resource = resources["inference_server"]
    settings = HiddenStatesConfig(**config.get("ops", {}).get("hidden_state_shards", {}).get("config", {}))
    preset, path = resolve_target(server_resource.target, log=log)
    if server_resource.extraction_url or server_resource.url or hidden_states_source(settings, preset, path) != "engine":
        yield resources
        return
    ids = engine_layer_ids(extraction_settings(settings, preset), preset)
    storage = resources["storage"]
    with launch_extraction_server(path, ids, engine_max_model_len(preset, str(storage.corpus(preset.name))), log=log) as server:
        log(f"one extraction server for every hidden-state partition: {server.base_url}")
        shared = InferenceServerResource(**{**server_resource.model_dump(), "extraction_url": server.base_url})
        yield {**resources, "inference_server": shared}


def materialize_stale(preset: str | None = None, log: Callable[[str], None] = print,
                      instance: dg.DagsterInstance | None = None, resources: dict | None = None) -> StaleRun:  # fmt: skip
    """Materialise only the stale and missing assets and partitions, wave by wave (staleness.py).

    With `preset`, its settings are wanted: an asset last built with other settings is stale
    too. Without it, each rebuilt asset keeps the settings it last ran with (a never-built one
    gets the default preset's).
    """
    if instance is None:
        ensure_dagster_home()
        instance = dg.DagsterInstance.get()
    settings = run_config(preset)["ops"] if preset else None
    stages = {job.name: stage for job, stage in zip(JOBS, STAGES)}
    return run_stale(ASSETS, stages, instance, resources or default_resources(), settings=settings,
                     fallback=run_config(DEFAULT_PRESET)["ops"], log=log)  # fmt: skip
