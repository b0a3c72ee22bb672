"""The served sweep against the real vLLM CPU server (SmolLM2 with n-gram speculation).

One server per test session (`ngram_server`), on ports 8150-8199, started through the project's
own launcher; the spec-decode counters of `metrics.py` are checked on it here too. Tests without
the engine check the sweep's input validation.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from eagle_assets.bench.checks import pooled_spec_stats, round_speedups
from eagle_assets.bench.interleaved import ServedTarget, run_interleaved
from eagle_assets.bench.metrics import ACCEPTED_PER_POS, parse_prometheus, scrape, spec_stats_between
from eagle_assets.bench.served import (
    ServedRun,
    SweepSettings,
    as_messages,
    mt_bench_categories,
    mt_bench_prompts,
    run_level,
    run_served,
)
from eagle_assets.targets import EMBEDDED_TARGET

MODEL = "smollm2-135m-instruct"
K = 3
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
# Repetitive prompts: the answer copies the prompt, so prompt-lookup drafts find matches.
PROMPTS = [
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    "Copy this list: red, green, blue, red, green, blue, red, green, blue, red, green, blue.",
]


def _free_port(lo: int = 8150, hi: int = 8199) -> int:
    """A free port in the range this folder's servers use (other test folders use others)."""
    for port in range(lo, hi + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


@pytest.fixture(scope="session")
def ngram_server(smollm2_path, engine_python) -> str:
    """Base URL of the real SmolLM2 vLLM server with n-gram speculation (K=3), one per session."""
    from eagle_assets.engines.serving import launch_vllm
    from eagle_assets.engines.vllm_launch import ngram_config

    spec = ngram_config(K)
    assert json.dumps(spec, separators=(",", ":")) == NGRAM
    with launch_vllm(EMBEDDED_TARGET, speculative=spec, port=_free_port(), log=lambda m: None) as server:
        assert server.model == MODEL
        yield server.base_url


# -- With the engine -------------------------------------------------------------------------


@pytest.mark.engine
def test_sweep_measures_every_level_with_exact_token_counts(ngram_server):
    settings = SweepSettings(output_len=16, concurrencies=(1, 2), warmup_requests=1, progress=False)
    run = run_served("ngram", ngram_server, MODEL, PROMPTS, settings, config={"speculative_config": NGRAM})

    assert [lv.concurrency for lv in run.levels] == [1, 2]
    for lv in run.levels:
        assert lv.num_requests == 2
        assert lv.output_tokens == 2 * 16  # every request emitted exactly output_len tokens
        assert lv.wall_s > 0
        assert lv.tokens_per_s == pytest.approx(lv.output_tokens / lv.wall_s)
        assert lv.requests_per_s == pytest.approx(2 / lv.wall_s)
        assert 0 < lv.ttft_s["p50"] <= lv.ttft_s["p90"] < lv.wall_s
        assert 0 < lv.itl_s["p50"] <= lv.itl_s["p90"]
        # A request's time is TTFT plus its 15 token gaps: ITL cannot exceed the level's wall time / 15.
        assert lv.itl_s["mean"] * 15 < lv.wall_s
        assert 1.0 <= lv.tokens_per_chunk <= K + 1
        assert lv.spec is not None and len(lv.spec.accepted_per_pos) == K

    pooled = pooled_spec_stats(run)
    assert pooled.drafts > 0, "copying prompts must give prompt-lookup drafts"
    # The answers copy the prompts, so the prompt-lookup drafts are accepted (the server reads an
    # AL near 2.9 on these prompts).
    assert pooled.accepted > 0, "copying prompts must get prompt-lookup drafts accepted"
    assert 1.0 < pooled.al <= K + 1
    # Speculation streams accepted runs as one chunk: more tokens per chunk than one.
    assert max(lv.tokens_per_chunk for lv in run.levels) > 1.0

    again = ServedRun.from_dict(run.to_dict())
    assert again == run


@pytest.mark.engine
def test_two_configurations_served_interleaved_keep_their_own_requests_and_counters(vllm_server, ngram_server):
    # The session's plain server and the n-gram one, up together: 4 prompts in 2 rounds per level.
    settings = SweepSettings(output_len=16, concurrencies=(1, 2), warmup_requests=1, progress=False)
    targets = [
        ServedTarget("baseline", vllm_server.base_url, MODEL),
        ServedTarget("ngram", ngram_server, MODEL, config={"speculative_config": NGRAM}),
    ]
    lines = []
    base, ngram = run_interleaved(targets, PROMPTS * 2, settings, rounds=2, progress=lines.append)

    assert (base.label, ngram.label) == ("baseline", "ngram") and ngram.config == {"speculative_config": NGRAM}
    for run in (base, ngram):
        assert [lv.concurrency for lv in run.levels] == [1, 2]
        for lv in run.levels:
            assert lv.num_requests == 4 and lv.output_tokens == 4 * 16
            assert len(lv.round_tokens_per_s) == 2
            # The level's time is its two rounds' (2 prompts x 16 tokens each), nothing between them.
            assert lv.wall_s == pytest.approx(sum(2 * 16 / x for x in lv.round_tokens_per_s))
            assert lv.tokens_per_s == pytest.approx(lv.output_tokens / lv.wall_s)
    assert all(lv.spec is None for lv in base.levels)  # the plain server exports no spec counters
    for lv in ngram.levels:
        # The n-gram server's counters moved for its own 4 requests only (15 decode tokens each).
        assert lv.spec is not None and lv.spec.drafts + lv.spec.accepted <= 4 * (15 + K)
    assert pooled_spec_stats(ngram).drafts > 0
    assert set(round_speedups([base, ngram])["ngram"]) == {1, 2}
    assert ServedRun.from_dict(ngram.to_dict()) == ngram
    assert [line.split(":")[0] for line in lines] == [
        "concurrency 1, round 1/2 (2 prompts)",
        "concurrency 1, round 2/2 (2 prompts)",
        "concurrency 2, round 1/2 (2 prompts)",
        "concurrency 2, round 2/2 (2 prompts)",
    ]
    assert "baseline" in lines[0] and lines[0].endswith(" tok/s")


@pytest.mark.engine
def test_wrong_model_name_fails_with_the_server_answer(ngram_server):
    settings = SweepSettings(output_len=4, concurrencies=(1,), warmup_requests=0, progress=False)
    with pytest.raises(RuntimeError, match=r"(?s)HTTP 404.*model name"):
        run_level(ngram_server, "no-such-model", [as_messages(PROMPTS[0])], 1, settings)


@pytest.mark.engine
def test_real_server_counters_move_with_ngram_drafts(ngram_server):
    raw = httpx.get(ngram_server + "/metrics", timeout=10).text
    samples = parse_prometheus(raw)  # the whole real exposition parses, histograms included
    assert any(s.name == ACCEPTED_PER_POS for s in samples)

    before = scrape(ngram_server, model=MODEL)
    assert before.present and len(before.accepted_per_pos) == K
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS[0]}],
        "temperature": 0,
        "max_tokens": 16,
        "min_tokens": 16,
        "ignore_eos": True,
    }
    resp = httpx.post(ngram_server + "/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] == 16
    # The engine records the last step's counters just after answering: allow it a moment.
    for _ in range(10):
        after = scrape(ngram_server, model=MODEL)
        if after != before:
            break
        time.sleep(0.2)
    s = spec_stats_between(before, after)
    assert s.drafts > 0
    assert s.draft_tokens <= K * s.drafts
    assert 0 <= s.accepted <= s.draft_tokens
    assert 1.0 <= s.al <= K + 1
    assert len(s.per_position_acceptance) == K
    # vLLM counts each accepted token at its position: the per-position counts add up to accepted.
    assert sum(s.accepted_per_pos) == s.accepted
    # 15 tokens follow the prefill's; a drafted step emits 1 + its accepted tokens, so drafted
    # steps cannot account for more than those (plus a last step cut at max_tokens).
    assert s.drafts + s.accepted <= 15 + K


# -- Without the engine ----------------------------------------------------------------------


def test_settings_reject_what_cannot_be_measured():
    with pytest.raises(ValueError, match="output_len=1"):
        SweepSettings(output_len=1)
    with pytest.raises(ValueError, match="concurrencies"):
        SweepSettings(concurrencies=(0, 4))
    with pytest.raises(ValueError, match="engine='tgi'"):
        SweepSettings(engine="tgi")


def test_fewer_prompts_than_concurrency_is_refused_before_any_request():
    settings = SweepSettings(output_len=8, concurrencies=(4,), progress=False)
    # Nothing listens on this URL: the check must fire before the first request or scrape.
    with pytest.raises(ValueError, match="2 prompts cannot keep 4 requests in flight"):
        run_level("http://127.0.0.1:9", MODEL, [as_messages(p) for p in PROMPTS], 4, settings)


def test_prompts_become_chat_messages():
    assert as_messages("hi") == [{"role": "user", "content": "hi"}]
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert as_messages(msgs) == msgs
    with pytest.raises(ValueError, match="role, content"):
        as_messages([{"text": "hi"}])
    mt = mt_bench_prompts(3)
    assert len(mt) == 3 and all(m[0]["role"] == "user" and m[0]["content"] for m in mt)
    # Spread over the file's categories, and each prompt's category in the same order.
    assert mt_bench_categories(8) == ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"]
    assert mt_bench_prompts(8)[3][0]["content"].startswith("The vertices of a triangle are at points")
