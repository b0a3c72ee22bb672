"""Dagster wiring only: assets with their checks, jobs, resources. Pure code lives elsewhere."""

from __future__ import annotations

import dagster as dg

from eagle_assets.defs.benchmark import benchmark_reference, benchmark_report
from eagle_assets.defs.corpus import prompts, synthetic_corpus
from eagle_assets.defs.drafter import DRAFTER_CHECKS, drafter_checkpoint
from eagle_assets.defs.hidden_states import hidden_state_shards, vocab_mapping
from eagle_assets.defs.jobs import build_jobs, executor_from_env
from eagle_assets.defs.resources import default_resources
from eagle_assets.defs.schedules import default_schedules
from eagle_assets.defs.sensors import automation_enabled, default_sensors, with_automation

ASSETS = [prompts, synthetic_corpus, vocab_mapping, hidden_state_shards, benchmark_reference, drafter_checkpoint, benchmark_report]


def build_definitions(automation: bool | None = None) -> dg.Definitions:
    """The project's Definitions. `automation` (default: EAGLE_ASSETS_AUTOMATION=1) gives each
        asset an automation condition and a running automation sensor, which then take over from
        the retraining schedule and its follow-up sensor (defs/sensors.py). The executor comes from
        EAGLE_ASSETS_EXECUTOR (defs/jobs.py): the stage jobs', and that of the runs the UI, the
        schedule and the sensors start for any other selection of assets. The resources' fields set
    from the environment are EnvVars, read by each run as it starts (defs/resources.py)."""
    automation = automation_enabled() if automation is None else automation
    executor = executor_from_env()
    return dg.Definitions(
        assets=with_automation(ASSETS) if automation else ASSETS,
        asset_checks=DRAFTER_CHECKS,
        jobs=build_jobs(executor),
        executor=executor,
        schedules=[] if automation else default_schedules(),
        sensors=default_sensors(automation),
        resources=default_resources(deferred=True),
    )
