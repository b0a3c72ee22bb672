"""Which source computes the target's hidden states: the serving engine, or Hugging Face.

The engine (`engine_extract.py`) runs the target as it is served: split over the GPUs it needs,
in its own quantised kernels, and one server serves every shard. Hugging Face (`extract.py`)
loads the model in this process: fine for a target one device holds, and the reference the
engine's states are tested against. `choose_source` makes the default choice:

    >>> choose_source("auto", get_preset("kimi-k2.5"), hf_loadable=True)
    'engine'

Training need not read shards at all: `choose_training_source` picks where the drafter's trainer
takes its states from, shards or online (`drafter/sources.py`):

    >>> choose_training_source("auto", epochs=1, extraction="hf")
    'target'
"""

from __future__ import annotations

from collections.abc import Callable

from eagle_assets.targets import TargetPreset

SOURCES = ("auto", "engine", "hf")


def choose_source(asked: str, preset: TargetPreset, hf_loadable: "bool | Callable[[], bool]" = True) -> str:
    """ "engine" or "hf": as asked, else the preset's choice, else the engine wherever the target
    needs more than one GPU (tensor parallel) or transformers has no class for it.

    `hf_loadable` may be a function: it is then called only where the choice turns on it. Asking
    transformers runs the target's remote configuration code, which a run whose states come
    from the engine has no need to run in the pipeline's process (for Kimi-K2.5: the hub's
    configuration_kimi_k25.py)."""
    if asked not in SOURCES:
        raise ValueError(f"hidden-state source {asked!r}: give one of {', '.join(SOURCES)}")
    if asked != "auto":
        return asked
    if preset.hidden_states_source != "auto":
        return preset.hidden_states_source
    if preset.tensor_parallel_size > 1:
        return "engine"
    loadable = hf_loadable() if callable(hf_loadable) else hf_loadable
    return "hf" if loadable else "engine"


def hf_loadable(folder, trust_remote_code: bool = False) -> bool:
    """Whether transformers has a class that loads this target folder's config with its head."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
    except (ValueError, OSError, KeyError):
        return False
    if getattr(config, "auto_map", None) and trust_remote_code:
        return True
    return type(config) in AutoModelForCausalLM._model_mapping or type(config) in AutoModelForImageTextToText._model_mapping


TRAINING_SOURCES = ("auto", "shards", "target", "server")
SHARDS_PAY_FROM_EPOCHS = 2
"""Epochs from which shards train faster than online: one extraction (a forward pass per token,
and the writes) serves every epoch, where online pays the forward again each epoch."""


def choose_training_source(asked: str, epochs: int, extraction: str, shards_fit: bool = True) -> str:
    """ "shards", "target" or "server": as asked, else shards where they pay (at least
    `SHARDS_PAY_FROM_EPOCHS` epochs) and fit the disk, else online: the target in the trainer
    where Hugging Face would extract it (`extraction` "hf"), its extraction server otherwise."""
    if asked not in TRAINING_SOURCES:
        raise ValueError(f"hidden_states={asked!r}: give one of {', '.join(TRAINING_SOURCES)}")
    if asked != "auto":
        return asked
    if epochs >= SHARDS_PAY_FROM_EPOCHS and shards_fit:
        return "shards"
    return "target" if extraction == "hf" else "server"
