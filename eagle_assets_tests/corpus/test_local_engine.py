"""The batched in-process client: what the corpus code gets from it is what one request alone gets."""

import asyncio

import pytest
import torch

from eagle_assets.corpus.client import RequestRejected
from eagle_assets.corpus.conversation import ChatTemplate
from eagle_assets.corpus.local_engine import LocalGenerationClient, load_generation_model

QUESTIONS = ["What is the capital of France?", "Name two prime numbers.", "Write a haiku about rain, please, in English."]


@pytest.fixture(scope="module")
def smollm2(smollm2_path, one_thread):
    return load_generation_model(str(smollm2_path), device="cpu")


def _ask_all(model, tokenizer, requests, max_batch):
    async def run():
        async with LocalGenerationClient(model, tokenizer, max_batch=max_batch) as client:
            out = await asyncio.gather(*(client.chat(m, p) for m, p in requests))
            return out, client.batches
    return asyncio.run(run())


def test_batched_greedy_answers_equal_unbatched_generate(smollm2):
    model, tokenizer = smollm2
    requests = [([{"role": "user", "content": q}], {"max_tokens": 12, "temperature": 0.0}) for q in QUESTIONS]
    batched, batches = _ask_all(model, tokenizer, requests, max_batch=8)
    assert batches == 1  # the three requests were gathered into one generate call
    for (messages, _), got in zip(requests, batched):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.inference_mode():
            ref = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=2)[0, ids.shape[1]:].tolist()
        stop = ref.index(2) if 2 in ref else None
        assert got.content == tokenizer.decode(ref[:stop], skip_special_tokens=True)
        assert got.finish_reason == ("length" if stop is None else "stop")
        assert got.completion_tokens == (12 if stop is None else stop + 1)
        assert got.prompt_tokens == ids.shape[1]


def test_stop_token_ends_a_raw_completion_and_is_not_returned(smollm2):
    model, tokenizer = smollm2
    template = ChatTemplate(tokenizer)

    async def run():
        async with LocalGenerationClient(model, tokenizer, max_batch=4) as client:
            params = {"max_tokens": 96, "temperature": 1.0, "stop_token_ids": [template.end_of_turn_id], "add_special_tokens": False}
            return await asyncio.gather(*(client.complete(template.user_prefix(), params) for _ in range(4)))

    for out in asyncio.run(run()):
        assert template.end_of_turn not in out.content
        assert out.finish_reason in ("stop", "length")
        assert 0 < out.completion_tokens <= 96


def test_a_request_past_the_context_is_rejected_with_the_numbers(smollm2):
    model, tokenizer = smollm2

    async def run():
        async with LocalGenerationClient(model, tokenizer) as client:
            return await client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 10**6})

    with pytest.raises(RequestRejected, match="exceed the model's"):
        asyncio.run(run())
