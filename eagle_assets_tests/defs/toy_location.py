"""The toy graph (toy_graph.py) as a code location of its own, for the tests that run the real
Dagster daemon, run launcher and executors: a workspace file names this module, and the code
server, the run workers and the Celery workers load it. Its settings come from the environment,
as the project's own Definitions take theirs:

    EAGLE_TOY_DATA       the folder the assets write into (required)
    EAGLE_TOY_B_SCALE    b's setting: another value gives b a new code version (b turns stale)
    EAGLE_TOY_B_NOTE     another value gives b a new code version, its content unchanged
    EAGLE_TOY_C_SECONDS  how long each partition of c takes (parallel runs then overlap)
    EAGLE_TOY_CRON       when set, the project's retraining schedule runs on this cron
    EAGLE_ASSETS_EXECUTOR and the Celery variables: the project's executor choice (defs/jobs.py)

Its stage jobs are built as the project's are (`stage_job`), and c records the config of the
project's inference-server resource, so a test sees what resource config a run was given.
"""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import os
from pathlib import Path

import dagster as dg

from eagle_assets.defs.jobs import executor_from_env, stage_job
from eagle_assets.defs.schedules import build_retrain_schedule
from eagle_assets_tests.defs.toy_graph import BOUND_SERVER, STAGES, make_assets

PARTITIONED_STAGES = {"shards_job"}


def build_definitions() -> dg.Definitions:
    executor = executor_from_env()
    assets = make_assets(
        Path(os.environ["EAGLE_TOY_DATA"]),
        b_scale=int(os.environ.get("EAGLE_TOY_B_SCALE", "1")),
        b_note=os.environ.get("EAGLE_TOY_B_NOTE", "first"),
        c_seconds=float(os.environ.get("EAGLE_TOY_C_SECONDS", "0")),
        c_resources=frozenset({"inference_server"}),
    )
    cron = os.environ.get("EAGLE_TOY_CRON")
    return dg.Definitions(
        assets=assets,
        jobs=[stage_job(name, keys, name in PARTITIONED_STAGES, executor) for name, keys in STAGES.items()],
        schedules=[build_retrain_schedule(cron=cron, stages=STAGES)] if cron else [],
        resources={"inference_server": BOUND_SERVER},
        executor=executor,
    )


defs = build_definitions()
