"""Shared parts for the hidden-state tests: a real corpus tokenised by SmolLM2, a tiny llama.

The corpus is written in the corpus stage's schema (`formats.CORPUS_COLUMNS`): chat
conversations run through the SmolLM2 tokenizer's `apply_chat_template`, loss mask 1 on the
assistant turns.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from eagle_assets.corpus.store import CORPUS_SCHEMA
from eagle_assets.formats import CORPUS_COLUMNS, CORPUS_MANIFEST, stable_id

TOPICS = [
    ("What is a prime number?", "A prime number is a whole number above one whose only divisors are one and itself."),
    ("Name three primary colours.", "Red, yellow and blue."),
    (
        "How do plants make food?",
        "Plants use sunlight, water and carbon dioxide to make sugar through photosynthesis, "
        "releasing oxygen as a by-product. The green pigment chlorophyll captures the light.",
    ),
    ("Translate 'good morning' into French.", "Bonjour."),
    (
        "Why is the sky blue?",
        "Air molecules scatter short blue wavelengths of sunlight much more than red ones, "
        "so scattered blue light reaches our eyes from every direction of the sky.",
    ),
    ("Give me a haiku about rain.", "Soft rain on the roof,\nthe garden drinks in silence,\nclouds fold into night."),
    ("What does HTTP stand for?", "HyperText Transfer Protocol."),
    (
        "Explain recursion briefly.",
        "Recursion is when a function solves a problem by calling itself on smaller "
        "inputs until it reaches a base case that it can answer directly. Each call waits for the smaller one.",
    ),
]


def conversations() -> list[list[dict]]:
    convs = []
    for i, (q, a) in enumerate(TOPICS):
        msgs = [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
        if i % 3 == 0:
            msgs.insert(0, {"role": "system", "content": "You are a concise assistant."})
        if i % 4 == 1:  # a second turn for some
            msgs += [{"role": "user", "content": "Say it again, shorter."}, {"role": "assistant", "content": a.split(",")[0]}]
        convs.append(msgs)
    return convs


def _ids(tokenizer, msgs, **kw) -> list[int]:
    out = tokenizer.apply_chat_template(msgs, tokenize=True, **kw)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def tokenise(tokenizer, msgs: list[dict]) -> tuple[list[int], list[int]]:
    """input_ids of the whole conversation and a mask of 1 on each assistant turn's tokens."""
    ids = _ids(tokenizer, msgs)
    mask = [0] * len(ids)
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            start = len(_ids(tokenizer, msgs[:i], add_generation_prompt=True))
            end = len(_ids(tokenizer, msgs[: i + 1]))
            assert ids[:end] == _ids(tokenizer, msgs[: i + 1])  # ChatML is prefix-stable
            mask[start:end] = [1] * (end - start)
    return ids, mask


def corpus_row(sample_id: str, msgs, ids, mask, target: str) -> dict:
    return {
        "sample_id": sample_id,
        "prompt_id": stable_id(msgs[0]["content"]),
        "source": "file",
        "messages": json.dumps(msgs),
        "input_ids": ids,
        "loss_mask": mask,
        "num_tokens": len(ids),
        "num_turns": sum(m["role"] == "assistant" for m in msgs),
        "finish_reason": "stop",
        "truncated": False,
        "reasoning_captured": False,
        "prompt_tokens": len(ids) - sum(mask),
        "completion_tokens": sum(mask),
        "latency_s": 0.1,
        "sampling": json.dumps({"temperature": 0.0}),
        "target": target,
    }


SCHEMA = CORPUS_SCHEMA  # the corpus store's own, so a test corpus is written as the store writes one
assert tuple(SCHEMA.names) == CORPUS_COLUMNS


def write_corpus(folder: Path, rows: list[dict], num_files: int = 2, manifest: bool = True) -> Path:
    """Write `rows` as `num_files` Parquet files (+ a manifest listing them) under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    names = []
    for f in range(num_files):
        part = rows[f::num_files]
        if not part:
            continue
        name = f"part-{f:05d}.parquet"
        pq.write_table(pa.Table.from_pylist(part, schema=SCHEMA), folder / name)
        names.append(name)
    if manifest:
        (folder / CORPUS_MANIFEST).write_text(json.dumps({"shards": [{"path": n} for n in names]}))
    return folder


@pytest.fixture(scope="session")
def smol_tokenizer(smollm2_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


@pytest.fixture(scope="session")
def fingerprint(smol_tokenizer) -> str:
    from eagle_assets.hidden_states.corpus_io import tokenizer_fingerprint

    return tokenizer_fingerprint(smol_tokenizer)


@pytest.fixture(scope="session")
def chat_rows(smol_tokenizer, fingerprint) -> list[dict]:
    """Corpus rows of the eight conversations, tokenised by the real SmolLM2 tokenizer."""
    rows = []
    for msgs in conversations():
        ids, mask = tokenise(smol_tokenizer, msgs)
        rows.append(corpus_row(stable_id(msgs, "greedy", "smollm2"), msgs, ids, mask, fingerprint))
    return rows


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory, chat_rows) -> Path:
    return write_corpus(tmp_path_factory.mktemp("corpus"), chat_rows)


def tiny_llama(seed: int = 0, dtype=torch.bfloat16):
    """A random 4-layer llama (hidden 64) over SmolLM2's vocabulary, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=49152,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


@pytest.fixture(scope="session")
def tiny_model():
    return tiny_llama()
