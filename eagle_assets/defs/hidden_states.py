"""`vocab_mapping` and `hidden_state_shards`: the draft vocabulary and the target's features."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

from contextlib import closing
from typing import Optional

import dagster as dg
import torch

from eagle_assets.corpus.store import CorpusStore
from eagle_assets.corpus.target import target_fingerprint
from eagle_assets.defs.code_versions import code_version
from eagle_assets.defs.common import GROUP, check_result, hash_files, metadata, target_of
from eagle_assets.defs.corpus import synthetic_corpus
from eagle_assets.defs.hidden_state_settings import (
    NUM_SHARDS,
    HiddenStatesConfig,
    drafter_training_source,
    engine_layer_ids,
    engine_max_model_len,
    extraction_device,
    extraction_settings,
    hidden_states_source,
)
from eagle_assets.defs.settings import with_defaults
from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE
from eagle_assets.hidden_states.budget import check_free_space
from eagle_assets.hidden_states.corpus_io import corpus_token_counts
from eagle_assets.hidden_states.engine_extract import EngineExtractor, EngineStateClient, final_norm_of
from eagle_assets.hidden_states.extract import bytes_to_extract, extract_all, load_target
from eagle_assets.hidden_states.reader import ShardReader
from eagle_assets.hidden_states.vocab import (
    build_vocab_mapping,
    count_assistant_tokens,
    load_parent_mapping,
    save_vocab_mapping,
)
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.targets.hub import drafter_folder


class VocabConfig(dg.Config):
    draft_vocab_size: Optional[int] = None
    """Top-N target tokens by frequency over assistant tokens; default: the target preset's."""
    parent_drafter: Optional[str] = None
    """Warm start: the parent drafter (a folder, or a hub id pulled with `eagle-assets target
    pull`); its d2t/t2d are taken as they are, never rebuilt."""


VocabSettings = with_defaults(VocabConfig, "vocab_mapping")
"""VocabConfig with the code location's settings as defaults (defs/settings.py)."""


@dg.asset(
    group_name=GROUP,
    deps=[synthetic_corpus],
    code_version=code_version("vocab_mapping", VocabSettings),
    check_specs=[
        dg.AssetCheckSpec(
            "consistent", asset="vocab_mapping", blocking=True, description="d2t and t2d describe the same draft vocabulary within the target's."
        )
    ],
)
def vocab_mapping(context: dg.AssetExecutionContext, config: VocabSettings, inference_server: InferenceServerResource, storage: StorageResource):
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


ShardSettings = with_defaults(HiddenStatesConfig, "hidden_state_shards")
"""HiddenStatesConfig with the code location's settings as defaults (defs/settings.py)."""


