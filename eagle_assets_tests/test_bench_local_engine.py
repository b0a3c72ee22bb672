"""The batched in-process client, both engines: what the corpus code gets from it is what one
request alone gets from `generate`."""

import asyncio

import pytest
import torch

from benchmarks.local_engine import LocalGenerationClient, load_generation_model
from benchmarks.slot_decoder import SlotDecoder
from eagle_assets.corpus.client import RequestRejected
from eagle_assets.corpus.conversation import ChatTemplate
from eagle_assets.corpus.prompts import MagpieSettings, synthesize_prompts_async

QUESTIONS = ["What is the capital of France?", "Name two prime numbers.", "Write a haiku about rain, please, in English."]


@pytest.fixture(scope="module")
def smollm2(smollm2_path, one_thread):
    return load_generation_model(str(smollm2_path), device="cpu")


def _ask_all(model, tokenizer, requests, max_batch, engine):
    async def run():
        async with LocalGenerationClient(model, tokenizer, max_batch=max_batch, engine=engine, max_len=256) as client:
            assert client.engine == engine
            out = await asyncio.gather(*(client.chat(m, p) for m, p in requests))
            return out, client.batches

    return asyncio.run(run())


@pytest.mark.parametrize("engine", ["generate", "slots"])
def test_batched_greedy_answers_equal_unbatched_generate(smollm2, engine):
    model, tokenizer = smollm2
    requests = [([{"role": "user", "content": q}], {"max_tokens": 12, "temperature": 0.0}) for q in QUESTIONS]
    # `slots` gets two slots for three requests: the third is prefilled into a freed slot.
    batched, batches = _ask_all(model, tokenizer, requests, max_batch=8 if engine == "generate" else 2, engine=engine)
    if engine == "generate":
        assert batches == 1  # the three requests were gathered into one generate call
    else:
        assert batches >= 2  # at most two fit at once: the third was prefilled later
    for (messages, _), got in zip(requests, batched):
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.inference_mode():
            ref = model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=2, pad_token_id=2)[0, ids.shape[1] :].tolist()
        stop = ref.index(2) if 2 in ref else None
        assert got.content == tokenizer.decode(ref[:stop], skip_special_tokens=True)
        assert got.finish_reason == ("length" if stop is None else "stop")
        assert got.completion_tokens == (12 if stop is None else stop + 1)
        assert got.prompt_tokens == ids.shape[1]


@pytest.mark.parametrize("engine", ["generate", "slots"])
def test_stop_token_ends_a_raw_completion_and_is_not_returned(smollm2, engine):
    model, tokenizer = smollm2
    template = ChatTemplate(tokenizer)

    async def run():
        async with LocalGenerationClient(model, tokenizer, max_batch=4, engine=engine, max_len=256) as client:
            params = {"max_tokens": 64, "temperature": 1.0, "stop_token_ids": [template.end_of_turn_id], "add_special_tokens": False}
            return await asyncio.gather(*(client.complete(template.user_prefix(), params) for _ in range(4)))

    for out in asyncio.run(run()):
        assert template.end_of_turn not in out.content
        assert out.finish_reason in ("stop", "length")
        assert 0 < out.completion_tokens <= 64


@pytest.mark.parametrize("engine, new, limit", [("generate", 9000, "the model's 8192"), ("slots", 300, "the client's max_len of 256")])
def test_a_request_past_the_context_is_rejected_with_the_numbers(smollm2, engine, new, limit):
    model, tokenizer = smollm2

    async def run():
        async with LocalGenerationClient(model, tokenizer, engine=engine, max_len=256) as client:
            return await client.chat([{"role": "user", "content": "hi"}], {"max_tokens": new})

    with pytest.raises(RequestRejected, match=f"prompt \\+ {new} new tokens exceed {limit} positions"):
        asyncio.run(run())


