"""Prompt sets: a user file, prompts the target writes itself (Magpie), and MT-Bench (evaluation only).

A `Prompt` is a system message (optional) and one or more user turns; the corpus generator
replays the user turns one at a time and lets the target write every answer, so assistant
turns in a source file are ignored. Each prompt has a stable `prompt_id`.

Sources:
  * `load_prompt_file(url)`: a prompt file at any fsspec URL or `pkg://PACKAGE/PATH`, in
    any of the formats of `prompt_formats.py` (ShareGPT, OpenAI chat `messages`, Alpaca,
    plain text, and this project's rows with `messages`, `prompt` or `turns`), detected per
    file; JSON Lines, JSON arrays (streamed), Parquet or text. Bad rows fail with the file
    and row named.
  * `synthesize_prompts(...)`: Magpie-style, the target samples the user turn itself from the
    chat template cut just after the user header (`<|im_start|>user\\n` for ChatML), through
    the server's raw `/v1/completions`; deduplicated, empty and over-long ones dropped;
    optionally multi-turn (a follow-up user turn sampled after the target's own answer).
  * `load_mt_bench()`: the 80 MT-Bench questions shipped in eagle_assets/data, for the
    benchmark only. Any attempt to train on them (by file name, or by the content of the
    questions under any name) raises `EvaluationDataError`.

    eagle-assets corpus magpie --server http://localhost:8000 \\
        --model smollm2-135m-instruct --tokenizer .cache/targets/smollm2-135m-instruct \\
        --num-prompts 64 --out data/prompts/magpie.jsonl
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import random
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import fsspec

from eagle_assets.corpus.client import ClientSettings, InferenceClient, ServerStalled
from eagle_assets.corpus.conversation import ChatTemplate
from eagle_assets.corpus.prompt_formats import ReadStats, iter_prompts
from eagle_assets.corpus.prompt_record import (
    EvaluationDataError,
    Prompt,
    PromptFileError,
    ensure_training_prompts,
    is_mt_bench_url,
    mt_bench_hashes,
    normalize_text,
    text_hash,
)
from eagle_assets.durable import no_room
from eagle_assets.formats import stable_id


def load_prompt_file(
    url: str,
    *,
    purpose: str = "training",
    limit: int | None = None,
    storage_options: Mapping[str, Any] | None = None,
    format: str = "auto",
    skip_bad_rows: bool = False,
    stats: ReadStats | None = None,
) -> list[Prompt]:
    """Prompts from a prompt file (any format of `prompt_formats.py`, at any fsspec URL or
    `pkg://PACKAGE/PATH`), duplicates (same prompt_id) dropped.

    `purpose="training"` (the default) refuses MT-Bench, by file name and by question content.
    `format` forces a format ("auto" detects it). A bad row refuses the whole file, naming its
    row and line and what is wrong with it: a corpus built from the good rows alone would
    silently lack prompts the user gave, and the fix (in the file) is the user's to make;
    `skip_bad_rows` drops such rows instead, counting them in `stats` (a `ReadStats`).
    """

    if purpose not in ("training", "evaluation"):
        raise ValueError(f"purpose must be 'training' or 'evaluation', got {purpose!r}")
    if purpose == "training" and is_mt_bench_url(url):
        raise EvaluationDataError(
            f"{url} is MT-Bench, the evaluation set; it cannot be a training source. Use it in "
            "benchmark_report (load_mt_bench) and give the corpus another prompt file or Magpie prompts."
        )
    prompts, seen = [], set()
    for p in iter_prompts(url, format=format, storage_options=storage_options, skip_bad=skip_bad_rows, stats=stats):
        if p.prompt_id not in seen:
            seen.add(p.prompt_id)
            prompts.append(p)
        elif stats is not None:
            stats.drop("duplicate")
        if limit is not None and len(prompts) >= limit:
            break
    if not prompts:
        raise PromptFileError(f"{url} holds no prompts")
    if purpose == "training":
        ensure_training_prompts(prompts)
    return prompts


def write_prompts(prompts: Sequence[Prompt], url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Save a prompt set as JSONL (`messages`, `prompt_id`, `source`), atomically; load_prompt_file reads it."""
    fs, path = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    parent = posixpath.dirname(path)
    if parent:
        fs.makedirs(parent, exist_ok=True)
    tmp = posixpath.join(parent, f".tmp-{uuid.uuid4().hex[:8]}-{posixpath.basename(path)}")
    try:
        with fs.open(tmp, "wb") as f:
            for p in prompts:
                row = {"prompt_id": p.prompt_id, "source": p.source, "messages": p.to_messages()}
                f.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))
        fs.mv(tmp, path)
    except OSError as exc:  # a full disk among them: no half file stays, the old one is kept
        if fs.exists(tmp):
            fs.rm(tmp)
        raise no_room(exc, url, f"{len(prompts)} prompts", f"{url} keeps what it held before") or exc from None


