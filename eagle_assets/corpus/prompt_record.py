"""What a prompt is, and the rows a prompt file holds: `Prompt`, the row readers every format
ends in (`row_to_prompt`), and the MT-Bench guard that keeps the evaluation set out of training.
Apart from `prompts.py` and `prompt_formats.py` so that both import it and neither the other."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from eagle_assets.formats import stable_id

MT_BENCH_PATH = Path(__file__).resolve().parent.parent / "data" / "mt_bench_questions.jsonl"
TRAINING_SOURCES = ("file", "magpie", "sharegpt")


class PromptFileError(ValueError):
    """A prompt file that cannot be read, or a row in it that is not a prompt."""


class EvaluationDataError(ValueError):
    """Evaluation prompts (MT-Bench) offered as training data."""


@dataclass(frozen=True)
class Prompt:
    """One prompt: optional system message and the user turns the target answers one by one."""

    prompt_id: str
    """stable_id of (system, turns): the same text gives the same id on every machine."""
    turns: tuple[str, ...]
    """User messages, replayed turn by turn; the target writes every answer."""
    system: str | None = None
    """System message; None lets the chat template use its default."""
    source: str = "file"
    """`file`, `magpie`, `sharegpt` or `mt_bench`."""
    origin: str = ""
    """Where it came from (`file.jsonl line 12`, `file.parquet row 12`), for error messages."""

    @classmethod
    def make(cls, turns: Sequence[str], system: str | None = None, source: str = "file", origin: str = "") -> "Prompt":
        turns = tuple(turns)
        return cls(prompt_id=stable_id("prompt", system, list(turns)), turns=turns, system=system, source=source, origin=origin)

    def to_messages(self) -> list[dict]:
        """The prompt as an OpenAI chat list (user turns only, no answers)."""
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return head + [{"role": "user", "content": t} for t in self.turns]


# ---- MT-Bench guard ---------------------------------------------------------------------
def normalize_text(text: str) -> str:
    """Casefolded, NFKC, whitespace collapsed: what "the same prompt" means for dedup and guards."""
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text)).strip().casefold()


def text_hash(text: str) -> str:
    return hashlib.sha256(normalize_text(text).encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def mt_bench_hashes() -> frozenset[str]:
    """Hashes of every MT-Bench turn (normalised text), to recognise the questions under any name."""
    hashes = set()
    with open(MT_BENCH_PATH, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                hashes.update(text_hash(t) for t in json.loads(line)["turns"])
    return frozenset(hashes)


def is_mt_bench_url(url: str) -> bool:
    name = posixpath.basename(str(url).rstrip("/")).lower().replace("-", "_")
    return "mt_bench" in name or "mtbench" in name


def ensure_training_prompts(prompts: Iterable[Prompt]) -> None:
    """Raise `EvaluationDataError` if any prompt is, or contains, an MT-Bench question."""
    hashes = mt_bench_hashes()
    leaked = [p for p in prompts if p.source == "mt_bench" or any(text_hash(t) in hashes for t in p.turns)]
    if leaked:
        where = "; ".join(f"{p.origin or p.prompt_id}: {p.turns[0][:60]!r}" for p in leaked[:3])
        raise EvaluationDataError(
            f"{len(leaked)} prompt(s) are MT-Bench questions ({where}). MT-Bench is the evaluation "
            "set: training on it would inflate the benchmark's acceptance. Remove them from the "
            "training prompts (use load_mt_bench() only for benchmark_report)."
        )


def load_mt_bench(path: str | Path = MT_BENCH_PATH) -> list[Prompt]:
    """The 80 MT-Bench questions (two turns each), for evaluation only."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                q = json.loads(line)
                out.append(Prompt.make(q["turns"], source="mt_bench", origin=f"mt_bench question {q['question_id']}"))
    return out


# ---- user files -------------------------------------------------------------------------
def unicode_problem(text: str) -> str | None:
    """Why `text` is not Unicode text a tokenizer or server accepts, or None. Files are decoded
    with surrogateescape, so a byte that is not UTF-8 arrives as a surrogate U+DC80..U+DCFF and is
    named as that byte; any other lone surrogate came from a JSON escape such as \\ud800."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = text[exc.start]
        if 0xDC80 <= ord(char) <= 0xDCFF:
            return f"is not UTF-8 text (byte {ord(char) - 0xDC00:#04x} at character {exc.start}): save the file as UTF-8"
        return (
            f"holds a lone surrogate {char!r} at character {exc.start}, which is not Unicode text (a JSON escape "
            "such as \\ud800 without its pair): fix the text or drop the row"
        )
    return None


def _text(value: Any, where: str, what: str, may_be_empty: bool = False) -> str:
    """`value` as prompt text: a string (non-empty unless `may_be_empty`) that is valid Unicode,
    else a PromptFileError naming `what` and why. JSON may carry a lone surrogate (the escape \\ud800 without its
    pair), which Python decodes but no UTF-8 writer, tokenizer or server accepts."""
    if not isinstance(value, str):
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "..."
        raise PromptFileError(f"{where}: {what} must be text (a string), not {type(value).__name__} {shown}")
    if not value.strip() and not may_be_empty:
        raise PromptFileError(f"{where}: {what} is empty; give the text or drop the row")
    if problem := unicode_problem(value):
        raise PromptFileError(f"{where}: {what} {problem}")
    return value


def row_to_prompt(row: Mapping[str, Any], where: str) -> Prompt:
    source = row.get("source") if row.get("source") in (*TRAINING_SOURCES, "mt_bench") else "file"
    if row.get("messages") is not None:
        messages = row["messages"]
        if isinstance(messages, str):
            try:
                messages = json.loads(messages)
            except json.JSONDecodeError as exc:
                raise PromptFileError(f"{where}: `messages` is a string but not JSON ({exc})") from None
        if not isinstance(messages, (list, tuple)) or not messages:
            raise PromptFileError(f"{where}: `messages` must be a non-empty list of {{role, content}} objects")
        system, turns = None, []
        for k, m in enumerate(messages):
            role = m.get("role") if isinstance(m, Mapping) else None
            content = m.get("content") if isinstance(m, Mapping) else None
            if role == "system" and k == 0:
                system = _text(content, where, "message 0 (system)", may_be_empty=True) if content is not None else None
            elif role == "user":
                turns.append(_text(content, where, f"message {k} (user)"))
            elif role == "assistant":
                continue  # the target writes its own answers
            else:
                raise PromptFileError(
                    f"{where}: message {k} has role {role!r}; allowed are a first `system`, `user` and "
                    "`assistant` (ignored: the target writes its own answers)"
                )
        if not turns:
            raise PromptFileError(f"{where}: `messages` has no user turn")
        return Prompt.make(turns, system=system, source=source, origin=where)
    if row.get("prompt") is not None:
        return Prompt.make([_text(row["prompt"], where, "`prompt`")], source=source, origin=where)
    if row.get("turns") is not None:
        turns = row["turns"]
        if not isinstance(turns, (list, tuple)) or not turns:
            raise PromptFileError(f"{where}: `turns` must be a non-empty list of user messages (strings)")
        return Prompt.make([_text(t, where, f"`turns` item {k}") for k, t in enumerate(turns)], source=source, origin=where)
    raise PromptFileError(f"{where}: the row has neither `messages` (an OpenAI chat list) nor `prompt` (a string); its keys are {sorted(row)}")
