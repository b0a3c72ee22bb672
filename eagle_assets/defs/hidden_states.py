"""`vocab_mapping` and `hidden_state_shards`: the draft vocabulary and the target's features."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

from contextlib import closing
from typing import Optional

import dagster as dg
import torch

from eagle_assets.corpus.store import CorpusStore
from eagle_assets.corpus.target import target_fingerprint
from eagle_assets.defs.common import GROUP, check_result, hash_files, metadata, stage_version, target_of
from eagle_assets.defs.corpus import synthetic_corpus
from eagle_assets.drafter.warm_start import parent_layer_ids
from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, shard_name
from eagle_assets.hidden_states.budget import predict_bytes
from eagle_assets.hidden_states.corpus_io import corpus_token_counts
from eagle_assets.hidden_states.engine_extract import EngineExtractor, EngineStateClient, final_norm_of
from eagle_assets.hidden_states.extract import ExtractSettings, extract_shard, load_target
from eagle_assets.hidden_states.reader import ShardReader
from eagle_assets.hidden_states.source import choose_source, hf_loadable
from eagle_assets.hidden_states.vocab import (
    build_vocab_mapping,
    count_assistant_tokens,
    load_parent_mapping,
    save_vocab_mapping,
)
from eagle_assets.hub_target import drafter_folder
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.settings_env import env_int

NUM_SHARDS = env_int("EAGLE_ASSETS_NUM_SHARDS", 4, min=1)
"""Hidden-state partitions. Samples go to shards by a stable hash of their id, so one shard
can be rebuilt alone; changing the count re-assigns samples (rebuild all shards then)."""
shard_partitions = dg.StaticPartitionsDefinition([f"{i:05d}" for i in range(NUM_SHARDS)])


class VocabConfig(dg.Config):
    draft_vocab_size: Optional[int] = None
    """Top-N target tokens by frequency over assistant tokens; default: the target preset's."""
    parent_drafter: Optional[str] = None
    """Warm start: the parent drafter (a folder, or a hub id pulled with `eagle-assets target
    pull`); its d2t/t2d are taken as they are, never rebuilt."""


@dg.asset(
    group_name=GROUP,
    deps=[synthetic_corpus],
    code_version=stage_version("hidden_states/vocab.py", "defs/hidden_states.py", VocabConfig),
    check_specs=[
        dg.AssetCheckSpec(
            "consistent", asset="vocab_mapping", blocking=True, description="d2t and t2d describe the same draft vocabulary within the target's."
        )
    ],
)
def vocab_mapping(context: dg.AssetExecutionContext, config: VocabConfig, inference_server: InferenceServerResource, storage: StorageResource):
    """The draft vocabulary: the N most frequent target tokens in the corpus's assistant turns,
    as `d2t` (target_id = draft_id + d2t[draft_id]) and `t2d`. On a warm start it is the
    parent drafter's own mapping, kept as it is so that the parent's lm_head stays aligned."""
    preset, _ = target_of(inference_server)
    storage.fetch(storage.corpus(preset.name), log=context.log.info)
    corpus = str(storage.corpus(preset.name))
    counts = count_assistant_tokens(corpus, preset.vocab_size)
    if config.parent_drafter:
        mapping = load_parent_mapping(drafter_folder(config.parent_drafter), vocab_size=preset.vocab_size)
        context.log.info(f"vocab mapping inherited from the parent drafter {config.parent_drafter}")
    else:
        mapping = build_vocab_mapping(counts, preset.vocab_size, config.draft_vocab_size or preset.draft_vocab_size)
    out = save_vocab_mapping(mapping, storage.vocab_mapping(preset.name))
    storage.publish(out, log=context.log.info)
    covered = float(counts[mapping.t2d].sum()) / max(1, int(counts.sum()))
    yield dg.MaterializeResult(
        metadata=metadata({**mapping.metadata(), "corpus_coverage": covered, "path": str(out)}),
        data_version=dg.DataVersion(hash_files([out])),
    )
    target_ids = mapping.target_ids
    consistent = (
        int(mapping.t2d.sum()) == mapping.draft_vocab_size
        and bool(mapping.t2d[target_ids].all())
        and int(target_ids.max()) < preset.vocab_size
        and len(mapping.t2d) == preset.vocab_size
    )
    yield check_result(consistent, {"draft_vocab_size": mapping.draft_vocab_size, "vocab_size": len(mapping.t2d)}, check_name="consistent")


