"""The benchmark report: files written and readable, speedups, checks, definitions, summary."""

from __future__ import annotations

import dataclasses
import json

import pytest
from typer.testing import CliRunner

from eagle_assets.bench.checks import against, host_drift, round_speedups, speedup_check, speedups
from eagle_assets.bench.metrics import METRIC_DEFINITIONS, SpecStats
from eagle_assets.bench.parity import AcceptanceNumbers, TrainingFacts
from eagle_assets.bench.report import (
    PLOT_ACCEPTANCE,
    PLOT_SPEEDUP,
    PLOT_THROUGHPUT,
    build_report,
    load_report,
    summary_text,
    to_markdown,
    write_report,
)
from eagle_assets.bench.served import LevelResult, ServedRun
from eagle_assets.cli import app

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
CONCURRENCIES = (1, 4, 8)


def _level(c: int, tokens_per_s: float, spec: SpecStats | None = None) -> LevelResult:
    tokens = 8 * 64
    wall = tokens / tokens_per_s
    return LevelResult(
        concurrency=c,
        num_requests=8,
        output_tokens=tokens,
        wall_s=wall,
        tokens_per_s=tokens_per_s,
        requests_per_s=8 / wall,
        ttft_s={"mean": 0.12, "p50": 0.1, "p90": 0.2},
        itl_s={"mean": 0.021, "p50": 0.02, "p90": 0.03},
        tokens_per_chunk=spec.al if spec and spec.drafts else 1.0,
        spec=spec,
    )


def _run(label: str, tokens_per_s: dict[int, float], spec: SpecStats | None = None, output_len: int = 64) -> ServedRun:
    return ServedRun(
        label, "vllm", "smollm2-135m-instruct", "http://127.0.0.1:8150", output_len, 8, tuple(_level(c, tokens_per_s[c], spec) for c in CONCURRENCIES)
    )


def _interleaved(label: str, rounds: tuple[float, float], spec: SpecStats | None = None) -> ServedRun:
    """A run at concurrency 1 served in two rounds of 4 prompts at these tokens/s."""
    walls = [4 * 64 / tps for tps in rounds]
    level = dataclasses.replace(_level(1, 8 * 64 / sum(walls), spec), wall_s=sum(walls), round_tokens_per_s=rounds)
    return ServedRun(label, "vllm", "smollm2-135m-instruct", "http://127.0.0.1:8150", 64, 8, (level,))


# Per level: 100 drafts, 300 drafted, 150 accepted -> AL 2.5, 50 %, p = (0.7, 0.5, 0.3).
EAGLE = SpecStats(100, 300, 150, (70, 50, 30))
NGRAM = SpecStats(50, 150, 30, (20, 7, 3))
RUNS = [
    _run("baseline", {1: 50.0, 4: 160.0, 8: 240.0}),
    _run("eagle3", {1: 80.0, 4: 200.0, 8: 216.0}, EAGLE),
    _run("ngram", {1: 55.0, 4: 168.0, 8: 240.0}, NGRAM),
]
OFFLINE = AcceptanceNumbers(2.55, (0.72, 0.52, 0.31), 600, "offline reference")
TRAINING = TrainingFacts.from_summary(
    {"val_al": 2.7, "val_accept": [0.74, 0.55, 0.42], "epochs": 18, "train_samples": 15680, "train_tokens": 4_900_000}
)


def test_speedup_is_tokens_per_s_with_over_without():
    s = speedups(RUNS)
    assert s["eagle3"] == {1: 80.0 / 50.0, 4: 200.0 / 160.0, 8: 216.0 / 240.0}
    assert s["ngram"] == {1: 55.0 / 50.0, 4: 168.0 / 160.0, 8: 1.0}
    assert "baseline" not in s
    assert speedup_check(RUNS).passed
    slower = [RUNS[0], _run("eagle3", {1: 45.0, 4: 160.0, 8: 240.0}, EAGLE)]
    check = speedup_check(slower)
    assert not check.passed and check.metadata["speedup"] == 45.0 / 50.0
    assert not speedup_check(RUNS[1:]).passed  # no baseline: nothing to compare with


