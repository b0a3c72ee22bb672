"""Shared parts of the corpus tests: the SmolLM2 tokenizer, its fingerprint, prompt files.

The vLLM server itself is the session-wide `vllm_server` fixture of eagle_assets_tests/conftest.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle_assets.corpus.conversation import ChatTemplate
from eagle_assets.corpus.target import load_tokenizer, target_fingerprint


@pytest.fixture(scope="session")
def tokenizer(smollm2_path):
    return load_tokenizer(smollm2_path)


@pytest.fixture(scope="session")
def template(tokenizer) -> ChatTemplate:
    return ChatTemplate(tokenizer)


@pytest.fixture(scope="session")
def target(smollm2_path) -> str:
    return target_fingerprint(smollm2_path)


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# Short questions keep 48-token answers meaningful; a few are multi-turn.
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "What does HTTP stand for?",
    "Give me a synonym for happy.",
    "How many legs does a spider have?",
    "What is 7 times 8?",
    "Write one sentence about the moon.",
    "What is the boiling point of water in Celsius?",
    "Translate 'thank you' into Spanish.",
    "What colour is a ripe banana?",
    "Name a planet with rings.",
    "What is the opposite of cold?",
]
FOLLOW_UPS = ["Say it in fewer words.", "Why?", "Give one more example."]


def prompt_rows(n_single: int, n_multi: int, offset: int = 0) -> list[dict]:
    """`n_single` one-turn `prompt` rows and `n_multi` two-turn `messages` rows."""
    rows: list[dict] = []
    for i in range(n_single):
        rows.append({"prompt": f"{QUESTIONS[(offset + i) % len(QUESTIONS)]} (#{offset + i})"})
    for j in range(n_multi):
        q = QUESTIONS[(offset + n_single + j) % len(QUESTIONS)]
        rows.append(
            {
                "messages": [
                    {"role": "system", "content": "You are a terse assistant."},
                    {"role": "user", "content": f"{q} (#{offset + n_single + j})"},
                    {"role": "assistant", "content": "an answer from the file, ignored"},
                    {"role": "user", "content": FOLLOW_UPS[j % len(FOLLOW_UPS)]},
                ]
            }
        )
    return rows
