"""`prompts` and `synthetic_corpus`: what the target is asked, and its own answers."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

from typing import Optional

import dagster as dg

from eagle_assets.corpus import checks as corpus_checks
from eagle_assets.corpus.client import ClientSettings
from eagle_assets.corpus.generate import SamplingParams, failed_share_problem, generate_corpus
from eagle_assets.corpus.prompts import MagpieSettings, load_prompt_file, synthesize_prompts, write_prompts
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.corpus.target import load_tokenizer, target_fingerprint
from eagle_assets.defs.common import GROUP, check_result, hash_tree, metadata, stage_version, target_of
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource

PROMPTS_FILE = "prompts.jsonl"


class PromptsConfig(dg.Config):
    """Where training prompts come from: a file of yours, or the target itself (Magpie)."""

    source: str = "magpie"
    """"magpie" (the target writes them; needs no data set) or "file"."""
    file_url: Optional[str] = None
    """JSONL or Parquet at any fsspec URL, rows with `messages` or `prompt` (source "file")."""
    num_prompts: int = 48
    seed: int = 0
    multi_turn_fraction: float = 0.25
    """Share of prompts with a follow-up user turn."""
    max_prompt_tokens: int = 96
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


@dg.asset(group_name=GROUP, code_version=stage_version("corpus/prompts.py", "defs/corpus.py", PromptsConfig))
def prompts(
    context: dg.AssetExecutionContext,
    config: PromptsConfig,
    inference_server: InferenceServerResource,
    storage: StorageResource,
) -> dg.MaterializeResult:
    """Training prompts. By default the target writes them itself (Magpie-style: the chat
    template is rendered up to a user turn and the target samples the user message), so the
    embedded default needs no data set. MT-Bench is kept for evaluation and refused here."""
    preset, path = target_of(inference_server)
    out = storage.prompts(preset.name)
    out.mkdir(parents=True, exist_ok=True)
    if config.source == "file":
        if not config.file_url:
            raise ValueError("prompts.source is 'file' but file_url is empty: give the JSONL or Parquet URL")
        items = load_prompt_file(config.file_url, purpose="training")
        stats = {"source": config.file_url}
    elif config.source == "magpie":
        settings = MagpieSettings(
            num_prompts=config.num_prompts,
            seed=config.seed,
            temperature=config.temperature,
            max_tokens=config.max_prompt_tokens,
            multi_turn_fraction=config.multi_turn_fraction,
            user_openings=tuple(config.user_openings),
            user_topics=tuple(config.user_topics),
        )
        tokenizer = load_tokenizer(path)
        with inference_server.serve(log=context.log.info) as server:
            client = ClientSettings(base_url=server.base_url, model=server.model, api_key=server.api_key)
            items, magpie = synthesize_prompts(client, tokenizer, settings, progress=context.log.info)
            errors = [(e.split(": ", 1)[-1],) * 2 for e in magpie.errors]  # without "candidate N: "; the message is the kind
            problem = failed_share_problem(magpie.failed, magpie.requested, config.max_error_rate, "Magpie requests", errors)
            if problem:  # raised inside the block: a server that died is named, with its log
                raise RuntimeError(f"{problem}. No prompts were written; fix the cause and rerun (prompts.max_error_rate "
                                   "sets the share allowed).")  # fmt: skip
        stats = magpie.as_dict()
    else:
        raise ValueError(f"prompts.source must be 'magpie' or 'file', not {config.source!r}")
    if not items:
        raise RuntimeError("no prompts were produced: see the log for why candidates were dropped")
    write_prompts(items, str(out / PROMPTS_FILE))
    turns = [len([m for m in p.to_messages() if m["role"] == "user"]) for p in items]
    return dg.MaterializeResult(
        metadata=metadata(
            {
                "num_prompts": len(items),
                "multi_turn": sum(t > 1 for t in turns),
                "path": str(out / PROMPTS_FILE),
                "preview": [p.to_messages()[-1]["content"][:120] for p in items[:5]],
                **{f"magpie_{k}": v for k, v in stats.items()},
            }
        ),
        data_version=dg.DataVersion(hash_tree(out)),
    )


class CorpusConfig(dg.Config):
    """How the target answers the prompts."""

    temperature: float = 0.0
    """0 = greedy: the drafter learns the target's most likely continuation."""
    max_tokens: int = 256
    concurrency: int = 8
    request_timeout_s: float = 600
    max_retries: int = 4
    max_error_rate: float = 0.02
    """The run fails when more than this share of the samples it tried failed (saying how many
    and the commonest errors; the finished ones stay stored for a rerun), and the error_rate
    check fails above this share of the corpus's failed samples."""
    shard_size: int = 64
    """Rows per Parquet shard; a crash loses at most the unflushed rows."""


@dg.asset(
    group_name=GROUP,
    deps=[prompts],
    code_version=stage_version("corpus", "defs/corpus.py", CorpusConfig),
    check_specs=[
        dg.AssetCheckSpec("error_rate", asset="synthetic_corpus", blocking=True, description="Failed samples stay under max_error_rate."),
        dg.AssetCheckSpec("reasoning_captured", asset="synthetic_corpus", blocking=True, description="Every sample carries reasoning when the target reasons."),
        dg.AssetCheckSpec("unique_ids", asset="synthetic_corpus", blocking=True, description="No sample id twice."),
        dg.AssetCheckSpec("token_round_trip", asset="synthetic_corpus", blocking=True, description="Stored ids equal apply_chat_template of the rebuilt conversation."),
    ],
)
def synthetic_corpus(
    context: dg.AssetExecutionContext,
    config: CorpusConfig,
    inference_server: InferenceServerResource,
    storage: StorageResource,
):
    """The target's own answers to the prompts, from its real inference server, with reasoning
    re-wrapped in its thinking tokens through its chat template; token ids and a loss mask per
    sample. Resumable: a rerun skips finished samples and a killed run loses nothing."""
    preset, path = target_of(inference_server)
    tokenizer = load_tokenizer(path)
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
        try:
            stats = generate_corpus(
                items, store, client, tokenizer, target=fingerprint, sampling=sampling,
                progress=lambda s: context.log.info(s.summary()), show_progress_bar=True, max_failed_share=config.max_error_rate,
            )  # fmt: skip
        finally:
            store.close()
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