def test_a_baseline_served_again_gives_the_drift_and_the_mean_to_compare_with(tmp_path):
    # The host slowed by a fifth during the run at concurrency 1 and held at 4 and 8.
    end = _run("baseline (end)", {1: 40.0, 4: 160.0, 8: 240.0})
    runs = [*RUNS, end]
    assert host_drift(runs) == {1: 0.8, 4: 1.0, 8: 1.0}
    assert host_drift(RUNS) == {}
    s = speedups(runs)
    assert s["eagle3"] == {1: 80.0 / 45.0, 4: 200.0 / 160.0, 8: 216.0 / 240.0}
    assert set(s) == {"eagle3", "ngram"}
    report = build_report("smollm2-135m-instruct", "d", runs, offline=OFFLINE)
    assert report.checks[0].metadata["speedup"] == 80.0 / 45.0
    text = summary_text(report)
    assert "host drift (no speculation, last / first): concurrency 1: 0.80x - the host's speed moved 20% during the run" in text
    assert "concurrency 4: 1.00x; concurrency 8: 1.00x" in text
    # No speculation counts once among the fastest, at the mean of its two runs.
    assert "concurrency 8: no speculation (240.0 tok/s, 1.00x ngram)" in text and "1.00x baseline (end)" not in text
    assert "80.0 (1.78x)" in text and "(without: the mean of its first and last run)" in text
    md = to_markdown(report)
    assert "### Host drift" in md and "- concurrency 1: 0.80x - the host's speed moved 20%" in md
    assert "| 1 | baseline (end) | 40.0 |" in md and "mean = 1.00x" in md
    paths = write_report(report, tmp_path)
    assert json.loads(paths.json.read_text())["host_drift"] == {"1": 0.8, "4": 1.0, "8": 1.0}
    assert load_report(paths.json) == report
    steady = build_report("t", "d", [*RUNS, _run("baseline (end)", {1: 52.0, 4: 160.0, 8: 240.0})], offline=OFFLINE)
    assert "concurrency 1: 1.04x; concurrency 4" in summary_text(steady) and "moved" not in summary_text(steady)


def test_runs_served_in_rounds_give_each_rounds_speedup(tmp_path):
    # Interleaved in two rounds of 4 prompts at concurrency 1: the host was twice as fast in the
    # second round for both configurations, so each round's ratio shows it and the level's is theirs.
    runs = [_interleaved("baseline", (40.0, 80.0)), _interleaved("eagle3", (60.0, 128.0), EAGLE), _interleaved("ngram", (44.0, 88.0), NGRAM)]
    assert round_speedups(runs) == {"eagle3": {1: (1.5, 1.6)}, "ngram": {1: (1.1, 1.1)}}
    assert round_speedups(RUNS) == {}  # served in one go: no rounds
    report = build_report("smollm2-135m-instruct", "d", runs, offline=OFFLINE)
    assert report.speedups["eagle3"][1] == pytest.approx((8 * 64 / (256 / 60 + 256 / 128)) / (8 * 64 / (256 / 40 + 256 / 80)))
    text = summary_text(report)
    assert "speedup by round, lowest-highest: eagle3 c=1 1.50-1.60x; ngram c=1 1.10-1.10x" in text
    md = to_markdown(report)
    assert "### Speedup from round to round" in md
    assert "- eagle3 at concurrency 1: 1.53x over the level, rounds 1.50x to 1.60x (1.50, 1.60)" in md
    paths = write_report(report, tmp_path)
    assert json.loads(paths.json.read_text())["round_speedups"] == {"eagle3": {"1": [1.5, 1.6]}, "ngram": {"1": [1.1, 1.1]}}
    assert load_report(paths.json) == report


