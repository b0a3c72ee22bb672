"""The whole graph on the embedded target, end to end, through real Dagster runs and real vLLM.

One session fixture (`materialized_graph`, conftest.py) runs prompts -> corpus -> vocab ->
hidden states -> drafter -> benchmark once with the "smollm2-tiny" preset; these tests read
what it produced and serve its drafter again where a comparison needs it.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import dagster as dg
import pytest

from eagle_assets.bench.benchmark import run_benchmark
from eagle_assets.bench.checks import host_drift, round_speedups
from eagle_assets.bench.served import SweepSettings, mt_bench_prompts, run_served
from eagle_assets.bench.settings import BenchmarkSettings
from eagle_assets.drafter.export import export_vllm, load_drafter
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.engines.serving import launch_vllm
from eagle_assets.run_presets import RUN_PRESETS
from eagle_assets.targets import EMBEDDED_TARGET

pytestmark = [pytest.mark.engine, pytest.mark.slow]
ASSETS = ["prompts", "synthetic_corpus", "vocab_mapping", "hidden_state_shards", "benchmark_reference", "drafter_checkpoint", "benchmark_report"]


def _base(data: Path) -> Path:
    return data / EMBEDDED_TARGET


def test_every_asset_materialised_with_blocking_checks_passed(materialized_graph):
    instance, _, _ = materialized_graph
    for name in ASSETS:
        assert instance.get_latest_materialization_event(dg.AssetKey(name)) is not None, name
    for name, check in [
        ("synthetic_corpus", "token_round_trip"),
        ("synthetic_corpus", "error_rate"),
        ("vocab_mapping", "consistent"),
        ("drafter_checkpoint", "serves_in_vllm"),
        ("drafter_checkpoint", "samples_under_speculation"),
        ("drafter_checkpoint", "sglang_names"),
    ]:
        record = instance.event_log_storage.get_latest_asset_check_execution_by_key([dg.AssetCheckKey(dg.AssetKey(name), check)])
        execution = record[dg.AssetCheckKey(dg.AssetKey(name), check)]
        assert execution.status.value == "SUCCEEDED", (name, check, execution)
        assert execution.event.dagster_event.event_specific_data.passed, (name, check)


def test_the_benchmark_serves_on_the_servers_the_drafter_check_left_running(materialized_graph):
    """The drafter's serving check (its own step, after the asset's) starts the speculative and
    the plain server; on a CPU host both stay warm, so the benchmark of the same run starts no
    vLLM of its own (the tiny preset serves no n-gram and one K) and, both being up, serves them
    interleaved, as it does by default where its servers fit at once."""
    instance, data, _ = materialized_graph
    run_id = instance.get_latest_materialization_event(dg.AssetKey("benchmark_report")).run_id
    assert instance.get_latest_materialization_event(dg.AssetKey("drafter_checkpoint")).run_id == run_id
    messages = {
        step: [e.user_message for e in instance.all_logs(run_id) if (e.step_key or "").endswith(step)]
        for step in ("drafter_serves", "benchmark_report")
    }
    assert sum(m.startswith("starting vLLM") for m in messages["drafter_serves"]) == 2
    assert not any(m.startswith("starting vLLM") for m in messages["benchmark_report"]), messages["benchmark_report"]
    assert sum(m.startswith("reusing the running server") for m in messages["benchmark_report"]) == 2
    report = json.loads((_base(data) / "report" / "report.json").read_text())
    assert [r["label"] for r in report["runs"]] == ["baseline", "eagle3"]
    assert any("interleaved" in n and "the default where every server fits at once" in n for n in report["notes"])
    assert all(len(r["levels"][0]["round_tokens_per_s"]) == 2 for r in report["runs"])  # 2 prompts: a round each


def test_report_served_figures_come_from_the_engine_counters(materialized_graph):
    _, data, _ = materialized_graph
    report = json.loads((_base(data) / "report" / "report.json").read_text())
    eagle = next(r for r in report["runs"] if r["label"] == "eagle3")
    stats = [lvl["spec"] for lvl in eagle["levels"]]
    k = len(report["offline"]["per_position_acceptance"])
    assert all(s and s["drafts"] > 0 for s in stats), "the engine counted no drafts"
    served_al = report["served"]["al"]
    assert 1.0 <= served_al <= k + 1
    # AL from the raw counters, as docs/design.md defines it.
    drafts = sum(s["drafts"] for s in stats)
    accepted = sum(s["accepted"] for s in stats)
    assert served_al == pytest.approx(1 + accepted / drafts)
    assert report["parity"]["parity_ok"], report["parity"]["sentence"]
    # The drafter's own validation, from its training summary, stands beside the offline numbers.
    summary = json.loads((_base(data) / "drafter" / "summary.json").read_text())
    assert report["training"]["validation"]["al"] == pytest.approx(summary["val_al"])
    assert report["training"]["train_tokens"] == summary["train_tokens"] > 0
    assert (_base(data) / "report" / "report.md").read_text().count("acceptance length") >= 1


def test_trained_drafter_accepts_more_than_an_untrained_one(materialized_graph, tmp_path):
    """The report served the trained drafter on MT-Bench prompts (held out: never trained on);
    an untrained drafter of the same shape is served on the same prompts and settings."""
    _, data, _ = materialized_graph
    trained_dir = _base(data) / "drafter" / "drafter-vllm"
    trained_al = json.loads((_base(data) / "report" / "report.json").read_text())["served"]["al"]
    trained, config = load_drafter(trained_dir)
    untrained = Eagle3Drafter(config)  # same shape, fresh initialisation, same d2t/t2d
    untrained.d2t.copy_(trained.d2t)
    untrained.t2d.copy_(trained.t2d)
    untrained_dir = export_vllm(untrained, config, tmp_path / "untrained")
    bench = RUN_PRESETS["smollm2-tiny"].benchmark_report
    sweep = SweepSettings(output_len=bench["output_len"], concurrencies=(1,), progress=False)
    with launch_vllm(EMBEDDED_TARGET, drafter=untrained_dir, k=3, log=lambda m: None) as server:
        run = run_served("untrained", server.base_url, server.model, mt_bench_prompts(bench["num_prompts"]), sweep)
    assert trained_al > run.levels[0].spec.al, (trained_al, run.levels[0].spec.al)


def test_shifted_layer_ids_are_blamed_on_the_engine_wiring(materialized_graph, vllm_server, smollm2_path, tmp_path):
    _, data, _ = materialized_graph
    trained_dir = _base(data) / "drafter" / "drafter-vllm"
    wrong = tmp_path / "wrong-export"
    shutil.copytree(trained_dir, wrong)
    cfg = json.loads((wrong / "config.json").read_text())
    ids = cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [i + 1 for i in ids]  # SpecForge-style off-by-one
    (wrong / "config.json").write_text(json.dumps(cfg, indent=2))
    # Served one after another (the graph's run served interleaved), no speculation again last.
    settings = BenchmarkSettings(num_prompts=2, output_len=24, concurrencies=(1,), k=3, ngram=False, interleave_rounds=0)

    def serve(spec):
        # The baseline is the session's plain server: one engine start fewer.
        return contextlib.nullcontext(vllm_server) if spec is None else launch_vllm(EMBEDDED_TARGET, speculative=spec, log=lambda m: None)

    report, _ = run_benchmark(
        settings,
        EMBEDDED_TARGET,
        smollm2_path,
        trained_dir,
        serve,
        tmp_path / "report",
        trained_aux_layer_ids=ids,
        target_num_layers=30,
        served_drafter_dir=wrong,
        log=lambda m: None,
    )
    assert report.parity.verdict == "engine_wiring", report.parity.sentence
    assert "layer" in " ".join(report.parity.causes).lower()
    assert [r.label for r in report.runs] == ["baseline", "eagle3", "baseline (end)"]
    # The host's drift over the run, from no speculation served first and again last.
    first, last = report.runs[0].levels[0], report.runs[2].levels[0]
    assert host_drift(report.runs)[1] == pytest.approx(last.tokens_per_s / first.tokens_per_s)
    assert not round_speedups(report.runs) and not any("interleaved" in n for n in report.notes)
