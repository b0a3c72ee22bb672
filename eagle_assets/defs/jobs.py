"""Jobs: the graph in four runs, because one job may not mix partitioned and unpartitioned assets.

1. `corpus_job`: prompts -> synthetic_corpus -> vocab_mapping
2. `hidden_states_job`: hidden_state_shards, one run per partition (shard)
3. `reference_job`: benchmark_reference, from the same extraction server as the partitions
4. `drafter_job`: drafter_checkpoint -> benchmark_report

Executors. The chained stages (1 and 3) run their steps in the run's own process: each step
there waits for the one before, and the inference-server resource keeps a launched vLLM warm
for the next step of the same run (the drafter's check and the benchmark serve the same two
configurations), which separate step processes would start again. The partitioned stage runs
under Dagster's multiprocess executor; its partitions are separate runs that the run queue
starts side by side (dagster.yaml). `EAGLE_ASSETS_EXECUTOR=celery` hands every stage's steps
to Celery workers instead (dagster-celery, `pip install -e '.[deploy]'`):

    EAGLE_ASSETS_EXECUTOR=celery
    EAGLE_ASSETS_CELERY_BROKER=redis://broker:6379/0    # read by each run, never stored in the job
    EAGLE_ASSETS_CELERY_BACKEND=redis://broker:6379/1   # default: the broker
    dagster-celery worker start -A dagster_celery.app   # on each worker host (queue "dagster")
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import dagster as dg

CORPUS_STAGE = ["prompts", "synthetic_corpus", "vocab_mapping"]
HIDDEN_STAGE = ["hidden_state_shards"]
REFERENCE_STAGE = ["benchmark_reference"]
DRAFTER_STAGE = ["drafter_checkpoint", "benchmark_report"]
STAGES = [CORPUS_STAGE, HIDDEN_STAGE, REFERENCE_STAGE, DRAFTER_STAGE]
EXTRACTION_STAGES = (HIDDEN_STAGE, REFERENCE_STAGE)
"""The stages that read the target's states from its extraction server: one server serves both."""

EXECUTOR_ENV = "EAGLE_ASSETS_EXECUTOR"
CELERY_BROKER_ENV = "EAGLE_ASSETS_CELERY_BROKER"
CELERY_BACKEND_ENV = "EAGLE_ASSETS_CELERY_BACKEND"
EXECUTORS = ("default", "celery")


def executor_from_env() -> dg.ExecutorDefinition | None:
    """The deployment's executor, from EAGLE_ASSETS_EXECUTOR: None (unset or "default": each job
    its own, see the module doc) or Celery's, with the broker and backend read from the
    environment when a run starts."""
    # The choice is read as the definitions load, not bound as a dg.EnvVar: it picks the jobs'
    # ExecutorDefinition, part of the definitions themselves; the broker and the backend are the
    # executor's config, {"env": NAME}, which each run reads as it starts (EnvVar's config form).
    kind = os.environ.get(EXECUTOR_ENV, "").strip() or "default"
    if kind not in EXECUTORS:
        raise ValueError(f"{EXECUTOR_ENV}={kind!r}: give one of {', '.join(EXECUTORS)}")
    if kind == "default":
        return None
    if not os.environ.get(CELERY_BROKER_ENV):
        raise ValueError(f"{EXECUTOR_ENV}=celery needs {CELERY_BROKER_ENV}, the broker's URL (e.g. redis://host:6379/0)")
    try:
        from dagster_celery import celery_executor
    except ImportError as exc:
        raise ValueError(f"{EXECUTOR_ENV}=celery needs dagster-celery: pip install -e '.[deploy]' ({exc})") from exc
    backend = CELERY_BACKEND_ENV if os.environ.get(CELERY_BACKEND_ENV) else CELERY_BROKER_ENV
    return celery_executor.configured({"broker": {"env": CELERY_BROKER_ENV}, "backend": {"env": backend}}, name="celery")


def stage_job(name: str, selection: Sequence[str], partitioned: bool, executor: dg.ExecutorDefinition | None = None,
              description: str | None = None):  # fmt: skip
    """One stage's job: `executor` where the deployment gives one, else multiprocess for a
    partitioned stage and in process for a chained one (module doc)."""
    default = dg.multiprocess_executor if partitioned else dg.in_process_executor
    return dg.define_asset_job(name, selection=list(selection), executor_def=executor or default, description=description)


def build_jobs(executor: dg.ExecutorDefinition | None = None) -> list:
    """The four stage jobs (define_asset_job's unresolved jobs), with `executor` or their defaults."""
    return [
        stage_job("corpus_job", CORPUS_STAGE, False, executor, "Prompts, the target's answers and the draft vocabulary."),
        stage_job("hidden_states_job", HIDDEN_STAGE, True, executor, "The target's hidden states, one run per shard."),
        stage_job("reference_job", REFERENCE_STAGE, False, executor, "The benchmark prompts' greedy answers and states, from the extraction server."),
        stage_job("drafter_job", DRAFTER_STAGE, False, executor, "Train, export, smoke-load and benchmark the drafter."),
    ]


JOBS = build_jobs()
"""The stage jobs with their default executors (their names and selections are what others read)."""