def test_the_drafter_is_set_against_ngram_per_level_and_per_round(tmp_path):
    # The question after "does it pay": does it pay more than n-gram, which needs no training?
    assert against(RUNS, "eagle3", "ngram") == {1: (80.0 / 55.0, ()), 4: (200.0 / 168.0, ()), 8: (216.0 / 240.0, ())}
    assert against(RUNS[:2], "eagle3", "ngram") == {}
    text = summary_text(build_report("smollm2-135m-instruct", "d", RUNS, offline=OFFLINE))
    assert "eagle3 over n-gram (tok/s): c=1 1.45x; c=4 1.19x; c=8 0.90x" in text

    runs = [_interleaved("baseline", (40.0, 80.0)), _interleaved("eagle3", (66.0, 120.0), EAGLE), _interleaved("ngram", (44.0, 100.0), NGRAM)]
    level = (8 * 64 / (256 / 66 + 256 / 120)) / (8 * 64 / (256 / 44 + 256 / 100))
    assert against(runs, "eagle3", "ngram") == {1: (pytest.approx(level), (1.5, 1.2))}
    report = build_report("smollm2-135m-instruct", "d", runs, offline=OFFLINE)
    assert report.speedups["eagle3"][1] / report.speedups["ngram"][1] == pytest.approx(level)  # the ratio of the speedups
    assert f"eagle3 over n-gram (tok/s): c=1 {level:.2f}x (rounds 1.20-1.50x)" in summary_text(report)
    md = to_markdown(report)
    assert "### eagle3 against n-gram" in md and f"- concurrency 1: {level:.2f}x (rounds 1.20x to 1.50x)" in md
    assert "against_ngram" in report.definitions
    saved = json.loads(write_report(report, tmp_path).json.read_text())["against_ngram"]
    assert saved == {"1": {"ratio": pytest.approx(level), "rounds": [1.5, 1.2]}}


def test_an_aa_control_gives_the_noise_floor_and_is_never_the_fastest(tmp_path):
    # The second server without speculation read faster than the first and than the drafter.
    runs = [_interleaved("baseline", (40.0, 80.0)), _interleaved("baseline (control)", (44.0, 76.0)), _interleaved("eagle3", (42.0, 80.0), EAGLE)]
    report = build_report("smollm2-135m-instruct", "d", runs, offline=OFFLINE)
    level = (8 * 64 / (256 / 44 + 256 / 76)) / (8 * 64 / (256 / 40 + 256 / 80))
    text = summary_text(report)
    assert f"A/A control (a second server without speculation, over the first): c=1 {level:.2f}x (rounds 0.95-1.10x)" in text
    assert "fastest: concurrency 1: eagle3" in text and "fastest: concurrency 1: baseline (control)" not in text
    md = to_markdown(report)
    assert "### Noise floor: the A/A control" in md and f"- concurrency 1: {level:.2f}x (rounds 0.95x to 1.10x)" in md
    assert report.speedups["eagle3"][1] < level  # the drafter's lead is inside the noise
    assert "control" in report.definitions
    saved = json.loads(write_report(report, tmp_path).json.read_text())["control"]
    assert saved == {"1": {"ratio": pytest.approx(level), "rounds": [1.1, 0.95]}}
    assert "Noise floor" not in to_markdown(build_report("t", "d", RUNS, offline=OFFLINE))


def test_speedup_refuses_runs_of_different_work():
    with pytest.raises(ValueError, match="same prompts and lengths"):
        speedups([RUNS[0], _run("eagle3", {1: 1.0, 4: 1.0, 8: 1.0}, EAGLE, output_len=128)])


def test_report_pools_served_acceptance_and_runs_the_checks():
    report = build_report("smollm2-135m-instruct", "/drafters/smollm2-eagle3", RUNS, offline=OFFLINE, parent_al=2.4)
    # Pooled over the three levels: 300 drafts, 450 accepted.
    assert report.served == AcceptanceNumbers(2.5, (0.7, 0.5, 0.3), 300, "served vllm")
    assert report.parity.verdict == "ok"
    assert {c.name: c.passed for c in report.checks} == {
        "speedup_above_1_at_concurrency_1": True,
        "parity_within_tolerance": True,
        "al_not_below_parent": True,
    }
    regressed = build_report("t", "d", RUNS, offline=OFFLINE, parent_al=2.7)
    assert not regressed.passed
    with pytest.raises(ValueError, match="share a label"):
        build_report("t", "d", [RUNS[0], RUNS[0]])


