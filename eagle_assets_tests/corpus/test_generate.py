"""Generator behaviour that needs no engine: ids, refusals, and a server that is not there."""

from __future__ import annotations

import asyncio

import pytest

from eagle_assets.corpus.client import ClientSettings, InferenceClient, ServerUnreachable
from eagle_assets.corpus.generate import GenerationAborted, SamplingParams, generate_corpus, generate_corpus_async, sample_id_for
from eagle_assets.corpus.prompt_record import EvaluationDataError, Prompt, load_mt_bench
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.engines.process import free_port
from eagle_assets_tests.corpus.test_store import row


def test_sample_ids_change_with_prompt_sampling_and_target_only():
    p = Prompt.make(["What is 2+2?"])
    base = sample_id_for(p, SamplingParams(max_tokens=48), "t1")
    assert base == sample_id_for(Prompt.make(["What is 2+2?"], origin="elsewhere row 9"), SamplingParams(max_tokens=48), "t1")
    assert base != sample_id_for(Prompt.make(["What is 2+2?"], system="s"), SamplingParams(max_tokens=48), "t1")
    assert base != sample_id_for(p, SamplingParams(max_tokens=49), "t1")
    assert base != sample_id_for(p, SamplingParams(max_tokens=48), "t2")


def test_sampled_requests_get_reproducible_per_sample_seeds():
    s = SamplingParams(temperature=0.7, seed=3, max_tokens=8)
    assert s.request_params("a", 0) == s.request_params("a", 0)
    assert s.request_params("a", 0)["seed"] != s.request_params("a", 1)["seed"] != s.request_params("b", 1)["seed"]
    assert "seed" not in SamplingParams().request_params("a", 0)


def stored_bytes(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_unreachable_server_names_the_url_and_touches_nothing(tmp_path, tokenizer, target):
    with CorpusStore(str(tmp_path), shard_size=2) as store:
        store.append(row(0))
        store.append(row(1))
    before = stored_bytes(tmp_path)
    url = f"http://127.0.0.1:{free_port()}"
    with CorpusStore(str(tmp_path), shard_size=2) as store, pytest.raises(ServerUnreachable, match=f"cannot reach the inference server at {url}"):
        generate_corpus([Prompt.make(["hi"])], store, ClientSettings(url, "m"), tokenizer, target=target, show_progress_bar=False)
    assert stored_bytes(tmp_path) == before


def test_a_server_gone_for_good_stops_the_run_and_keeps_what_was_done(tmp_path, template, target):
    with CorpusStore(str(tmp_path), shard_size=2) as store:
        store.append(row(0))
    url = f"http://127.0.0.1:{free_port()}"
    prompts = [Prompt.make([f"question {i}"]) for i in range(20)]

    async def run(store):
        async with InferenceClient(ClientSettings(url, "m", max_retries=1, backoff_s=0.01, concurrency=2)) as client:
            return await generate_corpus_async(prompts, client, store, template, target=target, show_progress_bar=False, max_consecutive_failures=4)

    store = CorpusStore(str(tmp_path), shard_size=2)
    with pytest.raises(GenerationAborted, match=f"the server stopped answering .* cannot reach the inference server at {url}") as err:
        asyncio.run(run(store))
    # It stopped at the first samples whose retries were spent (two in flight), not after a streak.
    assert 1 <= err.value.stats.failed <= 2
    reread = CorpusStore(str(tmp_path), mode="r")
    assert reread.done_ids() == {"s000"}
    failures = reread.failures()
    assert len(failures) == err.value.stats.failed and all(f["error_type"] == "RetriesExhausted" for f in failures)
    assert "gave up after 2 attempts" in failures[0]["error"] and "ConnectError" in failures[0]["error"]


def test_mt_bench_prompts_are_refused_before_any_request(tmp_path, tokenizer, target):
    url = f"http://127.0.0.1:{free_port()}"  # never contacted: the refusal comes first
    with CorpusStore(str(tmp_path)) as store, pytest.raises(EvaluationDataError, match="MT-Bench"):
        asyncio.run(generate_corpus_async(load_mt_bench()[:2], InferenceClient(ClientSettings(url, "m")), store, None, target=target))
    assert list(tmp_path.iterdir()) == []


def test_bad_settings_name_the_setting():
    with pytest.raises(ValueError, match=r"temperature -1.0 < 0 \(0 is greedy\); max_tokens 0 < 1"):
        SamplingParams(temperature=-1.0, max_tokens=0)
