"""Automation: Dagster rebuilds what changes make stale; new prompt files grow the corpus.

* Every asset carries `stale_condition()`, and the automation sensor (Dagster's own
  `AutomationConditionSensorDefinition`, running by default wherever a daemon runs) evaluates
  them every 30 s: an asset is requested when its code version changed (its explicit version or
  its settings, defs/code_versions.py) or a parent got new content (a new data version), never
  while a parent is missing or running, nor before a parent's blocking checks passed. Dagster judges each change once, so a rebuild whose
  content is byte for byte the same stops there, and one with new content carries on to the
  assets below, tick by tick, down to the benchmark. `EAGLE_ASSETS_AUTOMATION=0` leaves the
  conditions off (and `eagle-assets run` starts its own daemon without them, so that only its
  runs write its data folder).
* A failed run of the automation is retried once by Dagster's run-retry daemon (the
  `dagster/max_retries` tag below; dagster.yaml enables retries); if the retry fails too, the
  run stays failed on the UI's Runs page and the asset is not requested again until something
  changes again (a new version, new parent content), or a person materialises it.
* `new_prompt_files`: watches a folder at any fsspec URL (`EAGLE_ASSETS_PROMPTS_URL`, e.g.
  `s3://bucket/prompts/` or a local path) for `.jsonl` / `.parquet` prompt files. For each new
  or changed file it requests `prompts` and `synthetic_corpus` with that file as the prompt
  source: `prompts` becomes the file's prompts and `synthetic_corpus` answers them, keeping every
  sample it already has (its store is append-only and skips finished ids). The automation then
  rebuilds what the corpus's new content makes stale. One file per run, one run at a time; a file
  whose run failed is not retried: upload it again (a new fingerprint).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import dagster as dg
import fsspec

from eagle_assets.settings_env import env_flag, env_int, env_str

RETRAIN_TAG = "eagle_assets/retrain"
"""Tag on every run the prompt-file sensor requests; its value names the file."""
AUTOMATION_RUN_TAGS = {"dagster/max_retries": "1"}
"""Tags of the automation's runs: a failed one is retried once (module doc)."""
IN_FLIGHT = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.SUSPENDED,
    dg.DagsterRunStatus.CANCELING,
]
"""Run statuses of a run that is queued or going (a suspended run is going, paused)."""


def run_in_flight(instance: dg.DagsterInstance) -> dg.DagsterRun | None:
    """A run of `instance` that is queued or going, if there is one."""
    records = instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT), limit=1)
    return records[0].dagster_run if records else None


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


def build_prompt_files_sensor(url: str | None, name: str = "new_prompt_files", minimum_interval_seconds: int = 120) -> dg.SensorDefinition:
    """A sensor that turns each new prompt file under `url` into a corpus run (see module doc)."""

    @dg.sensor(
        name=name,
        target=dg.AssetSelection.assets("prompts", "synthetic_corpus"),
        minimum_interval_seconds=minimum_interval_seconds,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"New prompt files at {url or '$EAGLE_ASSETS_PROMPTS_URL (unset)'} grow the corpus; the automation rebuilds what follows.",
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
        context.update_cursor(json.dumps({**seen, file: files[file]}, sort_keys=True))
        label = f"prompts-{file.rsplit('/', 1)[-1]}-{hashlib.sha256(files[file].encode()).hexdigest()[:8]}"
        context.log.info(f"new prompt file {file}: corpus run {label}")
        # Only what differs from the code location's settings: the other settings are the assets' defaults.
        return dg.RunRequest(
            run_key=f"{file}@{files[file]}",
            asset_selection=[dg.AssetKey("prompts"), dg.AssetKey("synthetic_corpus")],
            run_config={"ops": {"prompts": {"config": {"source": "file", "file_url": file}}}},
            tags={RETRAIN_TAG: label},
        )

    return new_prompt_files


def stale_condition() -> dg.AutomationCondition:
    """Rebuild an asset when its code version changed or a parent's data version changed; never
    while a parent is missing or running, nor before a parent's blocking checks passed on its
    newest materialisation (they run after it, in its run or in a run of their own: without
    this the benchmark would be queued behind the drafter's checks and run even when they
    failed). Dagster's `eager()` reacts to any new parent materialisation; this one only to new
    content, as the UI's "stale" does. It does not build a graph that was never built: do the
    first build with "Materialize all" or `eagle-assets run`."""
    AC = dg.AutomationCondition
    trigger = AC.code_version_changed() | AC.any_deps_match(AC.data_version_changed())
    ready = ~AC.missing() & ~AC.any_deps_missing() & ~AC.any_deps_in_progress() & ~AC.in_progress() & AC.all_deps_blocking_checks_passed()
    return (trigger.since_last_handled() & ready).with_label("stale")


def after_its_asset() -> dg.AutomationCondition:
    """The automation condition of a check defined beside its asset (not in the asset's own
    step): run it once the asset is rebuilt, in the same tick's run where the asset is requested.
    Without one, the automation rebuilds the asset and never checks it, and whatever waits for
    the asset's blocking checks (`stale_condition`) waits for ever."""
    return dg.AutomationCondition.eager().with_label("after its asset")


def with_automation(assets: Sequence[dg.AssetsDefinition]) -> list[dg.AssetsDefinition]:
    """The assets with `stale_condition()` as their automation condition."""
    return [a.map_asset_specs(lambda spec: spec.replace_attributes(automation_condition=stale_condition())) for a in assets]


AUTOMATION_ENV = "EAGLE_ASSETS_AUTOMATION"
AUTOMATION_INTERVAL_ENV = "EAGLE_ASSETS_AUTOMATION_INTERVAL_S"
MIN_AUTOMATION_INTERVAL_S = 5
"""Dagster's asset daemon looks at the automation sensors every 5 s: a shorter interval is that."""


def automation_sensor(name: str = "eagle3_automation") -> dg.AutomationConditionSensorDefinition:
    """Evaluates the automation conditions of every asset, every EAGLE_ASSETS_AUTOMATION_INTERVAL_S
    seconds (default 30: each rebuild of the chain waits at most that for its next step to be
    requested); running from the start."""
    return dg.AutomationConditionSensorDefinition(
        name,
        target=dg.AssetSelection.all(),
        default_status=dg.DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=env_int(AUTOMATION_INTERVAL_ENV, 30, min=MIN_AUTOMATION_INTERVAL_S),
        run_tags=AUTOMATION_RUN_TAGS,
    )


def automation_enabled() -> bool:
    """EAGLE_ASSETS_AUTOMATION: on (unset, 1, true, yes, on) or off (0, false, no, off); anything else is refused."""
    return env_flag(AUTOMATION_ENV, default=True)


def default_sensors(automation: bool = True) -> list[dg.SensorDefinition]:
    """The project's sensors, configured from the environment."""
    prompts = build_prompt_files_sensor(env_str("EAGLE_ASSETS_PROMPTS_URL"))
    return [prompts, automation_sensor()] if automation else [prompts]
