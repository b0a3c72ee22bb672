"""The graphs the session fixtures materialised (conftest.py): copies for the tests that change
them, and what a run of them did, read from the instance."""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg

ASSETS = frozenset(
    {"prompts", "synthetic_corpus", "vocab_mapping", "hidden_state_shards", "benchmark_reference", "drafter_checkpoint", "benchmark_report"}
)


def copy_graph(graph, dest: Path) -> tuple[Path, Path]:
    """A copy of a materialised graph's instance and data folder under `dest`, for a test that
    changes them (rebuilds, failed runs) without changing what the graph's other readers see.
    Returns (dagster_home, data_dir)."""
    _, data, home = graph
    shutil.copytree(home, dest / "dagster_home", ignore=shutil.ignore_patterns("eagle_assets_logs", "*.lock"))
    shutil.copytree(data, dest / "data", ignore=shutil.ignore_patterns("*.lock"))
    return dest / "dagster_home", dest / "data"


def run_outcome(instance: dg.DagsterInstance, run_id: str) -> tuple[set[str], dict[str, object]]:
    """(the assets the run materialised, {"asset:check": its AssetCheckEvaluation}) from its event log."""
    materialised = {e.dagster_event.asset_key.to_user_string() for e in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)}
    checks = {}
    for entry in instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION):
        evaluation = entry.dagster_event.event_specific_data
        checks[f"{evaluation.asset_key.to_user_string()}:{evaluation.check_name}"] = evaluation
    return materialised, checks


def every_check() -> set[str]:
    """Every check of the project's definitions, as "asset:check"."""
    from eagle_assets.defs.graph import build_definitions

    return {k.to_user_string() for k in build_definitions(automation=False).resolve_asset_graph().asset_check_keys}


def failed_checks(checks: dict[str, object]) -> dict[str, object]:
    """The evaluations that count as failures: any blocking one that did not pass, and any other
    that failed above a warning (the speedup on two shared cores is a warning, reported)."""
    return {k: e for k, e in checks.items() if not e.passed and (e.blocking or e.severity != dg.AssetCheckSeverity.WARN)}
