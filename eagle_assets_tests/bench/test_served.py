"""The served sweep against the real vLLM CPU server (SmolLM2 with n-gram speculation).

One server per test session (`ngram_server`, shared with test_metrics.py), ports 8150-8199.
Tests without the engine check the sweep's input validation.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from eagle_assets.bench.checks import pooled_spec_stats
from eagle_assets.bench.served import (
    ServedRun,
    SweepSettings,
    as_messages,
    mt_bench_prompts,
    run_level,
    run_served,
)
from eagle_assets.paths import engine_venv, runs_dir

MODEL = "smollm2-135m-instruct"
K = 3
NGRAM = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":4,"prompt_lookup_min":2}'
# Repetitive prompts: the answer copies the prompt, so prompt-lookup drafts find matches.
PROMPTS = [
    "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat.",
    "Copy this list: red, green, blue, red, green, blue, red, green, blue, red, green, blue.",
]


def _engine_python() -> Path | None:
    for venv in (engine_venv("vllm"), Path("/tmp/vlltest/venv")):
        if (venv / "bin" / "python").is_file() and (venv / "lib" / "libiomp5.so").is_file():
            return venv / "bin" / "python"
    return None


def _free_port(lo: int = 8150, hi: int = 8199) -> int:
    for port in range(lo, hi + 1):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {lo}-{hi}")


class _NgramServer:
    """The real vLLM server with n-gram speculation, started once per process."""

    proc: subprocess.Popen | None = None
    url: str | None = None
    failure: str | None = None

    @classmethod
    def start(cls) -> str:
        if cls.url is not None:
            return cls.url
        if cls.failure is not None:
            pytest.fail(cls.failure)
        python = _engine_python()
        if python is None:
            pytest.skip("no vLLM engine environment (make setup, or set EAGLE_ASSETS_VLLM_VENV)")
        from eagle_assets.embedded_target import pull

        model = pull(log=lambda *_: None)
        port = _free_port()
        log_path = runs_dir() / f"test-bench-ngram-{port}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="2",
                   LD_PRELOAD=str(python.parent.parent / "lib" / "libiomp5.so"))
        cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", MODEL, "--port", str(port), "--enforce-eager",
               "--compilation-config", '{"mode":0}', "--max-model-len", "2048",
               "--speculative-config", NGRAM]
        with open(log_path, "wb") as log:
            cls.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if cls.proc.poll() is not None:
                break
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    cls.url = url
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(1)
        tail = log_path.read_text(errors="replace")[-3000:]
        cls.stop()
        cls.failure = f"vLLM n-gram server did not come up on {url}; log {log_path}:\n{tail}"
        pytest.fail(cls.failure)

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None and cls.proc.poll() is None:
            os.killpg(cls.proc.pid, signal.SIGTERM)
            try:
                cls.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(cls.proc.pid, signal.SIGKILL)
                cls.proc.wait()
        cls.proc = None
        cls.url = None


@pytest.fixture(scope="session")
def ngram_server():
    """Base URL of the real SmolLM2 vLLM server with n-gram speculation (K=3)."""
    yield _NgramServer.start()
    _NgramServer.stop()


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
    assert 1.0 <= pooled.al <= K + 1
    # Speculation streams accepted runs as one chunk: more tokens per chunk when drafts are accepted.
    if pooled.accepted > 0:
        assert max(lv.tokens_per_chunk for lv in run.levels) > 1.0

    again = ServedRun.from_dict(run.to_dict())
    assert again == run


@pytest.mark.engine
def test_wrong_model_name_fails_with_the_server_answer(ngram_server):
    settings = SweepSettings(output_len=4, concurrencies=(1,), warmup_requests=0, progress=False)
    with pytest.raises(RuntimeError, match=r"(?s)HTTP 404.*model name"):
        run_level(ngram_server, "no-such-model", [as_messages(PROMPTS[0])], 1, settings)


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
