"""The served sweep retries what a retry cures, stops at once when its server is gone, keeps
every finished measurement on disk and resumes from them.

The servers here are real HTTP servers streaming chat completions as vLLM does (`sse_stub.py`),
which fail on cue; a real vLLM killed mid-benchmark is in test_bench_killed.py.
"""

from __future__ import annotations

import json
import time

import pytest

from eagle_assets.bench.interleaved import ServedTarget, run_interleaved
from eagle_assets.bench.progress import MEASUREMENTS, Measurements, OtherMeasurements
from eagle_assets.bench.served import ServerGone, SweepSettings, as_messages, run_level
from eagle_assets_tests.bench.sse_stub import StreamingServer

PROMPTS = [f"prompt {i}" for i in range(8)]
SETTINGS = SweepSettings(output_len=6, concurrencies=(1, 2), warmup_requests=1, progress=False, retry_backoff_s=0.05, metrics_settle_s=0.2)
FINGERPRINT = {"settings": {"output_len": 6, "concurrencies": [1, 2]}, "drafter_files": "abc"}


@pytest.fixture
def servers():
    started = []

    def start(**kw) -> StreamingServer:
        started.append(StreamingServer(**kw))
        return started[-1]

    yield start
    for s in started:
        s.close()


def test_a_request_that_fails_once_is_retried_and_counted(servers):
    stub = servers(fail={"prompt 1": "503", "prompt 2": "drop"})
    level = run_level(stub.url, "m", [as_messages(p) for p in PROMPTS[:4]], 2, SETTINGS)
    assert level.num_requests == 4 and level.output_tokens == 4 * 6  # every answer whole
    assert level.retried_requests == 2
    assert sorted(stub.chats) == sorted(["prompt 0", "prompt 1", "prompt 1", "prompt 2", "prompt 2", "prompt 3"])


def test_a_server_that_stops_answering_is_named_at_once_not_retried(servers):
    stub = servers(die_after=2)
    started = time.monotonic()
    with pytest.raises(ServerGone) as gone:
        run_level(stub.url, "m", [as_messages(p) for p in PROMPTS[:4]], 1, SETTINGS)
    assert time.monotonic() - started < 5
    message = str(gone.value)
    assert message.startswith(f"prompt 2 to {stub.url} failed (") and f"{stub.url}/health did not answer" in message
    assert message.endswith("the server is down") and gone.value.base_url == stub.url
    assert stub.chats == ["prompt 0", "prompt 1", "prompt 2"]  # the failed request was not sent again


def test_an_interleaved_sweep_keeps_each_round_and_resumes_on_a_server_started_again(servers, tmp_path):
    # Two configurations, 8 prompts in 4 rounds per level. The second one's server dies in the
    # third round of concurrency 1 (after its warm-up and 2 rounds of 2 prompts).
    base, doomed = servers(), servers(die_after=1 + 4)
    targets = [ServedTarget("baseline", base.url, "m"), ServedTarget("eagle3", doomed.url, "m", config={"k": 3})]
    kept = Measurements.open(tmp_path, FINGERPRINT, log=lambda m: None)
    with pytest.raises(ServerGone, match=doomed.url):
        run_interleaved(targets, PROMPTS, SETTINGS, rounds=4, progress=lambda m: None, kept=kept)
    files = sorted(p.name for p in kept.files())
    # Rounds 1-2 of both and round 3 of the baseline (served first in round 3) are kept.
    assert len(files) == 5 and sum("--c1--r3" in f for f in files) == 1 and not any("--c2" in f for f in files)
    saved = {p.name: json.loads(p.read_text()) for p in kept.files()}
    baseline_r1 = next(b for name, b in saved.items() if name.startswith("sweep--baseline-") and name.endswith("--c1--r1.json"))
    assert baseline_r1["prompts"] == [0, 4] and len(baseline_r1["requests"]) == 2 and baseline_r1["wall_s"] > 0

    # A rerun of the same benchmark on servers started again (new ports) serves only the rest.
    again = servers()
    logs = []
    resumed = Measurements.open(tmp_path, FINGERPRINT, log=logs.append)
    assert logs[0].startswith("resuming the benchmark begun ") and "5 finished measurement file(s) kept" in logs[0]
    base_before = len(base.chats)
    targets = [ServedTarget("baseline", base.url, "m"), ServedTarget("eagle3", again.url, "m", config={"k": 3})]
    runs = run_interleaved(targets, PROMPTS, SETTINGS, rounds=4, progress=lambda m: None, kept=resumed)
    # Warm-up, round 4 of concurrency 1, then all of concurrency 2 (8 prompts in 4 rounds of 2).
    assert len(base.chats) - base_before == 1 + 2 + 8
    assert len(again.chats) == 1 + 4 + 8  # its rounds 3 and 4 of concurrency 1 too
    assert resumed.kept == 5
    for run in runs:
        for level in run.levels:
            assert level.num_requests == 8 and level.output_tokens == 8 * 6
            assert len(level.round_tokens_per_s) == 4
            assert level.wall_s == pytest.approx(sum(2 * 6 / x for x in level.round_tokens_per_s))
    assert runs[1].base_url == again.url and runs[1].config == {"k": 3}
    # Every round of both levels is on disk now: a third run serves nothing, not even a warm-up.
    third = Measurements.open(tmp_path, FINGERPRINT, log=lambda m: None)
    asked = len(base.chats) + len(again.chats)
    gone_targets = [ServedTarget("baseline", None, None), ServedTarget("eagle3", None, None, config={"k": 3})]
    replayed = run_interleaved(gone_targets, PROMPTS, SETTINGS, rounds=4, progress=lambda m: None, kept=third)
    assert len(base.chats) + len(again.chats) == asked
    assert [r.levels for r in replayed] == [r.levels for r in runs]
    assert replayed[1].base_url == again.url and replayed[1].model == "m"


