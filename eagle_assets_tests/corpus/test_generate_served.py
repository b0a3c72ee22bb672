"""The corpus from the real vLLM CPU server and SmolLM2: Magpie, kill and resume, a dying server.

Answers are kept short (48 tokens) and the corpora small (17 + 8 samples, 4 Magpie prompts):
most of the module's time is the two vLLM start-ups (the session's server and the one that is
killed), about a minute each on two idle cores.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from eagle_assets.corpus import checks
from eagle_assets.corpus.client import ClientSettings, ServerUnreachable
from eagle_assets.corpus.generate import GenerationAborted, GenerationFailed, SamplingParams, generate_corpus, sample_id_for
from eagle_assets.corpus.prompt_record import Prompt, normalize_text
from eagle_assets.corpus.prompts import MagpieSettings, load_prompt_file, synthesize_prompts, write_prompts
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.engines.process import port_holder, port_in_use
from eagle_assets.engines.serving import launch_vllm
from eagle_assets.formats import CORPUS_FAILURES, CORPUS_MANIFEST
from eagle_assets.targets import EMBEDDED_TARGET
from eagle_assets_tests.corpus.conftest import prompt_rows, write_jsonl

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
SAMPLING = SamplingParams(max_tokens=48)  # greedy; the CLI's defaults with --max-tokens 48
OUR_PORTS = range(8100, 8150)


def server_settings(server, **kw) -> ClientSettings:
    return ClientSettings(server.base_url, server.model, **{"concurrency": 4, "max_retries": 2, "backoff_s": 0.2, **kw})


@pytest.fixture(scope="module")
def magpie(vllm_server, tokenizer):
    settings = MagpieSettings(num_prompts=4, seed=1, max_tokens=64, multi_turn_fraction=0.5, answer_max_tokens=24)
    return synthesize_prompts(server_settings(vllm_server), tokenizer, settings)


def test_magpie_prompts_come_from_the_target(magpie):
    prompts, stats = magpie
    assert len(prompts) == 4 and stats.kept == 4
    assert all(p.source == "magpie" and p.system is None for p in prompts)
    assert all(8 <= len(t) <= 2000 and t == t.strip() for p in prompts for t in p.turns)
    assert len({normalize_text(p.turns[0]) for p in prompts}) == 4  # deduplicated
    assert {len(p.turns) for p in prompts} <= {1, 2}
    dropped = stats.dropped_empty + stats.dropped_too_long + stats.dropped_duplicate + stats.dropped_mt_bench
    assert stats.requested == stats.kept + dropped + stats.unused + stats.failed and stats.failed == 0


@pytest.fixture(scope="module")
def killed_and_resumed(vllm_server, tokenizer, target, magpie, smollm2_path, tmp_path_factory):
    """A corpus run in a real subprocess, SIGKILLed after its second shard, then resumed."""
    work = tmp_path_factory.mktemp("killed")
    rows = prompt_rows(n_single=10, n_multi=3)
    rows.append({"prompt": "word " * 2100})  # longer than --max-model-len 2048: the server refuses it (HTTP 400)
    file_prompts = load_prompt_file(str(write_jsonl(work / "file.jsonl", rows)))
    prompts = file_prompts + magpie[0]
    write_prompts(prompts, str(work / "prompts.jsonl"))
    out = work / "corpus"
    cmd = [
        sys.executable,
        "-m",
        "eagle_assets.cli",
        "corpus",
        "generate",
        "--prompts",
        str(work / "prompts.jsonl"),
        "--out",
        str(out),
        "--server",
        vllm_server.base_url,
        "--model",
        vllm_server.model,
        "--tokenizer",
        str(smollm2_path),
        "--max-tokens",
        "48",
        "--concurrency",
        "4",
        "--shard-size",
        "3",
        "--retries",
        "1",
    ]
    log = work / "generate.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            manifest = out / CORPUS_MANIFEST
            if manifest.is_file() and json.loads(manifest.read_text())["num_rows"] >= 6:
                break
            time.sleep(0.1)
        assert proc.poll() is None, f"the generator ended before it could be killed: {log.read_text()[-2000:]}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
    after_kill = {p.name for p in out.iterdir()}
    rows_at_kill = json.loads((out / CORPUS_MANIFEST).read_text())["num_rows"]
    for name in after_kill:
        if name.endswith(".parquet") and not name.startswith(".tmp-"):
            pq.read_table(out / name)  # every shard in place is complete (a partial one would not parse)

    # The over-long prompt fails, one of at most 12 tried (above the 5% allowed): the run fails,
    # saying so, with everything else stored.
    with CorpusStore(str(out), shard_size=3) as store, pytest.raises(GenerationFailed) as failed:
        generate_corpus(prompts, store, server_settings(vllm_server), tokenizer, target=target, sampling=SAMPLING, show_progress_bar=False)
    stats = failed.value.stats
    return {"prompts": prompts, "out": out, "after_kill": after_kill, "rows_at_kill": rows_at_kill, "stats": stats, "failed": str(failed.value)}


def test_a_killed_run_resumes_to_exactly_the_expected_ids(killed_and_resumed, target):
    r = killed_and_resumed
    too_long = r["prompts"][13]
    expected = {sample_id_for(p, SAMPLING, target) for p in r["prompts"]} - {sample_id_for(too_long, SAMPLING, target)}
    store = CorpusStore(str(r["out"]), mode="r")
    ids = store.read_table(["sample_id"]).column("sample_id").to_pylist()
    assert len(ids) == len(set(ids)) and set(ids) == expected
    stats = r["stats"]
    assert 6 <= r["rows_at_kill"] < len(expected)
    assert stats.already_done >= r["rows_at_kill"]  # nothing stored before the kill was asked again
    assert stats.already_done + stats.succeeded == len(expected)
    # Only complete files remain: listed shards, the manifest, the failures; no temporary file.
    assert {p.name for p in r["out"].iterdir()} == {CORPUS_MANIFEST, CORPUS_FAILURES, *store.shard_files()}
    # The over-long prompt was refused by the server, not retried, and recorded.
    (failure,) = store.failures()
    assert failure["sample_id"] == sample_id_for(too_long, SAMPLING, target)
    assert failure["error_type"] == "RequestRejected" and "HTTP 400" in failure["error"]
    # One failure of the resumed run's tries is above the 5% allowed: the run failed, saying so.
    attempted = stats.succeeded + stats.failed
    assert stats.failed == 1 and attempted == len(expected) + 1 - stats.already_done
    assert r["failed"].startswith(f"1 of {attempted} samples failed ({1 / attempted:.0%}, above the 5% allowed)")
    assert "commonest errors: RequestRejected x1 (e.g. " in r["failed"] and "HTTP 400" in r["failed"]


def test_the_corpus_rows_pass_the_checks(killed_and_resumed, tokenizer):
    store = CorpusStore(str(killed_and_resumed["out"]), mode="r")
    assert checks.check_error_rate(store, max_error_rate=0.1)[0]
    passed, meta = checks.check_error_rate(store, max_error_rate=0.05)  # 1 of 18 is 5.6%
    assert not passed and meta["error_rate"] == round(1 / 18, 6) and meta["error_types"] == {"RequestRejected": 1}
    assert checks.check_no_duplicate_ids(store) == (True, {"rows": 17, "manifest_ids": 17, "duplicate_ids": 0, "examples": []})
    passed, meta = checks.check_token_round_trip(store, tokenizer)
    assert passed and meta["rows_checked"] == 17, meta
    assert checks.check_reasoning_capture(store, target_reasons=False)[0]  # SmolLM2 has no reasoning parser
    assert not checks.check_reasoning_capture(store, target_reasons=True)[0]  # a reasoning target without reasoning fails

    rows = list(store.iter_rows())
    assert Counter(r["source"] for r in rows) == {"file": 13, "magpie": 4}
    assert Counter(r["num_turns"] for r in rows)[2] >= 3
    for r in rows:
        messages = json.loads(r["messages"])
        answers = [m["content"] for m in messages if m["role"] == "assistant"]
        assert len(answers) == r["num_turns"] and all(answers)
        masked = tokenizer.decode([i for i, m in zip(r["input_ids"], r["loss_mask"]) if m])
        assert masked == "".join(a + "<|im_end|>" for a in answers)  # the mask is exactly the target's answers
        assert r["truncated"] == (r["finish_reason"] == "length") or r["num_turns"] == 2
        assert r["completion_tokens"] <= 48 * r["num_turns"] and r["num_tokens"] == len(r["input_ids"])


def test_a_rerun_of_a_complete_corpus_asks_nothing(killed_and_resumed, vllm_server, tokenizer, target):
    r = killed_and_resumed
    with CorpusStore(str(r["out"]), shard_size=3) as store:
        stats = generate_corpus(
            r["prompts"][:13], store, server_settings(vllm_server), tokenizer, target=target, sampling=SAMPLING, show_progress_bar=False
        )
    assert (stats.already_done, stats.succeeded, stats.failed) == (13, 0, 0)


def test_a_bad_model_name_is_a_clear_client_error(vllm_server, tokenizer, target, tmp_path):
    settings = ClientSettings(vllm_server.base_url, "no-such-model")
    with CorpusStore(str(tmp_path)) as store, pytest.raises(ServerUnreachable, match="serves \\['smollm2-135m-instruct'\\], not 'no-such-model'"):
        generate_corpus([Prompt.make(["hi"])], store, settings, tokenizer, target=target, show_progress_bar=False)


def free_port_of_ours() -> int:
    return next(p for p in OUR_PORTS if not port_in_use(p))


def test_a_server_dying_mid_run_stops_it_within_seconds_loses_nothing_and_a_rerun_completes(vllm_server, tokenizer, target, tmp_path):
    prompts = load_prompt_file(str(write_jsonl(tmp_path / "p.jsonl", prompt_rows(n_single=8, n_multi=0, offset=40))))
    expected = {sample_id_for(p, SAMPLING, target) for p in prompts}
    out = tmp_path / "corpus"
    port = free_port_of_ours()
    killed = {}
    with launch_vllm(EMBEDDED_TARGET, port=port, log=lambda m: None) as doomed:
        pid, _ = port_holder(port)
        pgid = os.getpgid(pid)

        def kill_after_two_shards():
            while True:
                manifest = out / CORPUS_MANIFEST
                if manifest.is_file() and json.loads(manifest.read_text())["num_rows"] >= 4:
                    killed["at"] = time.monotonic()
                    os.killpg(pgid, signal.SIGKILL)  # the whole engine: API server, engine core, worker
                    return
                time.sleep(0.05)

        killer = threading.Thread(target=kill_after_two_shards, daemon=True)
        killer.start()
        with CorpusStore(str(out), shard_size=2) as store, pytest.raises(GenerationAborted) as aborted:
            generate_corpus(
                prompts,
                store,
                server_settings(doomed, concurrency=2),
                tokenizer,
                target=target,
                sampling=SAMPLING,
                show_progress_bar=False,
                max_consecutive_failures=None,
            )
        stopped_after = time.monotonic() - killed["at"]
        killer.join(timeout=5)

    # Not a success with most samples failed: the run stopped at the first sample whose retries
    # were spent, once the server no longer answered, and said so.
    assert stopped_after < 10, f"the dead server was noticed {stopped_after:.1f} s after the kill"
    message = str(aborted.value)
    assert "the server stopped answering" in message and f"cannot reach the inference server at {doomed.base_url}" in message
    assert "restart the server and rerun to resume" in message
    stats = aborted.value.stats
    store = CorpusStore(str(out), mode="r")
    stored = set(store.done_ids())
    failed = {f["sample_id"] for f in store.failures()}
    assert stats.succeeded == len(stored) >= 4 and stats.failed == len(failed) >= 1
    assert f"{len(stored)} samples are stored" in message
    assert stored | failed <= expected and not stored & failed  # every completed sample kept, every failure recorded
    assert len(failed) <= 2  # only the samples in flight (concurrency 2) when the server died
    assert all(f["error_type"] == "RetriesExhausted" and "gave up after 3 attempts" in f["error"] for f in store.failures())
    assert checks.check_token_round_trip(store, tokenizer)[0]

    # The server is back (the session's instance of the same target): the rerun does the rest.
    with CorpusStore(str(out), shard_size=2) as store:
        again = generate_corpus(prompts, store, server_settings(vllm_server), tokenizer, target=target, sampling=SAMPLING, show_progress_bar=False)
    assert (again.already_done, again.succeeded, again.failed) == (len(stored), len(expected) - len(stored), 0)
    final = CorpusStore(str(out), mode="r")
    assert final.done_ids() == expected and final.failures() == []
    assert checks.check_no_duplicate_ids(final)[0]