@dg.asset(
    group_name=GROUP,
    deps=[synthetic_corpus],
    code_version=code_version("hidden_state_shards", ShardSettings),
    check_specs=[
        dg.AssetCheckSpec(
            "matches_corpus", asset="hidden_state_shards", blocking=True, description="Every shard holds exactly its corpus samples, token for token."
        )
    ],
)
def hidden_state_shards(
    context: dg.AssetExecutionContext, config: ShardSettings, inference_server: InferenceServerResource, storage: StorageResource
):
    """The target's auxiliary hidden states and its normed final state for every corpus token,
    in NUM_SHARDS shards (bf16 safetensors + JSON manifest), each written atomically; a rerun
    keeps every finished shard that still matches the corpus and settings. They come from the
    serving engine (vLLM's extract_hidden_states: the target as it is served, one server for
    every shard) or from a Hugging Face forward pass here (the target loaded once); only the
    configured layers are kept, and free disk space is checked before anything is written."""
    preset, path = target_of(inference_server)
    out = storage.hidden_states(preset.name)
    # The corpus, and the shards a failed run finished elsewhere (they are kept).
    storage.fetch(storage.corpus(preset.name), out, log=context.log.info)
    training = drafter_training_source(preset, path, storage, config)
    if training != "shards":
        # The drafter trains online: its states never touch the disk, so none are extracted here.
        reason = f"not built: the drafter trains online, its states from the {training} (drafter_checkpoint's hidden_states)"
        context.log.info(reason)
        yield dg.MaterializeResult(
            metadata=metadata({"built": False, "reason": reason, "path": str(out)}), data_version=dg.DataVersion(f"online-{training}")
        )
        yield check_result(True, {"note": reason}, check_name="matches_corpus")
        return
    settings = extraction_settings(config, preset)
    corpus = str(storage.corpus(preset.name))
    fingerprint = target_fingerprint(path)
    source = hidden_states_source(config, preset, path)
    context.log.info(f"hidden states of {NUM_SHARDS} shards from {'the serving engine' if source == 'engine' else 'Hugging Face'}")
    try:
        if source == "engine":
            # The disk checked before the server loads (minutes for a large target), not after;
            # `extract_all` then reserves the stage's bytes before its first shard.
            check_free_space(out, bytes_to_extract(out, corpus, settings, preset.num_layers, preset.hidden_size, fingerprint))
            ids = engine_layer_ids(settings, preset)
            with inference_server.extraction_server(ids, engine_max_model_len(preset, corpus), log=context.log.info) as server:
                client = EngineStateClient(server.base_url, server.model, ids, api_key=server.api_key, concurrency=config.engine_concurrency)
                with (
                    closing(client),
                    EngineExtractor(client, settings, preset.num_layers, preset.hidden_size, preset.vocab_size, final_norm_of(path)) as extractor,
                ):
                    results = extract_all(extractor, corpus, out, settings, target_fingerprint=fingerprint)
        else:
            device = extraction_device(config.device)
            # CPUs without bf16 matrix units run a bf16 forward several times slower than fp32; the
            # states are stored as bf16 either way.
            model, tokenizer = load_target(
                path,
                device=device,
                dtype=torch.float32 if device == "cpu" else torch.bfloat16,
                max_memory_per_device=config.max_memory_per_device,
                trust_remote_code=preset.trust_remote_code,
            )
            results = extract_all(model, corpus, out, settings, tokenizer=tokenizer, target_fingerprint=fingerprint)
    finally:  # a failed run's finished shards too: a rerun elsewhere keeps them
        storage.publish(out, log=context.log.info)
    built = [r for r in results if r.built]
    kept = len(results) - len(built)
    context.log.info(f"{len(built)} shard(s) extracted, {kept} kept from an earlier run")
    files = [r.shard_dir / name for r in results for name in (SHARD_MANIFEST_FILE, SHARD_STATES_FILE)]
    tokens = sum(sum(r.manifest.token_counts) for r in results)
    seconds = sum(r.seconds for r in built)
    yield dg.MaterializeResult(
        metadata=metadata(
            {
                "shards": len(results),
                "shards_extracted": len(built),
                "shards_kept": kept,
                "samples": sum(len(r.manifest.sample_ids) for r in results),
                "tokens": tokens,
                "aux_layer_ids": results[0].manifest.aux_layer_ids if results else [],
                "layer_id_convention": results[0].manifest.layer_id_convention if results else None,
                "source": source,
                "bytes": sum((r.shard_dir / SHARD_STATES_FILE).stat().st_size for r in results),
                "tokens_per_s": round(sum(sum(r.manifest.token_counts) for r in built) / seconds, 1) if seconds else None,
                "path": str(out),
            }
        ),
        data_version=dg.DataVersion(hash_files(files)),
    )
    expected = corpus_token_counts(corpus, NUM_SHARDS)
    wrong = []
    for r in results:
        reader = ShardReader(r.shard_dir)
        if dict(zip(reader.sample_ids, reader.manifest.token_counts)) != expected.get(r.manifest.shard, {}):
            wrong.append(r.shard_dir.name)
    counted = {i for i, samples in expected.items() if samples}
    missing = sorted(counted - {r.manifest.shard for r in results})
    yield check_result(
        not wrong and not missing,
        {"shards": len(results), "differ_from_corpus": wrong, "missing_shards": missing},
        check_name="matches_corpus",
    )


def corpus_rows(storage: StorageResource, target: str) -> int:
    return CorpusStore(str(storage.corpus(target)), mode="r").num_rows
