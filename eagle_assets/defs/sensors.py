"""Sensors: new prompt files start a retraining wave; a wave is carried downstream; automation.

* `new_prompt_files`: watches a folder at any fsspec URL (`EAGLE_ASSETS_PROMPTS_URL`, e.g.
  `s3://bucket/prompts/` or a local path) for `.jsonl` / `.parquet` prompt files. For each
  new or changed file it requests the corpus stage with that file as the prompt source
  (`prompts.source = "file"`): `prompts` becomes the file's prompts and `synthetic_corpus`
  answers them, keeping every sample it already has (its store is append-only and skips
  finished ids), so the corpus grows by the new prompts. One file per run, one run at a time.
  `prompts` is not partitioned, so files are not added as dynamic partitions: partitioning it
  would put a partitioned asset upstream of the whole unpartitioned graph.
* `retrain_followup`: once every run of a retraining wave (the schedule's or the prompt
  sensor's) has succeeded, requests the next stale frontier of that wave (staleness is not
  transitive: children turn stale only after their parents rebuild with new content).
  A failed run stops the wave, and so does any run outside the wave started after it.
  A prompt file whose run failed is not retried: upload it again (a new fingerprint).
* Automation conditions (opt-in, `EAGLE_ASSETS_AUTOMATION=1`): each asset gets
  `stale_condition()` and the automation sensor starts running (Dagster's default one
  starts stopped). Then Dagster itself rebuilds what turns stale, and the schedule and the
  follow-up sensor step aside. Like Dagster's `eager()`, it does not build a graph that was
  never built: do the first build with `eagle-assets run` or "Materialize all".
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

import dagster as dg
import fsspec

from eagle_assets.defs.schedules import RETRAIN_TAG, run_in_flight, stage_jobs, wave_requests
from eagle_assets.defs.staleness import Step, stage_lookup, stale_report, step_run_config
from eagle_assets.run_presets import RUN_PRESETS, run_config
from eagle_assets.settings_env import env_choice, env_flag, env_str

PROMPT_SUFFIXES = (".jsonl", ".parquet")


def list_prompt_files(url: str) -> dict[str, str]:
    """Prompt files under the folder `url`: full URL -> a fingerprint that changes with the file."""
    fs, root = fsspec.core.url_to_fs(url)
    if not fs.exists(root):
        raise FileNotFoundError(f"the prompt folder {url} does not exist: create it or fix EAGLE_ASSETS_PROMPTS_URL")
    files = {}
    for path, info in fs.find(root, detail=True).items():
        if info.get("type") == "file" and path.endswith(PROMPT_SUFFIXES):
            stamp = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified") or info.get("created")
            files[fs.unstrip_protocol(path)] = f"{info.get('size')}:{stamp}"
    return files


def build_prompt_files_sensor(
    url: str | None,
    stages: Mapping[str, Iterable[str]] | None = None,
    corpus_stage: str = "corpus_job",
    fallback_preset: str = "smollm2-default",
    name: str = "new_prompt_files",
    minimum_interval_seconds: int = 120,
) -> dg.SensorDefinition:
    """A sensor that turns each new prompt file under `url` into a corpus run (see module doc)."""
    stages = {k: list(v) for k, v in (stages or stage_jobs()).items()}
    fallback = run_config(fallback_preset)["ops"]

    @dg.sensor(
        name=name,
        target=dg.AssetSelection.all(),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"New prompt files at {url or '$EAGLE_ASSETS_PROMPTS_URL (unset)'} grow the corpus and start a retraining wave.",
    )
    def new_prompt_files(context: dg.SensorEvaluationContext):
        if not url:
            return dg.SkipReason("EAGLE_ASSETS_PROMPTS_URL is not set: no prompt folder to watch")
        seen = json.loads(context.cursor) if context.cursor else {}
        files = list_prompt_files(url)
        new = sorted(f for f, stamp in files.items() if seen.get(f) != stamp)
        if not new:
            return dg.SkipReason(f"no new prompt files at {url} ({len(files)} known)")
        busy = run_in_flight(context.instance)
        if busy is not None:
            return dg.SkipReason(f"{len(new)} new prompt file(s) wait for run {busy.run_id} to finish")
        file = new[0]  # one file per run: runs on one corpus store never overlap
        step = Step(corpus_stage, tuple(stages[corpus_stage]), None)
        config = step_run_config(step, context.instance, None, fallback)
        config["ops"]["prompts"] = {"config": {**(config["ops"].get("prompts") or {}).get("config", {}), "source": "file", "file_url": file}}
        context.update_cursor(json.dumps({**seen, file: files[file]}, sort_keys=True))
        wave = f"prompts-{file.rsplit('/', 1)[-1]}-{hashlib.sha256(files[file].encode()).hexdigest()[:8]}"
        context.log.info(f"new prompt file {file}: corpus run, wave {wave}")
        return dg.RunRequest(
            run_key=f"{file}@{files[file]}",
            asset_selection=[dg.AssetKey.from_user_string(a) for a in step.assets],
            run_config=config,
            tags={RETRAIN_TAG: wave},
        )

    return new_prompt_files


def build_followup_sensor(
    stages: Mapping[str, Iterable[str]] | None = None,
    fallback_preset: str = "smollm2-default",
    name: str = "retrain_followup",
    minimum_interval_seconds: int = 30,
) -> dg.SensorDefinition:
    """A sensor that carries a successful retraining wave to its next stale frontier."""
    stages = {k: list(v) for k, v in (stages or stage_jobs()).items()}
    stage_lookup(stages)  # fail at load time on a malformed mapping
    fallback = run_config(fallback_preset)["ops"]

    @dg.sensor(
        name=name,
        target=dg.AssetSelection.all(),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="After every run of a retraining wave succeeds, request what has turned stale below it.",
    )
    def retrain_followup(context: dg.SensorEvaluationContext):
        busy = run_in_flight(context.instance)
        if busy is not None:
            return dg.SkipReason(f"waiting for run {busy.run_id}")
        latest = context.instance.get_runs(limit=1)
        if not latest or RETRAIN_TAG not in latest[0].tags:
            # A run of a person's (or none) came last: it ends any wave; Dagster's UI shows what is stale.
            return dg.SkipReason("the latest run is not part of a retraining wave")
        wave = latest[0].tags[RETRAIN_TAG]
        runs = context.instance.get_runs(dg.RunsFilter(tags={RETRAIN_TAG: wave}))
        failed = [r.run_id for r in runs if r.status != dg.DagsterRunStatus.SUCCESS]
        if failed:
            return dg.SkipReason(f"wave {wave} stopped: run(s) {', '.join(failed)} did not succeed")
        report = stale_report(context.repository_def.asset_graph, context.instance)
        if report.fresh:
            return dg.SkipReason(f"wave {wave} is complete: every asset is up to date")
        context.log.info(f"wave {wave} goes on:\n{report.render()}")
        return list(wave_requests(context, report, stages, wave, fallback))

    return retrain_followup


def stale_condition() -> dg.AutomationCondition:
    """Rebuild an asset (partition) when it is missing, its code version changed, or a parent's
    data version changed; never while a parent is missing or running. Dagster's `eager()`
    reacts to any new parent materialisation; this one only to new content, like staleness."""
    AC = dg.AutomationCondition
    trigger = AC.newly_missing() | AC.code_version_changed() | AC.any_deps_match(AC.data_version_changed())
    return (
        AC.in_latest_time_window() & trigger.since_last_handled() & ~AC.any_deps_missing() & ~AC.any_deps_in_progress() & ~AC.in_progress()
    ).with_label("stale")


def with_automation(assets: Sequence[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    """The assets with `stale_condition()` as their automation condition."""
    return [a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=stale_condition())) for a in assets]


def automation_sensor(name: str = "eagle3_automation") -> dg.AutomationConditionSensorDefinition:
    """Evaluates the automation conditions of every asset; running from the start."""
    return dg.AutomationConditionSensorDefinition(
        name, target=dg.AssetSelection.all(), default_status=dg.DefaultSensorStatus.RUNNING, minimum_interval_seconds=60
    )


def automation_enabled() -> bool:
    """EAGLE_ASSETS_AUTOMATION: on (1, true, yes, on) or off (0, false, no, off, unset); anything else is refused."""
    return env_flag("EAGLE_ASSETS_AUTOMATION")


def default_sensors(automation: bool = False) -> list[dg.SensorDefinition]:
    """The project's sensors, configured from the environment."""
    preset = env_choice("EAGLE_ASSETS_PRESET", "smollm2-default", RUN_PRESETS)
    prompts = build_prompt_files_sensor(env_str("EAGLE_ASSETS_PROMPTS_URL"), fallback_preset=preset)
    # With automation conditions, Dagster carries changes downstream itself.
    return [prompts, automation_sensor() if automation else build_followup_sensor(fallback_preset=preset)]
