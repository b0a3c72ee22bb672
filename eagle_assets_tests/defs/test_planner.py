"""The budget planner: the seeds' Kimi-K2.5 run is reproduced, rates scale, bad input is named."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from eagle_assets.cli import app
from eagle_assets.hidden_states.budget import plan
from eagle_assets.planner import KIMI_DRAFTER_TRAIN_TOK_S_PER_GPU, KIMI_FORWARD_TOK_S_PER_GPU, TARGET_LOADS, Throughputs, estimate

SEEDS = dict(samples=10_000, tokens_per_sample=1_450, num_aux=3)
"""The seeds' run: their states at three layers (the planner's default for Kimi keeps both
readings of the parent's layers: `test_the_parents_both_readings_and_the_loads_are_planned`)."""


def test_seeds_run_lands_on_their_828_gb_and_the_measured_rates():
    e = estimate("kimi-k2.5", **SEEDS)
    assert e.sizes.hidden_state_bytes == pytest.approx(828e9, rel=0.05)
    # The very arithmetic the hidden-state asset's free-space check uses.
    assert e.sizes == plan("kimi-k2.5", **SEEDS)
    assert e.gpus == 8 and e.replicas == 1 and e.extraction == "engine"  # Kimi's tensor-parallel size
    assert e.generation_hours == pytest.approx(5.3, rel=1e-9)  # seeds: 10,000 samples in 5.3 h
    # Extraction: the per-GPU forward measured at Kimi's shape, times the replica's 8 GPUs.
    assert e.extraction_hours == pytest.approx(14_500_000 / (KIMI_FORWARD_TOK_S_PER_GPU * 8) / 3600, rel=1e-9)
    assert e.training_hours == pytest.approx(5 * 0.9 * 14_500_000 / (KIMI_DRAFTER_TRAIN_TOK_S_PER_GPU * 8) / 3600, rel=1e-9)
    assert [n.split(":")[0] for n in e.notes] == ["generation", "extraction (engine)", "training"]
    assert "not measured here" in e.notes[0]


def test_the_parents_both_readings_and_the_loads_are_planned():
    """The kimi-k2.5 run warm-starts from a parent whose ids carry no numbering: its states are kept
    at both readings' layers (6 aux) until training measures which one it was trained at. Its run
    loads the target three times, one server at a time, at the seeds' host's 22 minutes each; the
    run the page described before needed four loads, two of them at once."""
    e = estimate("kimi-k2.5", samples=10_000, tokens_per_sample=1_450)
    assert e.sizes.num_aux == 6 and e.sizes.bytes_per_token == 100_357
    assert "AQ-MedAI/Kimi-K25-eagle3" in e.notes[-1] and "both readings" in e.notes[-1]
    assert e.target_loads == len(TARGET_LOADS) == 3 and e.load_minutes == 22.0
    assert e.load_hours == pytest.approx(3 * 22 / 60)
    assert e.total_hours == pytest.approx(e.generation_hours + e.extraction_hours + e.training_hours + e.load_hours)
    assert any(line.startswith("loads:        1.10 h for 3 target loads of 22 min, one server at a time") for line in e.lines())
    other = estimate("smollm2-135m-instruct", samples=48, tokens_per_sample=300)
    assert other.load_minutes is None and other.load_hours == 0 and other.sizes.num_aux == 3
    assert any("pass --load-minutes" in line for line in other.lines())
    assert estimate("kimi-k2.5", **SEEDS, load_minutes=10).load_hours == pytest.approx(0.5)


def test_hf_extraction_has_one_gpu_busy_and_says_the_weights_do_not_fit():
    e = estimate("kimi-k2.5", **SEEDS, extraction="hf")
    assert e.throughputs.extraction_tokens_per_s == KIMI_FORWARD_TOK_S_PER_GPU
    assert "do not fit one host" in e.notes[1]


def test_hours_scale_with_work_gpus_and_replicas():
    base = estimate("kimi-k2.5", **SEEDS)
    double = estimate("kimi-k2.5", samples=20_000, tokens_per_sample=1_450, gpus=4, epochs=10)
    assert double.generation_hours == pytest.approx(2 * base.generation_hours)
    assert double.extraction_hours == pytest.approx(2 * base.extraction_hours)
    assert double.training_hours == pytest.approx(8 * base.training_hours)  # 2x data, 2x epochs, half the GPUs
    four = estimate("kimi-k2.5", samples=40_000, tokens_per_sample=1_450, replicas=4)
    assert four.gpus == 32  # the four replicas' hosts train
    for hours in ("generation_hours", "extraction_hours", "training_hours"):
        assert getattr(four, hours) == pytest.approx(getattr(base, hours))  # 4x the work on 4x the hardware
    faster = estimate("kimi-k2.5", **SEEDS, throughputs=Throughputs(extraction_tokens_per_s=2 * 3_165))
    assert faster.extraction_hours == pytest.approx(14_500_000 / (2 * 3_165) / 3600)
    # A given rate replaces its note; the other two still say where theirs come from.
    assert [n.split(":")[0] for n in faster.notes] == ["generation", "training"]


