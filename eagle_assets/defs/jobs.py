"""The executor of every run: the UI's "Materialize", an automation condition's, `eagle-assets run`'s.

No asset is partitioned, so any selection of the graph runs as one run of Dagster's own asset
job, the same whoever starts it. Its steps run, one after another, in the run's own process by
default: each step waits for the one before, and the inference-server resource keeps a launched
vLLM warm for the next step of the same run that asks for the same configuration (the drafter's
check and the benchmark serve the same two), which separate step processes would start again.
`EAGLE_ASSETS_EXECUTOR=celery` hands every step to Celery workers instead (dagster-celery,
`pip install -e '.[deploy]'`):

    EAGLE_ASSETS_EXECUTOR=celery
    EAGLE_ASSETS_CELERY_BROKER=redis://broker:6379/0    # read by each run, never stored in the job
    EAGLE_ASSETS_CELERY_BACKEND=redis://broker:6379/1   # default: the broker
    dagster-celery worker start -A dagster_celery.app   # on each worker host (queue "dagster")
"""

from __future__ import annotations

import dagster as dg

from eagle_assets.settings_env import env_choice, env_str

EXECUTOR_ENV = "EAGLE_ASSETS_EXECUTOR"
CELERY_BROKER_ENV = "EAGLE_ASSETS_CELERY_BROKER"
CELERY_BACKEND_ENV = "EAGLE_ASSETS_CELERY_BACKEND"
EXECUTORS = ("default", "celery")


def executor_from_env() -> dg.ExecutorDefinition:
    """The deployment's executor, from EAGLE_ASSETS_EXECUTOR: in process (unset or "default", see
    the module doc) or Celery's, with the broker and backend read from the environment when a run
    starts."""
    # The choice is read as the definitions load, not bound as a dg.EnvVar: it picks the jobs'
    # ExecutorDefinition, part of the definitions themselves; the broker and the backend are the
    # executor's config, {"env": NAME}, which each run reads as it starts (EnvVar's config form).
    kind = env_choice("EAGLE_ASSETS_EXECUTOR", "default", EXECUTORS)
    if kind == "default":
        return dg.in_process_executor
    if not env_str("EAGLE_ASSETS_CELERY_BROKER"):
        raise ValueError(f"{EXECUTOR_ENV}=celery needs {CELERY_BROKER_ENV}, the broker's URL (e.g. redis://host:6379/0)")
    try:
        from dagster_celery import celery_executor
    except ImportError as exc:
        raise ValueError(f"{EXECUTOR_ENV}=celery needs dagster-celery: pip install -e '.[deploy]' ({exc})") from exc
    backend = CELERY_BACKEND_ENV if env_str("EAGLE_ASSETS_CELERY_BACKEND") else CELERY_BROKER_ENV
    return celery_executor.configured({"broker": {"env": CELERY_BROKER_ENV}, "backend": {"env": backend}}, name="celery")