def test_written_report_is_complete_and_reads_back(tmp_path):
    slices = (
        AcceptanceNumbers(2.1, (0.6, 0.3, 0.2), 40, "category writing"),
        AcceptanceNumbers(1.5, (0.3, 0.1, 0.1), 9, "after the end of the answer"),
    )
    report = build_report(
        "smollm2-135m-instruct", "/drafters/smollm2-eagle3", RUNS, offline=OFFLINE, offline_slices=slices, parent_al=2.4, training=TRAINING
    )
    paths = write_report(report, tmp_path / "out")

    assert set(paths.plots) == {PLOT_ACCEPTANCE, PLOT_THROUGHPUT, PLOT_SPEEDUP}
    for png in paths.plots.values():
        data = png.read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 5000
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]  # no temp files left

    # Standard JSON (no NaN) that reads back to the same report.
    text = paths.json.read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    assert load_report(paths.json) == report
    assert load_report(tmp_path / "out") == report

    md = paths.markdown.read_text()
    for definition in METRIC_DEFINITIONS.values():
        assert definition in md
    assert "## Verdict: `ok`" in md
    assert "| 1 | eagle3 | 80.0 |" in md and "1.60x" in md
    assert "| 8 | eagle3 | 216.0 |" in md and "0.90x" in md  # a slowdown is shown, not hidden
    assert "| 1 | 1.60x | 1.10x |" in md  # n-gram's speedup beside ours
    assert "| category writing | 2.10 | 40 | 0.60 | 0.30 | 0.20 |" in md
    assert "| after the end of the answer | 1.50 | 9 | 0.30 | 0.10 | 0.10 |" in md
    # The drafter's own validation beside the offline and served numbers, with what it trained on.
    assert "| training validation (held-out corpus answers, replayed) | 2.70 | - | 0.74 | 0.55 | 0.42 |" in md
    assert "trained on 4,900,000 tokens, 15,680 samples, 18 epochs" in md
    for name in paths.plots:
        assert f"]({name})" in md


def test_engine_wiring_report_shows_causes_and_config(tmp_path):
    served_bad = SpecStats(100, 300, 10, (8, 2, 0))
    runs = [RUNS[0], _run("eagle3", {1: 40.0, 4: 120.0, 8: 150.0}, served_bad)]
    drafter = {"architectures": ["LlamaForCausalLMEagle3"], "norm_output": True, "draft_vocab_size": 8192}
    report = build_report("smollm2-135m-instruct", "d", runs, offline=OFFLINE, drafter_path=drafter)
    assert report.parity.verdict == "engine_wiring"
    md = to_markdown(report)
    assert "## Verdict: `engine_wiring`" in md
    assert "norm_output is true" in md and "| norm_output | `true` |" in md
    text = summary_text(report)
    assert "engine_wiring" in text and "[FAIL] speedup_above_1_at_concurrency_1" in text
    assert len(text.splitlines()) <= 25


def test_report_without_speculation_or_baseline_still_writes(tmp_path):
    report = build_report("t", "d", [_run("baseline", {1: 50.0, 4: 160.0, 8: 240.0})])
    assert report.served is None and report.parity is None and report.speedups == {}
    paths = write_report(report, tmp_path)
    assert set(paths.plots) == {PLOT_THROUGHPUT}
    assert load_report(paths.json) == report
    zero = _run("eagle3", {1: 50.0, 4: 160.0, 8: 240.0}, SpecStats(0, 0, 0, (0, 0, 0)))
    report = build_report("t", "d", [zero])  # no drafts at all: AL is NaN, written as null
    assert load_report(write_report(report, tmp_path / "z").json) == report


def test_summary_fits_one_screen():
    report = build_report("smollm2-135m-instruct", "d", RUNS, offline=OFFLINE, training=TRAINING)
    text = summary_text(report)
    assert "verdict: ok" in text
    assert "trained: AL 2.70  p_k [0.74, 0.55, 0.42] (held-out corpus answers, replayed)" in text
    assert "offline: AL 2.55" in text and "served : AL 2.50" in text
    assert "80.0 (1.60x)" in text and "55.0 (1.10x)" in text
    assert "1 + accepted/drafts" in text
    # What to serve at each load; at concurrency 8 n-gram only ties with no speculation.
    assert (
        "fastest: concurrency 1: eagle3 (80.0 tok/s, 1.45x ngram); concurrency 4: eagle3 (200.0 tok/s, 1.19x ngram); "
        "concurrency 8: no speculation (240.0 tok/s, 1.00x ngram)"
    ) in text
    assert "- concurrency 8: no speculation (240.0 tok/s, 1.00x ngram)" in to_markdown(report)
    assert len(text.splitlines()) <= 25 and max(len(line) for line in text.splitlines()) < 240