class HiddenStatesConfig(dg.Config):
    aux_layer_ids: Optional[list[int]] = None
    """Aux ids (HF hidden_states numbering); default: the parent drafter's, else the preset's (2, L//2, L-3)."""
    parent_drafter: Optional[str] = None
    """Warm start: the parent drafter (a folder, or a hub id pulled with `eagle-assets target
    pull`); the states are taken at its layers. A parent whose config does not say how its ids
    count is taken at both readings' layers (`parent_numbering`)."""
    parent_numbering: str = "measure"
    """How an unmarked parent's ids count: "measure" (the states of both readings are kept; the
    trainer measures the parent's acceptance at each and trains at the better), "vllm" (as
    written) or "sglang" (one more)."""
    source: str = "auto"
    """"engine" (the serving engine extracts them: vLLM's extract_hidden_states, one server for
    every shard), "hf" (a Hugging Face forward pass here) or "auto": the preset's choice, else the
    engine wherever the target needs several GPUs or transformers cannot load it."""
    batch_tokens: int = 8192
    """Hugging Face: padded tokens per forward pass."""
    device: str = "auto"
    """Hugging Face: "auto" (every visible GPU, layers spread by accelerate's device_map; the
    host where there is none), "cpu", "cuda" or "cuda:N"."""
    max_memory_per_device: Optional[str] = None
    """Hugging Face with device "auto": the most each device may hold (e.g. "130GiB"), leaving
    room for activations; default: what it has."""
    engine_concurrency: int = 16
    """Engine: samples in flight at once (the engine batches them)."""


def _device(choice: str) -> str:
    if choice == "auto":
        return "auto" if torch.cuda.is_available() else "cpu"
    return "auto" if choice == "balanced" else choice


def extraction_settings(config: HiddenStatesConfig, preset) -> ExtractSettings:
    return ExtractSettings(
        aux_layer_ids=tuple(config.aux_layer_ids or parent_ids(config, preset) or preset.default_aux_layer_ids),
        num_shards=NUM_SHARDS,
        batch_tokens=config.batch_tokens,
    )


def parent_ids(config: HiddenStatesConfig, preset) -> tuple[int, ...]:
    """The layers a warm start from `config.parent_drafter` needs (`drafter/warm_start.py`); () without one."""
    if not config.parent_drafter:
        return ()
    return parent_layer_ids(drafter_folder(config.parent_drafter), preset.num_layers, config.parent_numbering)


def stage_bytes(config: HiddenStatesConfig, preset, corpus: str) -> int:
    """Bytes the whole stage writes: every shard (a partition rebuilds its shard whole, and the
    old one goes only once the new one is in place)."""
    settings = extraction_settings(config, preset)
    counts = corpus_token_counts(corpus, NUM_SHARDS)
    tokens = sum(sum(shard.values()) for shard in counts.values())
    samples = sum(len(shard) for shard in counts.values())
    return predict_bytes(tokens, len(settings.aux_layer_ids), preset.hidden_size, samples, NUM_SHARDS)


def hidden_states_source(config: HiddenStatesConfig, preset, path) -> str:
    """ "engine" or "hf" for this target (`hidden_states/source.py`); transformers is asked
    whether it loads the target (running its remote configuration code) only where the
    choice turns on it."""
    return choose_source(config.source, preset, lambda: hf_loadable(path, preset.trust_remote_code))


def engine_layer_ids(settings: ExtractSettings, preset) -> list[int]:
    """What the extraction server captures: the aux ids and L (r_L, for the normed final state)."""
    return sorted(set(settings.aux_layer_ids) | {preset.num_layers})


def engine_max_model_len(preset, corpus: str) -> int:
    """Context the extraction server needs: the longest sample (or the preset's context) and the
    one token it generates."""
    longest = max((n for shard in corpus_token_counts(corpus, 1).values() for n in shard.values()), default=0)
    return max(longest, preset.max_model_len) + 1


