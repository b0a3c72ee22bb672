"""`prompts` and `synthetic_corpus`: what the target is asked, and its own answers."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import os
import posixpath
from typing import Optional

import dagster as dg
import fsspec

from eagle_assets.corpus import checks as corpus_checks
from eagle_assets.corpus.client import ClientSettings
from eagle_assets.corpus.generate import SamplingParams, generate_corpus
from eagle_assets.corpus.prompts import MagpieSettings, load_prompt_file, synthesize_prompts, write_prompts
from eagle_assets.corpus.store import CorpusStore
from eagle_assets.corpus.target import load_tokenizer, target_fingerprint
from eagle_assets.defs.common import GROUP, check_result, hash_tree, metadata, stage_version, target_of
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.paths import data_dir
from eagle_assets.resources.storage import StorageResource
from eagle_assets.settings_env import env_list, env_str

PROMPTS_FILE = "prompts.jsonl"
PROMPT_ROOTS_ENV = "EAGLE_ASSETS_PROMPT_ROOTS"


def prompt_roots() -> list[str]:
    """Where a run's `prompts.file_url` may read: the data folder, the folder the prompt sensor
    watches (EAGLE_ASSETS_PROMPTS_URL) and the folders or URL prefixes listed in
    EAGLE_ASSETS_PROMPT_ROOTS (comma-separated; `*` allows any). Anyone who may launch a run
    sets file_url, so without this limit a run could read any file the code location can."""
    watched = env_str("EAGLE_ASSETS_PROMPTS_URL")
    return [str(data_dir()), *([watched] if watched else []), *env_list(PROMPT_ROOTS_ENV)]


def check_prompt_url(url: str) -> None:
    """Refuse a prompt file outside `prompt_roots()`, naming the setting that allows it."""
    roots = prompt_roots()
    if "*" in roots or any(_url_under(url, root) for root in roots):
        return
    raise ValueError(
        f"prompts.file_url {url!r} lies outside the folders a run may read prompts from ({', '.join(roots)}): "
        f"move the file under one of them, or add its folder to {PROMPT_ROOTS_ENV} (comma-separated folders or "
        "URL prefixes; * allows any) in the code location's environment"
    )


def _url_key(url: str) -> tuple[str, str]:
    """(protocol, normalised path): local paths resolved through symbolic links and `..`."""
    protocol, path = fsspec.core.split_protocol(url)
    protocol = protocol or "file"
    if protocol in ("file", "local"):
        return "file", os.path.realpath(os.path.expanduser(path))
    return protocol, posixpath.normpath(path)


def _url_under(url: str, root: str) -> bool:
    if "::" in url:  # a chained URL (simplecache::s3://..., zip://...::file): only where a root names it
        return url == root or url.startswith(root.rstrip("/") + "/")
    (protocol, path), (root_protocol, root_path) = _url_key(url), _url_key(root)
    return protocol == root_protocol and (path == root_path or path.startswith(root_path.rstrip("/") + "/"))


class PromptsConfig(dg.Config):
    """Where training prompts come from: a file of yours, or the target itself (Magpie)."""

    source: str = "magpie"
    """"magpie" (the target writes them; needs no data set) or "file"."""
    file_url: Optional[str] = None
    """JSONL or Parquet at an fsspec URL, rows with `messages` or `prompt` (source "file"); it
    must lie under `prompt_roots()` (the data folder, EAGLE_ASSETS_PROMPTS_URL, EAGLE_ASSETS_PROMPT_ROOTS)."""
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
        check_prompt_url(config.file_url)
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
        tokenizer = load_tokenizer(path, trust_remote_code=preset.trust_remote_code)
        with inference_server.serve(log=context.log.info) as server:
            client = ClientSettings(base_url=server.base_url, model=server.model, api_key=server.api_key)
            items, magpie = synthesize_prompts(client, tokenizer, settings, progress=context.log.info)
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
    """The corpus check fails above this share of failed samples."""
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
        stats = generate_corpus(
            items, store, client, tokenizer, target=fingerprint, sampling=sampling,
            progress=lambda s: context.log.info(s.summary()), show_progress_bar=True,
        )  # fmt: skip
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