def test_other_ks_are_compared_and_the_fastest_named():
    def with_k(run: ServedRun, k: int) -> ServedRun:
        return dataclasses.replace(run, config={"speculative": {"method": run.label.split()[0], "num_speculative_tokens": k}})

    k2 = SpecStats(100, 200, 120, (70, 50))  # AL 2.2
    runs = [RUNS[0], with_k(RUNS[1], 3), with_k(_run("eagle3 k=2", {1: 88.0, 4: 190.0, 8: 230.0}, k2), 2), with_k(RUNS[2], 3)]
    report = build_report("smollm2-135m-instruct", "d", runs, offline=OFFLINE)
    assert report.served.al == 2.5  # parity and checks stay with eagle3, at its K
    assert report.speedups["eagle3 k=2"] == {1: 88.0 / 50.0, 4: 190.0 / 160.0, 8: 230.0 / 240.0}
    text = summary_text(report)
    assert text.splitlines()[0].endswith("(vllm, K=3)")
    # Steps per level: 512 tokens / tokens per chunk (the AL here) - 8 prefill chunks; n-gram: 50 drafts of 312.
    others = "eagle3 k=2 2.20 (p_k 0.70, 0.50; drafted at 44% of steps); ngram 1.60 (p_k 0.40, 0.14, 0.06; drafted at 16% of steps)"
    assert f"served AL of the other runs: {others}" in text
    assert "concurrency 1: eagle3 k=2 (88.0 tok/s, 1.10x eagle3)" in text
    assert "88.0 (1.76x)" in text and len(text.splitlines()) <= 25 and max(len(line) for line in text.splitlines()) < 240
    md = to_markdown(report)
    assert "- draft tokens per step (K): eagle3 3, eagle3 k=2 2, ngram 3; parity and checks at `eagle3`'s" in md
    assert "| 1 | eagle3 k=2 | 88.0 |" in md
    assert f"Other speculative runs, from the engine's counters: {others}." in md
    # The fastest K per level, as a schedule to serve by batch size: K=2 at 1, K=3 at 4, none at 8.
    assert (
        "K by batch size, fastest per load: 1:2,2-4:3,5-:0 (K 2 at batch size 1, 3 at batch sizes 2-4, 0 from 5 up; "
        "serve with --k-schedule 1:2,2-4:3,5-:0)"
    ) in text
    assert "### K to serve at each load" in md and "The fastest of K=2, K=3 at each concurrency" in md
    assert (
        '`--speculative-config \'{"method": "eagle3", "model": "d", "num_speculative_tokens": 3, '
        '"num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 4, 3], [5, 4096, 0]]}\'`'
    ) in md
    assert "`eagle-assets bench --drafter d --k-schedule 1:2,2-4:3,5-:0`" in md
    assert report.to_dict()["k_schedule"] == {
        "recommended": "1:2,2-4:3,5-:0",
        "confirmation": None,
        "speedups_by_k": {"3": {"1": 1.6, "4": 1.25, "8": 0.9}, "2": {"1": 88.0 / 50.0, "4": 190.0 / 160.0, "8": 230.0 / 240.0}},
    }