# ---- Magpie synthesis -------------------------------------------------------------------
# Openings of common assistant tasks (writing, role-play, reasoning, maths, coding, extraction,
# science, humanities): a 135M target left to the bare template writes mostly a few favourite
# kinds of question; starting its user turn with one of these spreads the prompts (and so the
# answers the drafter learns from) over the kinds of request a served model gets.
TASK_OPENINGS: tuple[str, ...] = (
    "Write a short story about",
    "Write a persuasive essay",
    "Compose an email to",
    "Write a blog post about",
    "Write a poem about",
    "Draft a speech for",
    "Rewrite the following sentence",
    "Imagine you are",
    "Pretend to be",
    "Act as a",
    "Solve this riddle:",
    "If a",
    "Which is more likely",
    "Explain the logic behind",
    "Calculate",
    "Solve for x:",
    "What is the sum of",
    "A train travels",
    "How many ways",
    "Prove that",
    "Write a Python function that",
    "Write a JavaScript function",
    "Explain what this code does:",
    "How do I implement",
    "Write a SQL query that",
    "Fix the bug in this code:",
    "Summarize the following text:",
    "Extract the names",
    "From the following paragraph,",
    "Classify the following",
    "Explain how",
    "What is the difference between",
    "Why does",
    "Describe the process of",
    "Discuss the impact of",
    "What were the causes of",
    "Compare",
    "Give me advice on",
    "What are the pros and cons of",
    "Suggest",
)

# Openings with a subject (`{topic}`, one of `user_topics` drawn per candidate): the target left
# to an opening alone writes about its few favourite subjects; naming one moves its prompts, and
# so its answers, over the subjects a served model is asked about (`load_topics()`).
TOPIC_OPENINGS: tuple[str, ...] = (
    "Write a blog post about {topic}",
    "Write a short story about {topic}",
    "Write a poem about {topic}",
    "Write a persuasive essay about {topic}",
    "Compose an email to a friend about {topic}",
    "Draft a speech about {topic}",
    "Imagine you are an expert on {topic}.",
    "Pretend to be a teacher explaining {topic}",
    "Explain {topic} to",
    "Describe the history of {topic}",
    "Discuss the impact of {topic} on",
    "What are the pros and cons of {topic}",
    "Give me advice on {topic}",
    "Compare {topic} and",
    "What are common misconceptions about {topic}",
    "Summarize what is known about {topic}",
    "Create a lesson plan about {topic}",
    "Write a quiz about {topic}",
    "Outline a presentation on {topic}",
    "List five facts about {topic}",
    "Write a Python program about {topic}",
    "Solve this problem about {topic}:",
    "Extract the key facts from this text about {topic}:",
)
TOPICS_PATH = Path(__file__).resolve().parent.parent / "data" / "topics.txt"