def test_other_targets_warn_that_the_rates_are_kimis():
    e = estimate("smollm2-135m-instruct", samples=48, tokens_per_sample=300)
    assert e.gpus == 1 and e.sizes.hidden_size == 576 and e.extraction == "hf"
    assert "reference Kimi-K2.5 run's" in e.notes[0] and "not smollm2-135m-instruct's" in e.notes[0]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(samples=0, tokens_per_sample=10), "samples must be at least 1, not 0"),
        (dict(samples=1, tokens_per_sample=10, val_fraction=1.0), r"validation fraction must be in \[0, 1\), not 1.0"),
        (
            dict(samples=1, tokens_per_sample=10, throughputs=Throughputs(generation_tokens_per_s=0)),
            "generation_tokens_per_s must be a positive finite",
        ),
        (
            dict(samples=1, tokens_per_sample=10, throughputs=Throughputs(train_tokens_per_gpu_s=float("inf"))),
            "train_tokens_per_gpu_s must be a positive finite number, not inf",
        ),
        (dict(samples=1, tokens_per_sample=10, replicas=0), "replicas must be at least 1, not 0"),
        (dict(samples=1, tokens_per_sample=10, extraction="gpu"), "extraction must be one of engine, hf, not 'gpu'"),
    ],
)
def test_bad_input_is_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        estimate("kimi-k2.5", **kwargs)


def test_cli_prints_sizes_and_hours_and_takes_measured_rates():
    runner = CliRunner()
    out = runner.invoke(app, ["plan", "--preset", "kimi-k2.5", "--samples", "10000", "--tokens-per-sample", "1450", "--num-aux", "3"])
    assert out.exit_code == 0, out.output
    assert "831.6 GB" in out.output and "5.30 h" in out.output and "(engine)" in out.output
    assert "3 target loads of 22 min" in out.output and "total:        6.75 h" in out.output
    assert "note: generation: the reference run's 760 corpus tok/s" in out.output

    out = runner.invoke(
        app, ["plan", "--preset", "kimi-k2.5", "--samples", "40000", "--tokens-per-sample", "1450", "--replicas", "4", "--extraction", "hf", "--json"]
    )
    body = json.loads(out.output)
    assert body["replicas"] == 4 and body["gpus"] == 32 and body["extraction"] == "hf"
    assert body["generation_hours"] == pytest.approx(5.3)

    out = runner.invoke(
        app,
        [
            "plan",
            "--preset",
            "kimi-k2.5",
            "--samples",
            "10000",
            "--tokens-per-sample",
            "1450",
            "--extraction-tok-s",
            "6330",
            "--num-aux",
            "3",
            "--json",
        ],
    )
    body = json.loads(out.output)
    assert body["extraction_hours"] == pytest.approx(14_500_000 / 6_330 / 3600)
    assert body["sizes"]["hidden_state_bytes"] == plan("kimi-k2.5", **SEEDS).hidden_state_bytes

    out = runner.invoke(app, ["plan", "--preset", "kimi", "--samples", "1", "--tokens-per-sample", "1"])
    assert out.exit_code == 1 and "unknown target preset 'kimi'" in out.output


def test_bench_refuses_a_folder_that_is_not_a_drafter_export_before_any_server(tmp_path):
    result = CliRunner().invoke(app, ["bench", "--drafter", str(tmp_path)])
    assert result.exit_code == 1
    assert "no config.json" in result.output and "drafter-vllm" in result.output


def test_bench_refuses_a_repeated_k_or_too_few_prompts_before_any_server(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = CliRunner().invoke(app, ["bench", "--drafter", str(tmp_path), "-k", "3", "--also-k", "2", "--also-k", "3"])
    assert result.exit_code == 1
    assert "-k 3 and --also-k [2, 3] repeat a K: give each K once" in result.output
    result = CliRunner().invoke(app, ["bench", "--drafter", str(tmp_path), "--num-prompts", "4"])
    assert result.exit_code == 1 and "--num-prompts 4 cannot keep 8 requests in flight" in result.output


def test_a_bad_k_schedule_is_refused_before_any_server(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    result = CliRunner().invoke(app, ["bench", "--drafter", str(tmp_path), "--k-schedule", "2-:3"])
    assert result.exit_code == 1 and "K schedule '2-:3': the range 2- starts at 2, not 1" in result.output
    result = CliRunner().invoke(app, ["serve", "--drafter", str(tmp_path), "--k-schedule", "1-2:3;3-:0"])
    assert result.exit_code == 1 and "cannot read '1-2:3;3-:0'" in result.output and "e.g. 1-2:3,3-:0" in result.output
    result = CliRunner().invoke(app, ["serve", "--k-schedule", "1:3,2-:0"])
    assert result.exit_code == 1 and "--k-schedule says how many tokens the drafter drafts: give --drafter too" in result.output
