"""Warm start: continue training an existing EAGLE-3 drafter (the parent) on a new corpus.

The parent's `lm_head` rows are indexed by its draft vocabulary, so its `d2t`/`t2d` are kept
exactly as they are: a mapping regenerated from the new corpus would silently pair each
row with another token. The parent is refused, with both values named, when it cannot serve
the target: a different hidden size (its `fc` reads the target's states and its attention
reads the target's embedding), a different vocabulary, or layer ids the target does not have.

    >>> model = warm_start("parents/kimi-k2-eagle3", json.load(open("kimi-k2.5/config.json")))
    >>> model.config.aux_layer_ids          # the parent's, in our numbering
"""

from __future__ import annotations

import json
import typing
import warnings
from dataclasses import replace
from pathlib import Path

import torch

from eagle_assets.drafter.export import load_drafter
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.run_config import ParentNumbering


def _target_dict(target_config) -> dict:
    if isinstance(target_config, dict):
        cfg = target_config
    else:
        path = Path(target_config)
        cfg = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    return cfg.get("text_config") or cfg


def warm_start(
    parent_folder,
    target_config,
    *,
    layer_id_numbering: str | None = None,
    target_embedding: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
) -> Eagle3Drafter:
    """The parent drafter, checked against the target and ready to train.

    parent_folder: an HF drafter folder (`layers.0.*` or `midlayer.*`). target_config: the
    target's config.json as a dict, or its folder / file path. layer_id_numbering: how the
    parent's ids count when its config does not say ("vllm" = ours, "sglang" = ours - 1).
    target_embedding (V, H): copied into the frozen embedding when given.
    """
    target = _target_dict(target_config)
    num_layers = int(target["num_hidden_layers"])
    where = f"parent drafter {parent_folder}"
    try:
        model, parent = load_drafter(parent_folder, layer_id_numbering, target_num_layers=num_layers, dtype=dtype)
    except ValueError as err:  # e.g. layer ids beyond this target's depth
        raise ValueError(f"{where} does not fit the target ({num_layers} layers): {err}") from None
    hidden, vocab = int(target["hidden_size"]), int(target["vocab_size"])
    if parent.target_hidden_size != hidden:
        raise ValueError(
            f"{where} has target_hidden_size={parent.target_hidden_size}, the target's hidden_size is {hidden}: "
            "its fc cannot read this target's states; train from scratch instead"
        )
    if parent.hidden_size != hidden:
        raise ValueError(
            f"{where} has hidden_size={parent.hidden_size}, the target's is {hidden}: the drafter attends over the "
            "target's embedding, so the two must match; train from scratch instead"
        )
    if parent.vocab_size != vocab or model.t2d.shape[0] != vocab:
        raise ValueError(
            f"{where} was built for a vocabulary of {parent.vocab_size} (t2d length {model.t2d.shape[0]}), the "
            f"target's vocab_size is {vocab}: its draft vocabulary does not index this target's tokens"
        )
    top = int((torch.arange(parent.draft_vocab_size) + model.d2t).max())
    if top >= vocab:
        raise ValueError(f"{where} maps a draft id to target id {top}, but the target vocab_size is {vocab}")
    recorded = json.loads((Path(parent_folder) / "config.json").read_text()).get("target_num_hidden_layers")
    if recorded is not None and int(recorded) != num_layers:
        warnings.warn(
            f"{where} was trained on a target with {recorded} layers, this one has {num_layers}: its aux ids "
            f"{parent.aux_layer_ids} now name other depths",
            stacklevel=2,
        )
    # The child serves this target: record its depth and architecture (SGLang numbering needs it).
    model.config = replace(parent, target_num_layers=num_layers, target_model_type=target.get("model_type"))
    if target_embedding is not None:
        model.load_target_embedding(target_embedding.to(dtype))
    return model


NUMBERINGS = ("vllm", "sglang")
PARENT_NUMBERING_CHOICES = typing.get_args(ParentNumbering)
"""How an unmarked parent's layer ids are read: "measure" (both readings, the better on the
user's corpus), or one reading as given."""


def parent_readings(parent_folder, target_num_layers: int) -> dict[str, tuple[int, ...]]:
    """The parent's aux layer ids in our numbering under each reading its config allows: the one
    its marker names (our exports write `layer_id_numbering`), else both, "vllm" (as written,
    vLLM's and ours) and "sglang" (one more: older SGLang and SpecForge wrote the output of layer
    k as k). A reading naming a layer the target does not have is left out."""
    from eagle_assets.drafter.export import drafter_folder_config
    from eagle_assets.formats import NUMBERING_KEY

    raw = json.loads((Path(parent_folder) / "config.json").read_text())
    marked = raw.get(NUMBERING_KEY)
    readings = {}
    for numbering in (marked,) if marked else NUMBERINGS:
        try:
            readings[numbering] = tuple(drafter_folder_config(parent_folder, numbering, target_num_layers).aux_layer_ids)
        except ValueError:  # ids beyond the target's depth under this reading
            continue
    if not readings:
        raise ValueError(f"parent drafter {parent_folder}: its layer ids fit a {target_num_layers}-layer target under no reading")
    return readings


def parent_layer_ids(parent_folder, target_num_layers: int, numbering: str = "measure") -> tuple[int, ...]:
    """The layer ids whose states a warm start from this parent needs: the marked reading's;
    for an unmarked parent, the given reading's, or ("measure") the union of both, so that the
    trainer can measure both on the corpus and train at the better (`drafter/train.py`)."""
    if numbering not in PARENT_NUMBERING_CHOICES:
        raise ValueError(f"parent_numbering={numbering!r}: give one of {', '.join(PARENT_NUMBERING_CHOICES)}")
    readings = parent_readings(parent_folder, target_num_layers)
    if len(readings) == 1 or numbering == "measure":
        return tuple(sorted({i for ids in readings.values() for i in ids}))
    if numbering not in readings:
        raise ValueError(f"parent drafter {parent_folder}: read as {numbering}-numbered its ids do not fit a {target_num_layers}-layer target")
    return readings[numbering]
