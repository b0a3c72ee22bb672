"""The hidden-state stage's settings and the choices made from them: how many shards, which
layers, from which source, and where the drafter trains from. Kept apart from the assets so the
drafter's code version depends on these and not on the corpus or shard assets' code."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import shutil
from typing import Literal, Optional

import dagster as dg
import torch

from eagle_assets.defs.settings import location_settings
from eagle_assets.drafter.run_config import ParentNumbering, TrainConfig
from eagle_assets.drafter.warm_start import parent_layer_ids
from eagle_assets.hidden_states.budget import predict_bytes
from eagle_assets.hidden_states.corpus_io import corpus_token_counts
from eagle_assets.hidden_states.extract import ExtractSettings
from eagle_assets.hidden_states.reader import open_shards
from eagle_assets.hidden_states.source import SOURCES, choose_source, choose_training_source, hf_loadable
from eagle_assets.resources.storage import StorageResource
from eagle_assets.settings_env import env_int
from eagle_assets.targets.hub import drafter_folder

NUM_SHARDS = env_int("EAGLE_ASSETS_NUM_SHARDS", 4, min=1)
"""Hidden-state shards. Samples go to shards by a stable hash of their id, so a rerun rebuilds
only the shards whose samples changed or that a failure left unfinished; changing the count
re-assigns samples (every shard is rebuilt then). Why shards are not Dagster partitions:
docs/design.md, "How it runs"."""


class HiddenStatesConfig(dg.Config):
    aux_layer_ids: Optional[list[int]] = None
    """Aux ids (HF hidden_states numbering); default: the parent drafter's, else the preset's (2, L//2, L-3)."""
    parent_drafter: Optional[str] = None
    """Warm start: the parent drafter (a folder, or a hub id pulled with `eagle-assets target
    pull`); the states are taken at its layers. A parent whose config does not say how its ids
    count is taken at both readings' layers (`parent_numbering`)."""
    parent_numbering: ParentNumbering = "measure"
    """How an unmarked parent's ids count: "measure" (the states of both readings are kept; the
    trainer measures the parent's acceptance at each and trains at the better), "vllm" (as
    written) or "sglang" (one more)."""
    source: Literal[SOURCES] = "auto"
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


def extraction_device(choice: str) -> str:
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


def shards_fit(preset, storage: StorageResource, hidden: HiddenStatesConfig) -> bool:
    """Whether the hidden-state shards are there already, or would fit the free disk under the
    data root (the corpus must be fetched)."""
    out = storage.hidden_states(preset.name)
    if len(open_shards(out)) == NUM_SHARDS:
        return True
    counts = corpus_token_counts(str(storage.corpus(preset.name)), 1)[0]
    n_aux = len(extraction_settings(hidden, preset).aux_layer_ids)
    needed = predict_bytes(sum(counts.values()), n_aux, preset.hidden_size, len(counts), NUM_SHARDS)
    where = out
    while not where.exists() and where != where.parent:
        where = where.parent
    return needed <= shutil.disk_usage(where).free


def training_source(asked: str, epochs: int, preset, path, storage: StorageResource, hidden: HiddenStatesConfig | None = None) -> str:
    """ "shards", "target" or "server" for a drafter run (`hidden_states/source.choose_training_source`)."""
    if asked != "auto":
        return choose_training_source(asked, epochs, "hf")
    hidden = hidden or HiddenStatesConfig()
    return choose_training_source(asked, epochs, hidden_states_source(hidden, preset, path), shards_fit(preset, storage, hidden))


def drafter_training_source(preset, path, storage: StorageResource, hidden: HiddenStatesConfig) -> str:
    """Where the drafter of this code location trains from (its settings: `hidden_states`, `epochs`),
    decided as `drafter_checkpoint` decides it once the corpus is there."""
    drafter = location_settings().asset_settings("drafter_checkpoint")
    epochs = drafter.get("epochs", TrainConfig.model_fields["epochs"].default)
    return training_source(drafter.get("hidden_states", "auto"), epochs, preset, path, storage, hidden)
