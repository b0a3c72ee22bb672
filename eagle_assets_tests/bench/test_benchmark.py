"""What one benchmark serves: its configurations, in order, and the K settings it refuses."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle_assets.bench import benchmark
from eagle_assets.bench.benchmark import DEFAULT_INTERLEAVE_ROUNDS, benchmark_k, interleaving, served_configs
from eagle_assets.bench.progress import Measurements
from eagle_assets.bench.served import SweepSettings
from eagle_assets.bench.settings import BenchmarkSettings
from eagle_assets.engines.k_schedule import KSchedule
from eagle_assets.engines.vllm_launch import speculative_config
from eagle_assets_tests.bench.test_report import _run, _served_with

DRAFTER = Path("/drafters/smollm2/drafter-vllm")


def test_k_is_the_one_asked_else_the_one_trained_else_the_targets():
    trained = {"ttt_steps": 5, "drafter_config": {"hidden_size": 576}}  # a trainer's summary.json
    assert benchmark_k(2, trained, 3) == 2
    assert benchmark_k(None, trained, 3) == 5
    assert benchmark_k(None, {}, 3) == 3  # a bare export: no summary beside it


def test_every_k_is_served_with_the_same_drafter_and_ngram_at_the_main_k():
    configs = served_configs(BenchmarkSettings(k=3, also_k=(2, 4)), DRAFTER)
    assert [label for label, _ in configs] == ["baseline", "eagle3", "eagle3 k=2", "eagle3 k=4", "ngram", "baseline (end)"]
    specs = dict(configs)
    assert specs["baseline"] is None and specs["baseline (end)"] is None
    for label, k in (("eagle3", 3), ("eagle3 k=2", 2), ("eagle3 k=4", 4)):
        assert specs[label] == {"method": "eagle3", "model": str(DRAFTER), "num_speculative_tokens": k}
    assert specs["ngram"]["method"] == "ngram" and specs["ngram"]["num_speculative_tokens"] == 3
    once = BenchmarkSettings(k=2, ngram=False, baseline_again=False)
    assert [label for label, _ in served_configs(once, DRAFTER)] == ["baseline", "eagle3"]
    # Interleaved, every configuration meets the same host: no speculation is not served again.
    interleaved = BenchmarkSettings(k=3, interleave_rounds=5)
    assert [label for label, _ in served_configs(interleaved, DRAFTER)] == ["baseline", "eagle3", "ngram"]


def test_a_k_schedule_is_served_as_one_more_configuration_of_the_same_drafter():
    schedule = KSchedule.parse("1-2:4,3-:0")
    configs = served_configs(BenchmarkSettings(k=3, k_schedule=schedule), DRAFTER)
    assert [label for label, _ in configs] == ["baseline", "eagle3", "eagle3 k=1-2:4,3-:0", "ngram", "baseline (end)"]
    assert dict(configs)["eagle3 k=1-2:4,3-:0"] == {
        "method": "eagle3",
        "model": str(DRAFTER),
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 2, 4], [3, 4096, 0]],
    }


@pytest.mark.parametrize(
    ("k", "also_k", "message"),
    [
        (3, (2, 3), "repeat a K"),
        (3, (2, 2), "repeat a K"),
        (0, (), "at least 1"),
        (3, (0,), "at least 1"),
    ],
)
def test_settings_refuse_a_k_that_cannot_be_served_or_is_given_twice(k, also_k, message):
    with pytest.raises(ValueError, match=message):
        BenchmarkSettings(k=k, also_k=also_k)


def test_by_default_the_configurations_are_interleaved_where_their_servers_fit_at_once():
    asked = []

    def fits(specs):
        asked.append(specs)
        return None

    settings, note = interleaving(BenchmarkSettings(k=3), DRAFTER, fits)
    assert settings.interleave_rounds == DEFAULT_INTERLEAVE_ROUNDS == 10
    assert "interleaved" in note and "the default where every server fits at once" in note
    # Asked about the servers an interleaved run holds: no baseline served again at the end.
    assert [None if s is None else s["method"] for s in asked[0]] == [None, "eagle3", "ngram"]
    assert [label for label, _ in served_configs(settings, DRAFTER)] == ["baseline", "eagle3", "ngram"]


def test_servers_that_do_not_fit_at_once_are_served_one_after_another_and_the_report_says_why():
    why = "3 more servers at once need ~12.0 GiB with headroom, and 6.0 GiB is available"
    settings, note = interleaving(BenchmarkSettings(k=3), DRAFTER, lambda specs: why)
    assert settings.interleave_rounds == 0
    assert note == (
        "configurations served one after another, not interleaved: " + why + "; the baseline is served again at the end, to measure the host's drift"
    )
    assert served_configs(settings, DRAFTER)[-1][0] == "baseline (end)"


def test_rounds_asked_for_are_kept_without_asking_the_host():
    def refuse(specs):
        raise AssertionError("asked about memory although the rounds were given")

    one_by_one, note = interleaving(BenchmarkSettings(k=3, interleave_rounds=0), DRAFTER, refuse)
    assert one_by_one.interleave_rounds == 0 and note is None
    three, note = interleaving(BenchmarkSettings(k=3, interleave_rounds=3), DRAFTER, refuse)
    assert three.interleave_rounds == 3 and "up to 3 rounds" in note and "default" not in note
    # Nothing known against it (a caller that cannot tell): interleaved.
    assert interleaving(BenchmarkSettings(k=3), DRAFTER, None)[0].interleave_rounds == DEFAULT_INTERLEAVE_ROUNDS


def test_an_aa_control_is_a_second_server_without_speculation_served_interleaved(monkeypatch, tmp_path):
    settings = BenchmarkSettings(k=3, control=True, interleave_rounds=5)
    configs = served_configs(settings, DRAFTER)
    assert [label for label, _ in configs] == ["baseline", "baseline (control)", "eagle3", "ngram"]
    # Each gets a server of its own: the control asks for a further one of no speculation. What
    # is checked is which servers are asked for, so `serve` records the asks and the sweep is
    # left out; four real vLLM servers would take minutes to say the same (real interleaved
    # sweeps: test_served.py, test_pipeline_e2e.py; the resource's replicas: test_inference_server.py).
    asked = []

    @contextlib.contextmanager
    def serve(spec, replica=0):
        asked.append((None if spec is None else spec["method"], replica))
        yield SimpleNamespace(base_url=f"http://{len(asked)}", model="m", api_key=None)

    monkeypatch.setattr(benchmark, "run_interleaved", lambda targets, *a, **k: [t.base_url for t in targets])
    kept = Measurements.open(tmp_path, {}, log=lambda m: None)
    served = benchmark._serve_interleaved(
        configs, serve, ["p"] * 8, SweepSettings(output_len=8, concurrencies=(1,)), 5, lambda m: None, kept, "sweep"
    )
    assert asked == [(None, 0), (None, 1), ("eagle3", 0), ("ngram", 0)] and served == [f"http://{i}" for i in range(1, 5)]
    # The memory asked about counts two servers without speculation.
    specs = []
    interleaving(BenchmarkSettings(k=3, control=True), DRAFTER, lambda s: specs.append(s))
    assert specs[0][:2] == [None, None] and len(specs[0]) == 4
    # Where they do not fit, the control is left out and the report says so.
    short, note = interleaving(BenchmarkSettings(k=3, control=True), DRAFTER, lambda s: "short of memory")
    assert [label for label, _ in served_configs(short, DRAFTER)] == ["baseline", "eagle3", "ngram", "baseline (end)"]
    assert note.endswith("; the A/A control, which needs interleaving, was not served")
    with pytest.raises(ValueError, match=r"control=True serves a second server .* \(baseline_again\)"):
        BenchmarkSettings(control=True, interleave_rounds=0)


def test_the_recommended_schedule_is_served_after_the_sweep_beside_no_speculation_and_its_fixed_k(monkeypatch, tmp_path):
    # The sweep: K=3 above no speculation at 1 and 4, below it at 8; K=2 slower everywhere.
    k3, k2 = speculative_config(DRAFTER, 3), speculative_config(DRAFTER, 2)
    sweep = [
        _served_with(_run("baseline", {1: 50.0, 4: 160.0, 8: 240.0}), None),
        _served_with(_run("eagle3", {1: 80.0, 4: 200.0, 8: 216.0}), k3),
        _served_with(_run("eagle3 k=2", {1: 70.0, 4: 170.0, 8: 230.0}), k2),
    ]
    asked = []

    @contextlib.contextmanager
    def serve(spec, replica=0):
        asked.append(spec)
        yield SimpleNamespace(base_url=f"http://{len(asked)}", model="m", api_key=None)

    # What is checked is which servers are asked for, in which way, so `serve` records the asks
    # and the sweeps are left out: three compiled vLLM servers and their sweeps would take ~15
    # minutes of the suite to say the same (real sweeps: test_served.py, test_interleaved.py; a
    # real schedule served: engines/test_serving.py; the confirmation measured: benchmarks/results/k_schedule_*).
    monkeypatch.setattr(benchmark, "run_interleaved", lambda targets, prompts, sweep, rounds, progress, **kept: [(t.label, rounds) for t in targets])
    monkeypatch.setattr(benchmark, "run_served", lambda label, *a, **k: _run(label, {1: 1.0, 4: 1.0, 8: 1.0}))
    prompts, levels = ["p"] * 8, SweepSettings(output_len=8, concurrencies=(1, 4, 8))
    settings = BenchmarkSettings(k=3, also_k=(2,), interleave_rounds=4, confirm_schedule=True)
    kept = Measurements.open(tmp_path, {}, log=lambda m: None)
    runs, note = benchmark._confirm_schedule(sweep, settings, DRAFTER, serve, prompts, levels, lambda m: None, kept)
    schedule = KSchedule.parse("1-4:3,5-:0")
    assert note is None and runs == [("baseline", 4), ("eagle3", 4), ("eagle3 k=1-4:3,5-:0", 4)]
    assert asked == [None, k3, speculative_config(DRAFTER, 3, schedule)]
    # Served one after another, as the sweep was: no speculation again at the end, for the drift.
    runs, _ = benchmark._confirm_schedule(sweep, replace(settings, interleave_rounds=0), DRAFTER, serve, prompts, levels, lambda m: None, kept)
    assert [r.label for r in runs] == ["baseline", "eagle3", "eagle3 k=1-4:3,5-:0", "baseline (end)"]
    # Nothing to confirm: one K fastest everywhere, or none above no speculation; or served already.
    steady = [sweep[0], _served_with(_run("eagle3", {1: 80.0, 4: 200.0, 8: 250.0}), k3)]
    assert benchmark._confirm_schedule(steady, settings, DRAFTER, serve, prompts, levels, print, kept) == (
        [],
        "confirm_schedule: no schedule to confirm (K=3 served fastest at every load)",
    )
    slow = [sweep[0], _served_with(_run("eagle3", {1: 40.0, 4: 150.0, 8: 200.0}), k3)]
    assert benchmark._confirm_schedule(slow, settings, DRAFTER, serve, prompts, levels, print, kept) == (
        [],
        "confirm_schedule: no schedule to confirm (no K beat no speculation)",
    )
    served = [*sweep, _served_with(_run("eagle3 k=1-4:3,5-:0", {1: 80.0, 4: 200.0, 8: 236.0}), speculative_config(DRAFTER, 3, schedule))]
    assert benchmark._confirm_schedule(served, settings, DRAFTER, serve, prompts, levels, print, kept) == (
        [],
        "confirm_schedule: the recommended schedule 1-4:3,5-:0 was served in the sweep itself",
    )
    assert len(asked) == 7  # none of these started a server


def test_settings_refuse_negative_rounds():
    with pytest.raises(ValueError, match="interleave_rounds=-1: give 0"):
        BenchmarkSettings(interleave_rounds=-1)


def test_settings_refuse_fewer_prompts_than_a_level_keeps_in_flight():
    with pytest.raises(ValueError, match=r"num_prompts=4 cannot keep 8 requests in flight \(concurrencies \[1, 4, 8\]\): give at least 8 prompts"):
        BenchmarkSettings(num_prompts=4, concurrencies=(1, 4, 8))
    assert BenchmarkSettings(num_prompts=8, concurrencies=(1, 4, 8)).num_prompts == 8


def test_the_bench_command_and_the_benchmark_asset_default_to_the_benchmarks_own_settings():
    """Each default is BenchmarkSettings' (bench/settings.py): `eagle-assets bench` with no option
    and the benchmark_report asset with no setting measure what the benchmark measures by default."""
    import typer.main

    from eagle_assets.bench.settings import default
    from eagle_assets.cli import app
    from eagle_assets.defs.benchmark import BenchmarkConfig, BenchmarkReferenceConfig

    command = typer.main.get_command(app).commands["bench"]
    cli = {p.name: p.default for p in command.params}
    asset, reference = BenchmarkConfig(), BenchmarkReferenceConfig()
    # setting: (the CLI's option, the asset's field); None where that side has no such setting
    names = {
        "num_prompts": ("num_prompts", "num_prompts"),
        "output_len": ("output_len", "output_len"),
        "concurrencies": ("concurrency", "concurrencies"),
        "ngram": ("ngram", "ngram"),
        "baseline_again": ("baseline_again", "baseline_again"),
        "interleave_rounds": ("interleave", "interleave_rounds"),
        "control": ("control", "control"),
        "confirm_schedule": ("confirm_schedule", "confirm_schedule"),
        "offline_reference": ("offline_reference", "offline_reference"),
        "request_timeout_s": ("stall_timeout", None),
        "greedy_check": (None, "greedy_check"),
    }
    norm = lambda v: tuple(v) if isinstance(v, list) else v  # noqa: E731
    for setting, (option, field) in names.items():
        expected = norm(default(setting))
        if option:
            assert norm(cli[option]) == expected, (setting, option)
        if field:
            assert norm(getattr(asset, field)) == expected, (setting, field)
    assert asset.al_tolerance == default("tolerance").al_rel
    assert (reference.num_prompts, reference.output_len, reference.offline_reference) == (
        asset.num_prompts,
        asset.output_len,
        asset.offline_reference,
    )
