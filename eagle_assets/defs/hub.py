"""The drafter's blocking checks as the Dagster instance recorded them, for `eagle-assets push`
and the benchmark's `push_to_hub` step: a drafter goes to the hub only when every blocking
check of `drafter_checkpoint` passed on exactly the files being pushed.

The files are tied to the records by content: the materialisation of drafter_checkpoint whose
data version is the hash of the vLLM export (the asset's own data version), and for each
blocking check its latest evaluation that targeted that materialisation. A drafter retrained
since, or one trained outside the graph, has no such records.
"""

from __future__ import annotations

from pathlib import Path

import dagster as dg

from eagle_assets.defs.common import hash_tree
from eagle_assets.hub_push import check_repo_id, find_drafter, push_drafter, refusals, require_token

DATA_VERSION_TAG = "dagster/data_version"
"""The tag under which Dagster stores a materialisation's data version (it has no public constant)."""
HISTORY = 200
"""Materialisations and check evaluations looked through, newest first."""

DRAFTER_KEY = dg.AssetKey("drafter_checkpoint")
BLOCKING_CHECKS = ("serves_in_vllm", "sglang_names", "not_worse_than_parent")
"""The blocking checks of drafter_checkpoint (defs/drafter.py; a test holds the two equal). Named
here, not imported: the benchmark pushes through this module, and importing the drafter's
module would put the corpus's and the drafter's settings into the benchmark's code."""


def recorded_checks(instance: dg.DagsterInstance, vllm_export: Path) -> dict[str, bool | None]:
    """{blocking check: passed} for the drafter whose vLLM export is `vllm_export`; None where
    no evaluation of that check is recorded on the materialisation holding these files."""
    version = hash_tree(Path(vllm_export))
    materialization = next(
        (
            record
            for record in instance.fetch_materializations(DRAFTER_KEY, limit=HISTORY).records
            if (record.asset_materialization.tags or {}).get(DATA_VERSION_TAG) == version
        ),
        None,
    )
    out: dict[str, bool | None] = {name: None for name in BLOCKING_CHECKS}
    if materialization is None:
        return out
    for name in BLOCKING_CHECKS:
        for record in instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(DRAFTER_KEY, name), limit=HISTORY):
            evaluation = record.event.dagster_event.event_specific_data if record.event and record.event.dagster_event else None
            target = getattr(evaluation, "target_materialization_data", None)
            if isinstance(evaluation, dg.AssetCheckEvaluation) and target is not None and target.storage_id == materialization.storage_id:
                out[name] = evaluation.passed
                break
    return out


def push_checked_drafter(
    instance: dg.DagsterInstance,
    drafter_dir: Path,
    repo_id: str,
    private: bool = False,
    allow_unchecked: bool = False,
    log=print,
    endpoint: str | None = None,
) -> dict[str, str]:
    """Push the drafter in `drafter_dir` to `repo_id` (hub_push.py) once its recorded blocking
    checks passed; a ValueError listing every reason it may not go, or a RuntimeError from the hub."""
    check_repo_id(repo_id)
    token = require_token()
    drafter = find_drafter(drafter_dir)
    problems = refusals(drafter, recorded_checks(instance, drafter.vllm), allow_unchecked=allow_unchecked)
    if problems:
        raise ValueError(f"refusing to push {drafter.root} to {repo_id}:\n  - " + "\n  - ".join(problems))
    return push_drafter(drafter, repo_id, token, private=private, endpoint=endpoint, log=log)