def test_a_run_served_by_batch_size_is_measured_and_the_advice_follows_the_fixed_k():
    def with_config(run: ServedRun, spec: dict) -> ServedRun:
        return dataclasses.replace(run, config={"speculative": spec})

    fixed = with_config(_run("eagle3", {1: 80.0, 4: 150.0, 8: 200.0}, EAGLE), {"method": "eagle3", "num_speculative_tokens": 3})
    scheduled = with_config(
        _run("eagle3 k=1:3,2-:0", {1: 79.0, 4: 158.0, 8: 236.0}, EAGLE),
        {"method": "eagle3", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 4096, 0]]},
    )
    report = build_report("smollm2-135m-instruct", "d", [RUNS[0], fixed, scheduled], offline=OFFLINE)
    assert report.speedups["eagle3 k=1:3,2-:0"][8] == 236.0 / 240.0
    md = to_markdown(report)
    assert "- draft tokens per step (K): eagle3 3, eagle3 k=1:3,2-:0 by batch size;" in md
    # Its speedups come from the fixed K alone; the schedule it recommends was served, so no command to confirm it.
    assert report.to_dict()["k_schedule"]["recommended"] == "1:3,2-:0" and "Serve it beside" not in md
    # Faster at every load: one K, no schedule.
    steady = with_config(_run("eagle3", {1: 80.0, 4: 170.0, 8: 250.0}, EAGLE), {"method": "eagle3", "num_speculative_tokens": 3})
    report = build_report("smollm2-135m-instruct", "d", [RUNS[0], steady], offline=OFFLINE)
    assert "K by batch size, fastest per load: K=3 at every load measured (no schedule needed)" in summary_text(report)
    assert (
        "K=3 served fastest at every concurrency measured, above no speculation: serve it at every batch size (`-k 3`), no schedule needed."
    ) in to_markdown(report)
    assert report.to_dict()["k_schedule"]["recommended"] == "1-:3"
    # No K above 1x anywhere: serve without the drafter.
    slow = with_config(_run("eagle3", {1: 49.0, 4: 150.0, 8: 200.0}, EAGLE), {"method": "eagle3", "num_speculative_tokens": 3})
    report = build_report("smollm2-135m-instruct", "d", [RUNS[0], slow], offline=OFFLINE)
    assert "K by batch size, fastest per load: none (no K beat no speculation): serve without the drafter" in summary_text(report)
    assert "No K measured (K=3) served faster than no speculation at any concurrency: serve without the drafter." in to_markdown(report)
    assert report.to_dict()["k_schedule"]["recommended"] is None


def _served_with(run: ServedRun, spec: dict | None) -> ServedRun:
    return dataclasses.replace(run, config={"speculative": spec})


