"""The target's input embedding and output head, read straight from its safetensors.

The drafter needs two matrices of the target and nothing else: `embed_tokens` (its frozen
input embedding) and `lm_head` (whose draft-vocabulary rows give the training targets). They
are read tensor by tensor with `safe_open`, from a single file or a sharded
`model.safetensors.index.json`, without building the model, so a 1T-parameter target costs two
tensor reads. Tied embeddings (`tie_word_embeddings`, or no `lm_head` in the files) return
the embedding as the head.

    >>> embedding, lm_head = read_target_head("/path/to/target")      # (V, H) each
    >>> head = draft_head(lm_head, d2t)                                 # (N, H)
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
EMBED_SUFFIX = "embed_tokens.weight"
HEAD_SUFFIX = "lm_head.weight"


def _weight_map(folder: Path) -> dict[str, str]:
    """tensor name -> file name, for a single-file or sharded safetensors folder."""
    index = folder / INDEX_FILE
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(
            f"{folder} holds no *.safetensors and no {INDEX_FILE}: give the target's HF folder (safetensors weights; .bin checkpoints are not read)"
        )
    mapping: dict[str, str] = {}
    for f in files:
        with safe_open(f, framework="pt") as sf:
            mapping.update({name: f.name for name in sf.keys()})
    return mapping


def _pick(names: list[str], suffix: str) -> str | None:
    """The text model's tensor ending in `suffix` (shortest name: `model.x` before `vision.model.x`)."""
    hits = sorted((n for n in names if n.endswith(suffix) and "vision" not in n and "mtp" not in n), key=len)
    return hits[0] if hits else None


def _read(folder: Path, mapping: dict[str, str], name: str) -> torch.Tensor:
    with safe_open(folder / mapping[name], framework="pt") as sf:
        t = sf.get_tensor(name)
    if not t.is_floating_point():
        raise ValueError(
            f"{name} in {folder / mapping[name]} is {t.dtype}: a quantised embedding or head is not supported; dequantise these two tensors first"
        )
    return t


def read_target_embedding(folder: str | Path, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The target's input embedding (V, H) alone, optionally cast to `dtype`."""
    folder = Path(folder)
    mapping = _weight_map(folder)
    name = _pick(list(mapping), EMBED_SUFFIX)
    if name is None:
        raise KeyError(f"no tensor named '*{EMBED_SUFFIX}' in {folder}; is this a decoder-only HF checkpoint?")
    embedding = _read(folder, mapping, name)
    return embedding if dtype is None else embedding.to(dtype)


def read_named_tensor(folder: str | Path, names: list[str] | tuple[str, ...]) -> torch.Tensor:
    """The first of `names` the target's checkpoint holds (one tensor read, not the model)."""
    folder = Path(folder)
    mapping = _weight_map(folder)
    for name in names:
        if name in mapping:
            with safe_open(folder / mapping[name], framework="pt") as sf:
                return sf.get_tensor(name)
    raise KeyError(f"{folder}: the checkpoint holds none of {list(names)}")


def read_target_head(folder: str | Path, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(embedding (V, H), lm_head (V, H)) of the target in `folder`, optionally cast to `dtype`."""
    folder = Path(folder)
    mapping = _weight_map(folder)
    names = list(mapping)
    embed_name = _pick(names, EMBED_SUFFIX)
    if embed_name is None:
        raise KeyError(f"no tensor named '*{EMBED_SUFFIX}' in {folder}; is this a decoder-only HF checkpoint?")
    head_name = _pick(names, HEAD_SUFFIX)
    config = _config(folder)
    tied = bool(config.get("tie_word_embeddings", False)) or head_name is None
    embedding = _read(folder, mapping, embed_name)
    lm_head = embedding if tied else _read(folder, mapping, head_name)
    if lm_head.shape != embedding.shape:
        raise ValueError(
            f"{folder}: lm_head {tuple(lm_head.shape)} and embedding {tuple(embedding.shape)} differ in shape; "
            "the drafter needs both as (vocab, hidden)"
        )
    vocab = config.get("vocab_size")
    if vocab is not None and embedding.shape[0] != int(vocab):
        raise ValueError(f"{folder}: embedding has {embedding.shape[0]} rows but config.json says vocab_size={vocab}")
    if dtype is not None:
        embedding, lm_head = embedding.to(dtype), lm_head.to(dtype)
    return embedding, lm_head


def _config(folder: Path) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        return {}
    cfg = json.loads(path.read_text())
    text = cfg.get("text_config") or {}
    merged = {**cfg, **{k: v for k, v in text.items() if k in ("vocab_size", "tie_word_embeddings")}}
    return merged


def draft_head(lm_head: torch.Tensor, d2t: torch.Tensor) -> torch.Tensor:
    """Rows of `lm_head` (V, H) for the draft vocabulary, in draft-id order -> (N, H)."""
    target_ids = torch.arange(d2t.shape[0], device=d2t.device) + d2t.long()
    if int(target_ids.max()) >= lm_head.shape[0] or int(target_ids.min()) < 0:
        raise ValueError(
            f"d2t maps draft ids to target ids up to {int(target_ids.max())}, but lm_head has "
            f"{lm_head.shape[0]} rows: the vocab mapping belongs to another target"
        )
    return lm_head[target_ids.to(lm_head.device)]


def outside_head(lm_head: torch.Tensor, t2d: torch.Tensor) -> torch.Tensor:
    """Rows of `lm_head` (V, H) for target ids outside the draft vocabulary -> (V - N, H).

    `ttt_loss(..., outside_head=...)` uses them to drop positions whose target argmax cannot
    be drafted.
    """
    if t2d.shape[0] != lm_head.shape[0]:
        raise ValueError(f"t2d has {t2d.shape[0]} entries, lm_head {lm_head.shape[0]} rows")
    return lm_head[~t2d.bool().to(lm_head.device)]