def test_slot_decoder_refills_freed_slots_and_matches_generate_token_for_token(smollm2):
    """Six prompts of different lengths through three slots: every slot is reused while the
    others are mid-answer, and each answer equals `generate` alone (24 tokens, no stop)."""
    model, tokenizer = smollm2
    questions = [*QUESTIONS, "Explain recursion to a child in two sentences.", "Why is the sky blue?", "List three fruits."]
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, return_dict=True)["input_ids"] for q in questions
    ]
    n = 24
    decoder = SlotDecoder(model, slots=3, max_len=128)
    waiting, active, got = list(enumerate(prompts)), {}, {}
    while waiting or active:
        free = [s for s in range(3) if s not in active]
        admitted = [(free.pop(0), *waiting.pop(0)) for _ in range(min(len(free), len(waiting)))]
        if admitted:
            firsts = decoder.prefill([s for s, _, _ in admitted], [p for _, _, p in admitted], [0.0] * len(admitted), [1.0] * len(admitted))
            for (slot, i, _), first in zip(admitted, firsts):
                active[slot] = (i, [first])
        tokens = decoder.step()
        for slot, (i, out) in list(active.items()):
            out.append(tokens[slot])
            if len(out) == n + (i % 2):  # odd prompts one token longer: the slots free at different steps
                got[i] = out[:n]
                del active[slot]
                decoder.release(slot)
    for i, p in enumerate(prompts):
        ids = torch.tensor([p])
        with torch.inference_mode():
            ref = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, eos_token_id=None)
        assert got[i] == ref[0, len(p) :].tolist(), f"prompt {i} diverged"


def test_slot_decoder_refuses_an_architecture_it_does_not_implement(smollm2):
    model, _ = smollm2
    model.config.model_type, saved = "gemma2", model.config.model_type
    try:
        with pytest.raises(ValueError, match="model_type 'gemma2' is not one of"):
            SlotDecoder(model, slots=1, max_len=8)
        with pytest.raises(ValueError, match="engine 'slots' cannot run this model"):
            LocalGenerationClient(model, None, engine="slots")
    finally:
        model.config.model_type = saved


def _magpie(model, tokenizer, settings):
    async def run():
        async with LocalGenerationClient(model, tokenizer, max_batch=4, max_len=256) as client:
            return await synthesize_prompts_async(client, ChatTemplate(tokenizer), settings)

    return asyncio.run(run())


def test_magpie_openings_start_every_prompt_and_the_target_writes_the_rest(smollm2):
    model, tokenizer = smollm2
    openings = ("Write a Python function that", "Explain how")
    settings = MagpieSettings(num_prompts=3, seed=3, max_tokens=32, user_openings=openings, max_requests=16)

    prompts, stats = _magpie(model, tokenizer, settings)
    assert prompts, stats
    for p in prompts:
        opening = next(o for o in openings if p.turns[0].startswith(o))
        assert len(p.turns[0]) > len(opening) + 1  # the target continued it
    with pytest.raises(ValueError, match="empty opening"):
        MagpieSettings(user_openings=("Explain", " "))


def test_topic_openings_get_a_subject_from_the_topics_and_the_target_writes_the_rest(smollm2):
    model, tokenizer = smollm2
    topics = ("volcanoes", "the Roman Empire", "jazz music")
    openings = ("Write a blog post about {topic}", "Explain how")
    settings = MagpieSettings(num_prompts=4, seed=5, max_tokens=32, user_openings=openings, user_topics=topics, max_requests=16)

    prompts, stats = _magpie(model, tokenizer, settings)
    starts = [f"Write a blog post about {t}" for t in topics] + ["Explain how"]
    assert prompts, stats
    assert any(p.turns[0].startswith(starts[0][:24]) for p in prompts)  # this seed draws a {topic} opening
    for p in prompts:
        assert "{topic}" not in p.turns[0]
        opening = next(o for o in starts if p.turns[0].startswith(o))
        assert len(p.turns[0]) > len(opening) + 1  # the target continued it