@dg.asset(
    group_name=GROUP,
    deps=[synthetic_corpus],
    partitions_def=shard_partitions,
    code_version=stage_version("hidden_states", "formats.py", "defs/hidden_states.py", HiddenStatesConfig),
    check_specs=[
        dg.AssetCheckSpec(
            "matches_corpus", asset="hidden_state_shards", blocking=True, description="The shard holds exactly its corpus samples, token for token."
        )
    ],
)
def hidden_state_shards(
    context: dg.AssetExecutionContext, config: HiddenStatesConfig, inference_server: InferenceServerResource, storage: StorageResource
):
    """The target's auxiliary hidden states and its normed final state for every corpus token,
    one partition per shard (bf16 safetensors + JSON manifest), written atomically. They come
    from the serving engine (vLLM's extract_hidden_states: the target as it is served, one
    server for every shard) or from a Hugging Face forward pass here; only the configured
    layers are kept, and free disk space is checked before anything is written."""
    preset, path = target_of(inference_server)
    index = int(context.partition_key)
    # The corpus only: a shard is rebuilt whole, never resumed, so its earlier output is not needed here.
    storage.fetch(storage.corpus(preset.name), log=context.log.info)
    settings = extraction_settings(config, preset)
    corpus = str(storage.corpus(preset.name))
    fingerprint = target_fingerprint(path)
    out = storage.hidden_states(preset.name)
    source = hidden_states_source(config, preset, path)
    context.log.info(f"hidden states of shard {index} from {'the serving engine' if source == 'engine' else 'Hugging Face'}")
    if source == "engine":
        ids = engine_layer_ids(settings, preset)
        with inference_server.extraction_server(ids, engine_max_model_len(preset, corpus), log=context.log.info) as server:
            client = EngineStateClient(server.base_url, server.model, ids, api_key=server.api_key, concurrency=config.engine_concurrency)
            with closing(client), EngineExtractor(client, settings, preset.num_layers, preset.hidden_size, preset.vocab_size,
                                                  final_norm_of(path)) as extractor:  # fmt: skip
                result = extract_shard(extractor, corpus, out, index, settings, target_fingerprint=fingerprint)
    else:
        device = _device(config.device)
        # CPUs without bf16 matrix units run a bf16 forward several times slower than fp32; the
        # states are stored as bf16 either way.
        model, tokenizer = load_target(path, device=device, dtype=torch.float32 if device == "cpu" else torch.bfloat16,
                                       max_memory_per_device=config.max_memory_per_device,
                                       trust_remote_code=preset.trust_remote_code)  # fmt: skip
        result = extract_shard(model, corpus, out, index, settings, tokenizer=tokenizer, target_fingerprint=fingerprint)
    manifest = result.manifest
    shard_dir = out / shard_name(index)
    storage.publish(shard_dir, log=context.log.info)  # this partition's shard only: the others are other runs'
    yield dg.MaterializeResult(
        metadata=metadata(
            {
                "samples": len(manifest.sample_ids),
                "tokens": sum(manifest.token_counts),
                "aux_layer_ids": manifest.aux_layer_ids,
                "layer_id_convention": manifest.layer_id_convention,
                "source": manifest.extra.get("source"),
                "bytes": (shard_dir / SHARD_STATES_FILE).stat().st_size,
                "bytes_per_token": manifest.bytes_per_token,
                "tokens_per_s": round(result.tokens_per_s, 1),
                "path": str(shard_dir),
            }
        ),
        data_version=dg.DataVersion(hash_files([shard_dir / SHARD_MANIFEST_FILE, shard_dir / SHARD_STATES_FILE])),
    )
    expected = corpus_token_counts(corpus, NUM_SHARDS).get(index, {})
    reader = ShardReader(shard_dir)
    got = dict(zip(reader.sample_ids, reader.manifest.token_counts))
    passed = got == expected
    yield check_result(
        passed,
        {"samples": len(got), "expected_samples": len(expected), "missing": sorted(set(expected) - set(got))[:10]},
        check_name="matches_corpus",
    )


def corpus_rows(storage: StorageResource, target: str) -> int:
    return CorpusStore(str(storage.corpus(target)), mode="r").num_rows
