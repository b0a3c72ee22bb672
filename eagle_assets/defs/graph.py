"""The project's Definitions: assets with their checks, the executor, automation, resources."""

from __future__ import annotations

import dagster as dg

from eagle_assets.defs.benchmark import benchmark_reference, benchmark_report
from eagle_assets.defs.corpus import prompts, synthetic_corpus
from eagle_assets.defs.drafter import drafter_checkpoint, drafter_checks
from eagle_assets.defs.hidden_states import hidden_state_shards, vocab_mapping
from eagle_assets.defs.jobs import executor_from_env
from eagle_assets.defs.resources import default_resources
from eagle_assets.defs.sensors import automation_enabled, default_sensors, with_automation

ASSETS = [prompts, synthetic_corpus, vocab_mapping, hidden_state_shards, benchmark_reference, drafter_checkpoint, benchmark_report]


def build_definitions(automation: bool | None = None) -> dg.Definitions:
    """The project's Definitions. `automation` (default: EAGLE_ASSETS_AUTOMATION, on unless 0)
    gives each asset its automation condition and runs the automation sensor (defs/sensors.py).
    Every run, whoever starts it, is a run of Dagster's own asset job with the executor from
    EAGLE_ASSETS_EXECUTOR (defs/jobs.py). The assets' settings are the code location's
    (defs/settings.py). The resources' fields set from the environment are EnvVars, read by each
    run as it starts (defs/resources.py)."""
    automation = automation_enabled() if automation is None else automation
    return dg.Definitions(
        assets=with_automation(ASSETS) if automation else ASSETS,
        asset_checks=drafter_checks(automation),
        executor=executor_from_env(),
        sensors=default_sensors(automation),
        resources=default_resources(deferred=True),
    )
