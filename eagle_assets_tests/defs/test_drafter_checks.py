"""The drafter's checks run again on the trained drafter, without retraining it
(`eagle-assets check`, the UI's "Execute checks"), and are recorded in the instance."""

import json
import shutil

import dagster as dg
import pytest
from typer.testing import CliRunner

from eagle_assets.cli import app
from eagle_assets.defs.drafter import DRAFTER_CHECK_NAMES, DRAFTER_CHECKS, DRAFTER_KEY
from eagle_assets.run_presets import SMOLLM2_PARENT_DRAFTER
from eagle_assets.targets import EMBEDDED_TARGET

CHECK_NAMES = ["serves_in_vllm", "samples_under_speculation", "sglang_names", "not_worse_than_parent"]


def _evaluations(instance, name: str) -> int:
    return len(instance.event_log_storage.get_asset_check_execution_history(dg.AssetCheckKey(DRAFTER_KEY, name), limit=100))


def test_the_drafters_checks_are_asset_checks_of_their_own():
    assert sorted(key.name for c in DRAFTER_CHECKS for key in c.check_keys) == sorted(CHECK_NAMES) == sorted(DRAFTER_CHECK_NAMES)


@pytest.mark.engine
@pytest.mark.slow
def test_the_drafter_checks_run_again_without_retraining_and_are_recorded(materialized_graph, monkeypatch):
    """The file-reading checks, run again on the graph's drafter. serves_in_vllm runs again the
    same way; its two servers (about 80 s here) are what the graph's own run already shows as
    the check's own step (test_pipeline_e2e.py), so they are not started a second time."""
    instance, data, home = materialized_graph
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(data))
    drafter = data / EMBEDDED_TARGET / "drafter"
    summary_before = (drafter / "summary.json").read_bytes()
    weights_mtime = (drafter / "drafter-vllm" / "model.safetensors").stat().st_mtime_ns
    materialisations = len(instance.fetch_materializations(DRAFTER_KEY, limit=100).records)
    before = {name: _evaluations(instance, name) for name in CHECK_NAMES}

    result = CliRunner().invoke(app, ["check", "--only", "sglang_names", "--only", "not_worse_than_parent"])

    assert result.exit_code == 0, result.output
    for name in ("sglang_names", "not_worse_than_parent"):
        assert f"{name:28} passed" in result.output, result.output
        assert _evaluations(instance, name) == before[name] + 1, name  # recorded where the UI reads them
    for name in ("serves_in_vllm", "samples_under_speculation"):
        assert name not in result.output and _evaluations(instance, name) == before[name]  # --only ran only those named
    assert (drafter / "summary.json").read_bytes() == summary_before
    assert (drafter / "drafter-vllm" / "model.safetensors").stat().st_mtime_ns == weights_mtime
    assert len(instance.fetch_materializations(DRAFTER_KEY, limit=100).records) == materialisations


def test_a_failed_blocking_check_exits_1_and_a_missing_drafter_is_named(tmp_path, monkeypatch):
    """A warm-started drafter (the shipped one, as its own export) that validates below its
    parent fails not_worse_than_parent; one that validates equal passes."""
    copy = tmp_path / "data" / EMBEDDED_TARGET / "drafter"
    shutil.copytree(SMOLLM2_PARENT_DRAFTER, copy / "drafter-vllm")
    summary = {"exports": {"vllm": str(copy / "drafter-vllm")}, "aux_layer_ids": [2, 15, 27], "ttt_steps": 3}
    (copy / "summary.json").write_text(json.dumps({**summary, "warm_start": "/parent", "val_al": 1.5, "parent_val_al": 1.6}))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EAGLE_ASSETS_DATA", str(tmp_path / "data"))

    result = CliRunner().invoke(app, ["check", "--only", "not_worse_than_parent"])
    assert result.exit_code == 1, result.output
    assert "not_worse_than_parent        FAILED (error)" in result.output and "serves_in_vllm" not in result.output

    # the same counts summed in another order: equal, not worse (as make run's fine-tune measured)
    (copy / "summary.json").write_text(json.dumps({**summary, "warm_start": "/parent", "val_al": 1.9753846079, "parent_val_al": 1.9753846228}))
    result = CliRunner().invoke(app, ["check", "--only", "not_worse_than_parent"])
    assert result.exit_code == 0 and "not_worse_than_parent        passed" in result.output, result.output

    # the trainer's paired comparison decides where it is recorded: a fine-tune lower within noise
    # (the parent was exported) passes, one clearly worse fails, a corpus too small to fine-tune on passes
    from eagle_assets.drafter.parent_gate import compare_with_parent
    from eagle_assets_tests.drafter.test_parent_gate import FINETUNE_4, PARENT_4

    within = compare_with_parent(PARENT_4, FINETUNE_4).to_dict()
    worse = compare_with_parent([[10, 8, 5, 3]] * 8, [[10, 6, 3, 1]] * 8).to_dict()
    cases = [({"parent_comparison": within}, 0), ({"parent_comparison": worse}, 1), ({"finetune_skipped": "not fine-tuned: 34 training samples"}, 0)]
    for fields, code in cases:
        (copy / "summary.json").write_text(json.dumps({**summary, "warm_start": "/parent", "val_al": 1.5, "parent_val_al": 1.6, **fields}))
        result = CliRunner().invoke(app, ["check", "--only", "not_worse_than_parent"])
        assert result.exit_code == code, (fields, result.output)

    (copy / "summary.json").unlink()
    result = CliRunner().invoke(app, ["check", "--only", "sglang_names"])
    assert result.exit_code == 1
    assert (
        f"no trained drafter of {EMBEDDED_TARGET} to check ({copy / 'summary.json'} is missing): materialise drafter_checkpoint first"
        in result.output
    )

    result = CliRunner().invoke(app, ["check", "--only", "serves"])
    assert result.exit_code == 1 and "unknown check 'serves': give one of serves_in_vllm" in result.output