def load_topics(path: str | Path = TOPICS_PATH) -> tuple[str, ...]:
    """Subjects for `{topic}` openings, one per line (`#` comments and blank lines skipped)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return tuple(t for t in (line.split("#", 1)[0].strip() for line in lines) if t)


@dataclass(frozen=True)
class MagpieSettings:
    """How the target writes its own prompts."""

    num_prompts: int = 64
    """Prompts to keep after dropping duplicates, empty and over-long ones."""
    seed: int = 0
    """Base seed; request i is sent seed derived from (seed, i), so a rerun asks the same."""
    temperature: float = 1.0
    """Sampling temperature of the user turn (Magpie needs diversity: keep it near 1)."""
    top_p: float = 1.0
    """Nucleus sampling mass of the user turn."""
    max_tokens: int = 128
    """Longest user turn in tokens; one that does not end within it is dropped as over-long."""
    min_chars: int = 8
    """Shorter user turns (after stripping) are dropped as empty."""
    max_chars: int = 2000
    """Longer user turns are dropped as over-long."""
    system_prompt: str | None = None
    """System message of the prompts; None keeps the template's default."""
    multi_turn_fraction: float = 0.0
    """Share of prompts with `num_turns` user turns (follow-ups sampled after the target's answer)."""
    num_turns: int = 2
    """User turns of a multi-turn prompt."""
    answer_max_tokens: int = 128
    """Length of the (greedy) answer a follow-up turn is conditioned on; not stored."""
    max_requests: int | None = None
    """Stop after this many candidates (default 4 x num_prompts) even if short of num_prompts."""
    skip_special_tokens_in_prompt: bool = True
    """Send `add_special_tokens: false`: the template text already carries any BOS."""
    user_openings: tuple[str, ...] = ()
    """Words a first user turn starts with, one drawn per candidate (seeded); the target writes
    the rest. Steers a small target's prompts across task types (`TASK_OPENINGS`); empty: the
    template alone, whose prompts follow the target's favourite topics."""
    user_topics: tuple[str, ...] = ()
    """Subjects put into an opening's `{topic}` (one drawn per candidate, seeded), e.g.
    `load_topics()`; needed when an opening has `{topic}`."""

    def __post_init__(self) -> None:
        problems = []
        if self.num_prompts < 1:
            problems.append(f"num_prompts {self.num_prompts} < 1")
        if self.num_turns < 1:
            problems.append(f"num_turns {self.num_turns} < 1")
        if not 0 <= self.multi_turn_fraction <= 1:
            problems.append(f"multi_turn_fraction {self.multi_turn_fraction} outside [0, 1]")
        if any(not o.strip() for o in self.user_openings):
            problems.append("user_openings has an empty opening")
        if any(not t.strip() for t in self.user_topics):
            problems.append("user_topics has an empty topic")
        if not self.user_topics and any("{topic}" in o for o in self.user_openings):
            problems.append("an opening has {topic} but user_topics is empty: give topics (load_topics()) or drop those openings")
        if self.max_tokens < 1 or self.min_chars > self.max_chars:
            problems.append(f"max_tokens {self.max_tokens} / min_chars {self.min_chars} / max_chars {self.max_chars} leave no room")
        if problems:
            raise ValueError("invalid Magpie settings: " + "; ".join(problems))


@dataclass
class MagpieStats:
    """What the synthesis asked for and what it dropped, per reason."""

    requested: int = 0
    kept: int = 0
    dropped_empty: int = 0
    dropped_too_long: int = 0
    dropped_duplicate: int = 0
    dropped_mt_bench: int = 0
    unused: int = 0
    """Good candidates of the last batch beyond num_prompts."""
    failed: int = 0
    errors: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _request_seed(seed: int, index: int, turn: int) -> int:
    return int(stable_id("magpie", seed, index, turn)[:8], 16)