SCHEDULE_SPEC = {"method": "eagle3", "num_speculative_tokens": 3, "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 4096, 0]]}
K3_SPEC = {"method": "eagle3", "num_speculative_tokens": 3}


def _confirming(scheduled: dict[int, float]) -> list[ServedRun]:
    """The runs that confirm `1-4:3,5-:0`: no speculation, K=3 and the schedule at these tokens/s."""
    return [
        _served_with(_run("baseline", {1: 50.0, 4: 160.0, 8: 240.0}), None),
        _served_with(_run("eagle3", {1: 78.0, 4: 196.0, 8: 220.0}, EAGLE), K3_SPEC),
        _served_with(_run("eagle3 k=1-4:3,5-:0", scheduled, EAGLE), SCHEDULE_SPEC),
    ]


def test_a_schedule_served_after_the_sweep_is_confirmed_where_it_keeps_up_with_the_fastest(tmp_path):
    sweep = [RUNS[0], _served_with(RUNS[1], K3_SPEC)]  # K=3: 1.6x, 1.25x, 0.9x -> 1-4:3,5-:0
    # At 1 and 4 it drafts 3 and serves within 5% of K=3 (77.0 / 78.0, 190.0 / 196.0); at 8 it
    # drafts none and serves at 0.97x of no speculation, within 5% of it too.
    report = build_report("smollm2-135m-instruct", "d", sweep, offline=OFFLINE, confirmation=_confirming({1: 77.0, 4: 190.0, 8: 233.0}))
    confirmation = report.to_dict()["k_schedule"]["confirmation"]
    assert report.to_dict()["k_schedule"]["recommended"] == "1-4:3,5-:0"
    assert confirmation["schedule"] == "1-4:3,5-:0" and confirmation["confirmed"] is True and confirmation["margin"] == 0.05
    assert [(lv["concurrency"], lv["k"], lv["fastest"], lv["confirmed"]) for lv in confirmation["levels"]] == [
        (1, 3, "eagle3", True),
        (4, 3, "eagle3", True),
        (8, 0, "no speculation", True),
    ]
    assert confirmation["levels"][2]["speedup"] == 233.0 / 240.0 and confirmation["levels"][0]["fastest_speedup"] == 78.0 / 50.0
    md = to_markdown(report)
    assert "### The recommended K schedule, served to confirm it" in md
    assert (
        "- `1-4:3,5-:0` served after the sweep, beside no speculation and the fixed K it uses, on the same prompts: "
        "confirmed: within 5% of the fastest at every level."
    ) in md
    assert "- concurrency 8: K 0, 0.97x against no speculation's 1.00x (confirmed)" in md
    assert "| concurrency | baseline | eagle3 | eagle3 k=1-4:3,5-:0 |" in md and "| 8 | 240.0 | 220.0 | 233.0 |" in md
    assert "Serve it beside" not in md and "At K 0 the drafter's first forward" not in md  # it was served, and kept up
    assert (
        "K schedule 1-4:3,5-:0 served after the sweep: confirmed; c=1 K3 1.54x (eagle3 1.56x); c=4 K3 1.19x (eagle3 1.23x); "
        "c=8 K0 0.97x (no speculation 1.00x)"
    ) in summary_text(report)
    # The sweep's own numbers are the sweep's: the confirming runs are apart from them.
    assert [r.label for r in report.runs] == ["baseline", "eagle3"] and report.speedups["eagle3"][1] == 1.6
    paths = write_report(report, tmp_path)
    assert load_report(paths.json).to_dict()["k_schedule"]["confirmation"] == confirmation


def test_a_schedule_slower_than_the_fastest_by_more_than_the_margin_is_not_confirmed():
    sweep = [RUNS[0], _served_with(RUNS[1], K3_SPEC)]
    # At 8, 0.94x of no speculation: drafting nothing still ran the drafter's first forward, and cost 6%.
    report = build_report("smollm2-135m-instruct", "d", sweep, confirmation=_confirming({1: 78.0, 4: 196.0, 8: 225.6}))
    confirmation = report.to_dict()["k_schedule"]["confirmation"]
    assert confirmation["confirmed"] is False and [lv["confirmed"] for lv in confirmation["levels"]] == [True, True, False]
    assert "not confirmed: slower than the fastest by more than 5% at some level" in to_markdown(report)
    assert "- concurrency 8: K 0, 0.94x against no speculation's 1.00x (NOT confirmed)" in to_markdown(report)
    assert "- At K 0 the drafter's first forward still runs over every new token" in to_markdown(report)
    assert "K schedule 1-4:3,5-:0 served after the sweep: NOT confirmed;" in summary_text(report)


def test_the_speedup_check_needs_a_speedup_strictly_above_the_threshold():
    even = [RUNS[0], _run("eagle3", {1: 50.0, 4: 160.0, 8: 240.0}, EAGLE)]
    check = speedup_check(even)
    assert not check.passed and check.metadata["speedup"] == 1.0
    assert check.description == ("eagle3 runs at 1.00x the baseline's output tokens/s at concurrency 1 (not above 1x)")
    # 60 / 50 is 1.2 exactly: at a threshold of 1.2 it fails, just below it passes.
    faster = [RUNS[0], _run("eagle3", {1: 60.0, 4: 160.0, 8: 240.0}, EAGLE)]
    assert speedup_check(faster, min_speedup=1.2).name == "speedup_above_1.2_at_concurrency_1"
    assert not speedup_check(faster, min_speedup=1.2).passed
    assert speedup_check(faster, min_speedup=1.19).passed


def test_a_level_within_exactly_the_margin_of_the_fastest_is_confirmed():
    import math

    from eagle_assets.bench.k_choice import SCHEDULE_MARGIN, LevelConfirmation

    assert SCHEDULE_MARGIN == 0.05 and 1.0 * (1 - SCHEDULE_MARGIN) == 0.95
    assert LevelConfirmation(8, 0, 0.95, "no speculation", 1.0).confirmed
    assert not LevelConfirmation(8, 0, math.nextafter(0.95, 0.0), "no speculation", 1.0).confirmed
    boundary = 1.7 * (1 - SCHEDULE_MARGIN)
    assert LevelConfirmation(1, 2, boundary, "eagle3", 1.7).confirmed
    assert not LevelConfirmation(1, 2, math.nextafter(boundary, 0.0), "eagle3", 1.7).confirmed


def test_a_schedule_with_two_ks_is_confirmed_against_the_fastest_of_every_fixed_k():
    from eagle_assets.bench.k_choice import confirm, confirmation_configs, confirmation_dict
    from eagle_assets.engines.k_schedule import KSchedule

    schedule = KSchedule.parse("1:2,2-4:3,5-:0")
    configs = confirmation_configs(schedule, 3, "d", baseline_again=True)
    # No speculation, each K above 0 it uses (K=2 by its own label, K=3 as the benchmark's `eagle3`), itself, no speculation again.
    assert configs == [
        ("baseline", None),
        ("eagle3 k=2", {"method": "eagle3", "model": "d", "num_speculative_tokens": 2}),
        ("eagle3", {"method": "eagle3", "model": "d", "num_speculative_tokens": 3}),
        (
            "eagle3 k=1:2,2-4:3,5-:0",
            {
                "method": "eagle3",
                "model": "d",
                "num_speculative_tokens": 3,
                "num_speculative_tokens_per_batch_size": [[1, 1, 2], [2, 4, 3], [5, 4096, 0]],
            },
        ),
        ("baseline (end)", None),
    ]
    assert [label for label, _ in confirmation_configs(schedule, 3, "d", baseline_again=False)] == [
        "baseline",
        "eagle3 k=2",
        "eagle3",
        "eagle3 k=1:2,2-4:3,5-:0",
    ]
    assert [label for label, _ in confirmation_configs(schedule, 2, "d", baseline_again=False)][1:3] == ["eagle3", "eagle3 k=3"]

    # Served as configured. At 1 the schedule drafts 2 but K=3 served fastest; at 4 it drafts 3 but
    # K=2 served fastest: each level's rival is the fastest of every fixed K, not the K it drafts.
    tokens_per_s = {
        "baseline": {1: 50.0, 4: 160.0, 8: 240.0},
        "eagle3 k=2": {1: 80.0, 4: 200.0, 8: 230.0},
        "eagle3": {1: 85.0, 4: 190.0, 8: 220.0},
        "eagle3 k=1:2,2-4:3,5-:0": {1: 82.0, 4: 188.0, 8: 236.0},
        "baseline (end)": {1: 50.0, 4: 160.0, 8: 240.0},
    }
    runs = [_served_with(_run(label, tokens_per_s[label], EAGLE if spec else None), spec) for label, spec in configs]
    confirmation = confirm(runs)
    assert confirmation.schedule == schedule
    assert [(lv.concurrency, lv.k, lv.speedup, lv.fastest, lv.fastest_speedup, lv.confirmed) for lv in confirmation.levels] == [
        (1, 2, 82.0 / 50.0, "eagle3", 85.0 / 50.0, True),  # 1.64x >= 0.95 * 1.70x
        (4, 3, 188.0 / 160.0, "eagle3 k=2", 200.0 / 160.0, False),  # 1.175x < 0.95 * 1.25x
        (8, 0, 236.0 / 240.0, "no speculation", 1.0, True),
    ]
    assert not confirmation.confirmed
    assert confirmation_dict(runs)["schedule"] == "1:2,2-4:3,5-:0" and confirmation_dict(runs)["confirmed"] is False


def test_the_written_summary_is_the_console_summary(tmp_path):
    report = build_report("smollm2-135m-instruct", "d", RUNS, offline=OFFLINE, training=TRAINING)
    paths = write_report(report, tmp_path)
    assert paths.summary == tmp_path / "summary.txt"
    assert paths.summary.read_text(encoding="utf-8") == summary_text(report) + "\n"
    # ... and what `eagle-assets show report` prints from the saved report (its folder or its report.json).
    assert summary_text(load_report(paths.json)) + "\n" == paths.summary.read_text(encoding="utf-8")
    for given in (tmp_path, paths.json):
        shown = CliRunner().invoke(app, ["show", "report", str(given)])
        assert shown.exit_code == 0 and shown.stdout == paths.summary.read_text(encoding="utf-8"), shown.output
