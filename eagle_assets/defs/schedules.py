"""Scheduled retraining: every week (by default) rebuild exactly what is stale, nothing else.

The schedule starts a retraining *wave*: it asks Dagster for the stale and missing assets
(`staleness.py`) and requests runs for the frontier, the stale assets without a stale
ancestor. Because Dagster's staleness is not transitive, the children of what this rebuilds
turn stale only if its content changed; the `retrain_followup` sensor (sensors.py) then
requests the next frontier of the same wave, until everything is fresh. A code change that
leaves a corpus byte for byte the same never reaches the 5-hour stages.

    EAGLE_ASSETS_RETRAIN_CRON="0 3 * * 0"   # when (cron, UTC); default Sundays 03:00
    EAGLE_ASSETS_PRESET=smollm2-default     # settings for an asset never built before

It runs by default wherever the Dagster daemon runs (`eagle-assets ui`, the compose file, and
the daemon `eagle-assets run` starts for its duration); stop it in the UI's Automation page. A
tick that finds a run queued or going skips: that run may be rebuilding what is stale (two runs
must not write one corpus store at once), and the next tick looks again.

Unpartitioned steps go out as `RunRequest(stale_assets_only=True)`, so the daemon re-checks
staleness when it launches them. Partitioned steps cannot: the daemon's filter asks about a
partitioned asset without a partition and always finds it fresh, so they are requested per
stale partition instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping

import dagster as dg

from eagle_assets.defs.jobs import JOBS, STAGES
from eagle_assets.defs.staleness import StaleReport, stage_lookup, stale_report, step_run_config
from eagle_assets.run_presets import RUN_PRESETS, run_config
from eagle_assets.settings_env import env_choice, env_str

RETRAIN_TAG = "eagle_assets/retrain"
"""Tag on every run of a retraining wave; its value names the wave."""
DEFAULT_CRON = "0 3 * * 0"
"""Weekly, Sunday 03:00."""
IN_FLIGHT = [
    dg.DagsterRunStatus.NOT_STARTED,
    dg.DagsterRunStatus.QUEUED,
    dg.DagsterRunStatus.STARTING,
    dg.DagsterRunStatus.STARTED,
    dg.DagsterRunStatus.SUSPENDED,
    dg.DagsterRunStatus.CANCELING,
]
"""Run statuses of a run that is queued or going (a suspended run is going, paused); the
schedule and the sensors wait while there is one."""


def run_in_flight(instance: dg.DagsterInstance) -> dg.DagsterRun | None:
    """A run of `instance` that is queued or going, if there is one."""
    records = instance.get_run_records(dg.RunsFilter(statuses=IN_FLIGHT), limit=1)
    return records[0].dagster_run if records else None


def stage_jobs() -> dict[str, list[str]]:
    """The project's stages: job name -> asset keys (runs never mix them)."""
    return {job.name: list(stage) for job, stage in zip(JOBS, STAGES)}


def wave_requests(
    context: dg.ScheduleEvaluationContext | dg.SensorEvaluationContext,
    report: StaleReport,
    stages: Mapping[str, Iterable[str]],
    wave: str,
    fallback: Mapping[str, dict],
    overrides: Mapping[str, dict] | None = None,
) -> Iterator[dg.RunRequest]:
    """Run requests for the frontier of `report`, tagged with `wave`.

    Each asset keeps the settings it last ran with (a never-built one gets `fallback`'s);
    `overrides` (op -> {"config": ...}) replaces them for named assets. The run key is unique
    to the wave and the state asked about, so a repeated tick never asks twice.
    """
    state = hashlib.sha256(report.render().encode()).hexdigest()[:12]
    for step in report.next_steps(stage_lookup(stages)):
        config = step_run_config(step, context.instance, None, fallback)
        ops = {dg.AssetKey.from_user_string(a).to_python_identifier() for a in step.assets}
        config["ops"].update({op: value for op, value in (overrides or {}).items() if op in ops})
        yield dg.RunRequest(
            run_key=f"{wave}:{state}:{step.stage}:{','.join(step.assets)}:{step.partition or ''}",
            asset_selection=[dg.AssetKey.from_user_string(a) for a in step.assets],
            partition_key=step.partition,
            stale_assets_only=step.partition is None,
            run_config=config,
            tags={RETRAIN_TAG: wave},
        )


def build_retrain_schedule(
    cron: str = DEFAULT_CRON,
    stages: Mapping[str, Iterable[str]] | None = None,
    fallback_preset: str = "smollm2-default",
    name: str = "retrain_stale",
    default_status: dg.DefaultScheduleStatus = dg.DefaultScheduleStatus.RUNNING,
) -> dg.ScheduleDefinition:
    """The weekly retraining schedule: requests the stale frontier, or skips when all is fresh."""
    stages = {k: list(v) for k, v in (stages or stage_jobs()).items()}
    fallback = run_config(fallback_preset)["ops"]

    @dg.schedule(
        name=name,
        cron_schedule=cron,
        target=dg.AssetSelection.all(),
        default_status=default_status,
        description="Rebuild only what is stale (code, settings or upstream content changed); "
        "the retrain_followup sensor carries the wave downstream.",
    )
    def retrain(context: dg.ScheduleEvaluationContext):
        busy = run_in_flight(context.instance)
        if busy is not None:
            return dg.SkipReason(f"run {busy.run_id} ({busy.job_name}) is {busy.status.value.lower()}: it may be rebuilding what is stale")
        report = stale_report(context.repository_def.asset_graph, context.instance)
        if report.fresh:
            return dg.SkipReason("every asset is up to date: nothing to retrain")
        wave = f"schedule-{context.scheduled_execution_time:%Y%m%dT%H%M}"
        context.log.info(f"retraining wave {wave}:\n{report.render()}")
        return list(wave_requests(context, report, stages, wave, fallback))

    return retrain


def default_schedules() -> list[dg.ScheduleDefinition]:
    """The project's schedules, with the cron and fallback preset from the environment."""
    return [
        build_retrain_schedule(
            cron=env_str(
                "EAGLE_ASSETS_RETRAIN_CRON",
                DEFAULT_CRON,
                check=is_valid_cron,
                expect="a cron string of five fields, e.g. '0 3 * * 0' (Sundays 03:00)",
            ),
            fallback_preset=env_choice("EAGLE_ASSETS_PRESET", "smollm2-default", RUN_PRESETS),
        )
    ]


def is_valid_cron(value: str) -> bool:
    """Whether Dagster takes `value` as a schedule's cron string: its own check, as a
    ScheduleDefinition makes it (Dagster exports no cron validator)."""
    try:
        dg.ScheduleDefinition(name="cron_check", cron_schedule=value, job_name="cron_check")
    except dg.DagsterInvalidDefinitionError:
        return False
    return True