async def _candidate(client: InferenceClient, template: ChatTemplate, s: MagpieSettings, index: int) -> tuple[str, list[str]]:
    """(verdict, turns): verdict "ok", "empty" or "too_long"; turns sampled so far."""
    multi = random.Random(_request_seed(s.seed, index, -1)).random() < s.multi_turn_fraction
    history: list[dict] = [{"role": "system", "content": s.system_prompt}] if s.system_prompt is not None else []
    turns: list[str] = []
    openings = s.user_openings
    opening = openings[random.Random(_request_seed(s.seed, index, -2)).randrange(len(openings))] if openings else ""
    if "{topic}" in opening:
        topic = s.user_topics[random.Random(_request_seed(s.seed, index, -3)).randrange(len(s.user_topics))]
        opening = opening.replace("{topic}", topic)
    for turn in range(s.num_turns if multi else 1):
        params = {
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "seed": _request_seed(s.seed, index, turn),
            "stop": [template.end_of_turn],
            "stop_token_ids": [template.end_of_turn_id],
        }
        if s.skip_special_tokens_in_prompt:
            params["add_special_tokens"] = False
        start = opening if turn == 0 else ""
        out = await client.complete(template.user_prefix(history) + start, params)
        text = (start + out.content).strip()
        if out.finish_reason == "length" or len(text) > s.max_chars:
            return "too_long", turns
        if len(text) < s.min_chars or (start and not out.content.strip()):
            return "empty", turns
        turns.append(text)
        history.append({"role": "user", "content": text})
        if turn + 1 < (s.num_turns if multi else 1):
            answer = await client.chat(history, {"max_tokens": s.answer_max_tokens, "temperature": 0.0})
            history.append({"role": "assistant", "content": answer.content})
    return "ok", turns


async def synthesize_prompts_async(
    client: InferenceClient,
    template: ChatTemplate,
    settings: MagpieSettings,
    progress: Callable[[str], None] | None = None,
) -> tuple[list[Prompt], MagpieStats]:
    """Magpie prompts from the target itself; kept in request order, so the result is reproducible."""
    s = settings
    stats = MagpieStats()
    kept: list[Prompt] = []
    seen: set[str] = set()
    mt_bench = mt_bench_hashes()
    budget = s.max_requests or 4 * s.num_prompts
    index = 0
    while len(kept) < s.num_prompts and index < budget:
        # Ask for a little more than is missing: some candidates will be dropped.
        batch = min(budget - index, max(client.settings.concurrency, int((s.num_prompts - len(kept)) * 1.25) + 1))
        results = await asyncio.gather(*(_candidate(client, template, s, i) for i in range(index, index + batch)), return_exceptions=True)
        for i, result in zip(range(index, index + batch), results):
            stats.requested += 1
            if isinstance(result, BaseException):
                if not isinstance(result, Exception) or isinstance(result, ServerStalled):
                    raise result  # a stalled server fails every candidate left: stop, naming it
                stats.failed += 1
                stats.errors.append(f"candidate {i}: {result}")
                continue
            verdict, turns = result
            if verdict == "empty":
                stats.dropped_empty += 1
            elif verdict == "too_long":
                stats.dropped_too_long += 1
            elif any(text_hash(t) in mt_bench for t in turns):
                stats.dropped_mt_bench += 1
            elif normalize_text(turns[0]) in seen:
                stats.dropped_duplicate += 1
            elif len(kept) >= s.num_prompts:
                stats.unused += 1
            else:
                seen.add(normalize_text(turns[0]))
                kept.append(Prompt.make(turns, system=s.system_prompt, source="magpie", origin=f"magpie candidate {i}"))
        index += batch
        if stats.failed and stats.failed == stats.requested:
            raise RuntimeError(f"every Magpie request failed; first error: {stats.errors[0]}")
        if progress:
            progress(f"magpie: {len(kept)}/{s.num_prompts} prompts kept after {stats.requested} requests")
    stats.kept = len(kept)
    return kept, stats


def synthesize_prompts(
    server: ClientSettings,
    tokenizer: Any,
    settings: MagpieSettings,
    progress: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[list[Prompt], MagpieStats]:
    """Synchronous entry point: checks the server, then runs `synthesize_prompts_async`; `log`
    hears when requests wait with none finished. A server that takes requests and finishes none
    within a request's deadline raises the client's `ServerStalled`."""
    template = ChatTemplate(tokenizer)

    async def run() -> tuple[list[Prompt], MagpieStats]:
        async with InferenceClient(server, log=log) as client:
            await client.check_server()
            return await synthesize_prompts_async(client, template, settings, progress)

    return asyncio.run(run())
