"""The toy graph (toy_graph.py) as a code location of its own, for the tests that run the real
Dagster session (webserver, daemon, run launcher) and executors: a workspace file names this
module, and the code server, the run workers and the Celery workers load it. Its settings come
from the environment, as the project's own Definitions take theirs:

    EAGLE_TOY_DATA       the folder the assets write into (required)
    EAGLE_TOY_C_SECONDS  how long each c takes (steps run side by side overlap)
    EAGLE_ASSETS_EXECUTOR and the Celery variables: the project's executor choice (defs/jobs.py)
"""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import os
from pathlib import Path

import dagster as dg

from eagle_assets.defs.jobs import executor_from_env
from eagle_assets_tests.defs.toy_graph import make_assets


def build_definitions() -> dg.Definitions:
    assets = make_assets(Path(os.environ["EAGLE_TOY_DATA"]), c_seconds=float(os.environ.get("EAGLE_TOY_C_SECONDS", "0")))
    return dg.Definitions(assets=assets, jobs=[dg.define_asset_job("toy", dg.AssetSelection.all())], executor=executor_from_env())


def toy_job() -> dg.JobDefinition:
    """A job of the whole toy graph, as a module-level function `dg.reconstructable` can point at."""
    return build_definitions().resolve_job_def("toy")


defs = build_definitions()