def test_measurements_resume_only_the_same_unfinished_benchmark(tmp_path):
    folder = tmp_path / MEASUREMENTS
    first = Measurements.open(tmp_path, FINGERPRINT, log=lambda m: None)
    (folder / "sweep--x--c1.json").write_text("{}")
    other = {**FINGERPRINT, "settings": {"output_len": 12, "concurrencies": [1, 2]}}
    # The command line refuses other settings, saying which differ and what to do.
    with pytest.raises(OtherMeasurements) as refused:
        Measurements.open(tmp_path, other, on_other="refuse", log=lambda m: None)
    assert "holds the measurements of an unfinished benchmark with other settings (settings.output_len 6 there, 12 now)" in str(refused.value)
    assert "--overwrite to discard them" in str(refused.value)
    assert (folder / "sweep--x--c1.json").exists()  # a refusal discards nothing
    # The same settings resume; --overwrite (fresh) and the asset's "replace" start afresh.
    assert Measurements.open(tmp_path, FINGERPRINT, on_other="refuse", log=lambda m: None).state["started"] == first.state["started"]
    assert (folder / "sweep--x--c1.json").exists()
    lines = []
    Measurements.open(tmp_path, other, on_other="replace", log=lines.append)
    assert lines == [f"discarding the measurements in {folder} (of other settings): measuring afresh"]
    assert not (folder / "sweep--x--c1.json").exists()
    (folder / "sweep--x--c1.json").write_text("{}")
    Measurements.open(tmp_path, other, fresh=True, log=lines.append)
    assert lines[-1].endswith("(as asked): measuring afresh") and not (folder / "sweep--x--c1.json").exists()
    # A finished benchmark is measured anew, whatever its settings.
    finished = Measurements.open(tmp_path, other, log=lambda m: None)
    (folder / "sweep--x--c1.json").write_text("{}")
    finished.finish()
    Measurements.open(tmp_path, other, on_other="refuse", log=lines.append)
    assert lines[-1].endswith("(of a finished benchmark): measuring afresh") and not (folder / "sweep--x--c1.json").exists()


def test_a_benchmark_measured_one_server_at_a_time_keeps_the_first_part_and_serves_only_the_rest(servers, tmp_path):
    """Where one host holds one target server: the first part has the target alone only (the
    configuration with the drafter has no server and is left, named), the second the drafter's
    server only (the baseline is read back, not served: no server for it is asked for)."""
    from contextlib import contextmanager

    from eagle_assets.bench.benchmark import ServerUnavailable, _serve_all
    from eagle_assets.engines.serving import InferenceServer

    configs = [("baseline", None), ("eagle3", {"method": "eagle3", "num_speculative_tokens": 3})]
    prompts = [as_messages(p) for p in PROMPTS]

    def serving(given: dict):
        @contextmanager
        def serve(spec, replica=0):
            kind = "eagle3" if spec else "baseline"
            if kind not in given:
                raise ServerUnavailable(f"no server of {kind} is given")
            yield InferenceServer(given[kind].url, "m")

        return serve

    plain = servers()
    first = Measurements.open(tmp_path, FINGERPRINT, log=lambda m: None)
    missing: list[str] = []
    runs = _serve_all(configs, serving({"baseline": plain}), prompts, SETTINGS, 0, lambda m: None, first, "sweep", missing=missing)
    assert missing == ["eagle3"] and [r.label for r in runs] == ["baseline"]
    asked = len(plain.chats)

    drafter = servers()
    second = Measurements.open(tmp_path, FINGERPRINT, log=lambda m: None)
    missing = []
    runs = _serve_all(configs, serving({"eagle3": drafter}), prompts, SETTINGS, 0, lambda m: None, second, "sweep", missing=missing)
    assert missing == [] and [r.label for r in runs] == ["baseline", "eagle3"]
    assert len(plain.chats) == asked and len(drafter.chats) == 1 + 2 * len(PROMPTS)  # its warm-up and both levels
    assert runs[0].levels == tuple(level for level, _ in (first.level("sweep", "baseline", c) for c in (1, 2)))
    with pytest.raises(ServerUnavailable):  # without `missing`, a configuration with no server stands as the error
        _serve_all(configs, serving({}), prompts, SETTINGS, 0, lambda m: None, Measurements.open(tmp_path / "x", FINGERPRINT), "sweep")
