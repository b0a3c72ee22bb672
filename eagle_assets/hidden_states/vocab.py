"""The draft vocabulary: the top-N target tokens by how often the target writes them.

    >>> from eagle_assets.hidden_states.vocab import (
    ...     count_assistant_tokens, build_vocab_mapping, save_vocab_mapping, load_vocab_mapping,
    ...     load_parent_mapping)
    >>> counts = count_assistant_tokens("data/corpus", vocab_size=49152)
    >>> m = build_vocab_mapping(counts, vocab_size=49152, draft_vocab_size=8192)
    >>> m.d2t.shape, m.t2d.shape, m.coverage            # (8192,), (49152,), 0.97...
    >>> save_vocab_mapping(m, "data/vocab_mapping.safetensors")
    >>> parent = load_parent_mapping("/models/parent-drafter")   # warm start: inherited as is

Counting uses assistant tokens only (loss_mask == 1): those are what the drafter predicts.
Selection: the N most frequent ids, ties broken by the lower id; when the corpus has fewer
than N distinct assistant tokens the rest is filled with the lowest unseen ids (`filled` in
the metadata says how many). Draft ids follow ascending target ids, so that
target_id = draft_id + d2t[draft_id] (the engines' convention) and `t2d[target_id]` is True
exactly for the chosen ids.

A warm start must keep the parent drafter's mapping: its lm_head rows are indexed by the
parent's draft ids, so a rebuilt mapping would silently misalign them. `load_parent_mapping`
takes `d2t`/`t2d` from the parent's weights and only validates them.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_assets.durable import no_room, replace_durably
from eagle_assets.formats import VOCAB_MAPPING_FILE


@dataclass(frozen=True)
class VocabMapping:
    """A draft vocabulary with the facts behind it."""

    d2t: torch.Tensor
    """(N,) int64: target_id = draft_id + d2t[draft_id]."""
    t2d: torch.Tensor
    """(V,) bool: True where a target id is in the draft vocabulary."""
    token_counts: torch.Tensor | None = None
    """(V,) int64 assistant-token counts the mapping was built from (None for an inherited one)."""
    filled: int = 0
    """Draft ids that had no corpus occurrence and were filled by lowest id."""
    source: str = "corpus"
    """"corpus", or "parent:<folder>" for a mapping inherited from a parent drafter."""

    @property
    def draft_vocab_size(self) -> int:
        return len(self.d2t)

    @property
    def vocab_size(self) -> int:
        return len(self.t2d)

    @property
    def target_ids(self) -> torch.Tensor:
        """(N,) int64 target id of each draft id, ascending."""
        return torch.arange(len(self.d2t)) + self.d2t

    @property
    def assistant_tokens(self) -> int:
        return int(self.token_counts.sum()) if self.token_counts is not None else 0

    @property
    def coverage(self) -> float:
        """Fraction of assistant tokens whose id is in the draft vocabulary (NaN without counts)."""
        if self.token_counts is None or self.assistant_tokens == 0:
            return float("nan")
        return float(self.token_counts[self.t2d].sum()) / self.assistant_tokens

    def metadata(self) -> dict[str, str]:
        counts = self.token_counts
        return {
            "vocab_size": str(self.vocab_size),
            "draft_vocab_size": str(self.draft_vocab_size),
            "assistant_tokens": str(self.assistant_tokens),
            "distinct_tokens": str(int((counts > 0).sum())) if counts is not None else "",
            "filled": str(self.filled),
            "coverage": repr(self.coverage),
            "source": self.source,
        }


def count_assistant_tokens(rows_or_corpus: str | Path | Iterable[dict], vocab_size: int) -> torch.Tensor:
    """(V,) int64 counts of each target id over assistant tokens (loss_mask == 1).

    Takes a corpus folder (read with `corpus_io.iter_corpus_rows`) or rows with `input_ids`
    and `loss_mask`; an id outside [0, V) raises naming the sample.
    """
    if isinstance(rows_or_corpus, (str, Path)):
        from eagle_assets.hidden_states.corpus_io import iter_corpus_rows

        rows = iter_corpus_rows(str(rows_or_corpus), ["sample_id", "input_ids", "loss_mask"])
    else:
        rows = rows_or_corpus
    counts = np.zeros(vocab_size, dtype=np.int64)
    pending: list[np.ndarray] = []
    pending_tokens = 0
    for row in rows:
        ids = np.asarray(row["input_ids"], dtype=np.int64)
        mask = np.asarray(row["loss_mask"]).astype(bool)
        if ids.shape != mask.shape:
            raise ValueError(f"sample {row.get('sample_id')}: input_ids and loss_mask differ in length")
        picked = ids[mask]
        if picked.size and (picked.min() < 0 or picked.max() >= vocab_size):
            bad = int(picked.max() if picked.max() >= vocab_size else picked.min())
            raise ValueError(
                f"sample {row.get('sample_id')}: token id {bad} is outside the target "
                f"vocabulary [0, {vocab_size}); the corpus was tokenised for another target"
            )
        pending.append(picked)
        pending_tokens += picked.size
        if pending_tokens >= 1 << 22:  # one bincount per few million tokens, not one per row
            counts += np.bincount(np.concatenate(pending), minlength=vocab_size)
            pending, pending_tokens = [], 0
    if pending:
        counts += np.bincount(np.concatenate(pending), minlength=vocab_size)
    return torch.from_numpy(counts)


def build_vocab_mapping(token_counts, vocab_size: int, draft_vocab_size: int) -> VocabMapping:
    """The top-`draft_vocab_size` ids of `token_counts` ((V,) counts) as a `VocabMapping`."""
    counts = torch.as_tensor(token_counts, dtype=torch.int64)
    if counts.shape != (vocab_size,):
        raise ValueError(f"token_counts has shape {tuple(counts.shape)}, expected ({vocab_size},) for vocab_size={vocab_size}")
    if not 0 < draft_vocab_size <= vocab_size:
        raise ValueError(f"draft_vocab_size={draft_vocab_size} must be in 1..vocab_size ({vocab_size})")
    if (counts < 0).any():
        raise ValueError("token_counts has negative entries")
    # Stable sort of -count: equal counts keep ascending id order, so ties go to the lower id
    # and zero-count fill ids come lowest-first, on every machine.
    order = torch.sort(-counts, stable=True).indices
    chosen = torch.sort(order[:draft_vocab_size]).values  # (N,) ascending target ids
    filled = int((counts[chosen] == 0).sum())
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[chosen] = True
    d2t = chosen - torch.arange(draft_vocab_size)
    return VocabMapping(d2t=d2t, t2d=t2d, token_counts=counts, filled=filled, source="corpus")


def save_vocab_mapping(mapping: VocabMapping, path: str | Path) -> Path:
    """Write `d2t`, `t2d` (and the counts) with metadata to `path` (a folder gets `VOCAB_MAPPING_FILE`); atomic."""
    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_MAPPING_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {"d2t": mapping.d2t.contiguous(), "t2d": mapping.t2d.contiguous()}
    if mapping.token_counts is not None:
        tensors["token_counts"] = mapping.token_counts.contiguous()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=mapping.metadata())
        replace_durably(tmp, path)
    except OSError as exc:  # a full disk: named, with the old mapping kept (the temporary file goes below)
        raise no_room(exc, path, "the vocabulary mapping", f"{path} keeps what it held before") or exc from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def load_vocab_mapping(path: str | Path) -> VocabMapping:
    """Read a file written by `save_vocab_mapping` (or a folder holding `VOCAB_MAPPING_FILE`)."""
    path = Path(path)
    if path.is_dir():
        path = path / VOCAB_MAPPING_FILE
    with safe_open(path, framework="pt") as f:
        meta = f.metadata() or {}
        keys = set(f.keys())
        if not {"d2t", "t2d"} <= keys:
            raise ValueError(f"{path} has no d2t/t2d tensors (it has {sorted(keys)}); it is not a vocab mapping")
        counts = f.get_tensor("token_counts") if "token_counts" in keys else None
        mapping = VocabMapping(
            d2t=f.get_tensor("d2t"),
            t2d=f.get_tensor("t2d"),
            token_counts=counts,
            filled=int(meta.get("filled", 0) or 0),
            source=meta.get("source", "corpus"),
        )
    validate_mapping(mapping, str(path))
    return mapping


def validate_mapping(mapping: VocabMapping, where: str, vocab_size: int | None = None, draft_vocab_size: int | None = None) -> None:
    """Raise, naming `where`, unless d2t and t2d describe the same set of in-range target ids."""
    d2t, t2d = mapping.d2t, mapping.t2d
    if d2t.ndim != 1 or t2d.ndim != 1:
        raise ValueError(f"{where}: d2t and t2d must be 1-D, got shapes {tuple(d2t.shape)} and {tuple(t2d.shape)}")
    if draft_vocab_size is not None and len(d2t) != draft_vocab_size:
        raise ValueError(
            f"{where}: d2t has {len(d2t)} entries but draft_vocab_size is {draft_vocab_size}; the checkpoint's config and weights disagree"
        )
    if vocab_size is not None and len(t2d) != vocab_size:
        raise ValueError(
            f"{where}: t2d covers {len(t2d)} target ids but the target vocabulary has {vocab_size}; the parent drafter was made for another target"
        )
    targets = mapping.target_ids
    if len(targets) and (targets.min() < 0 or targets.max() >= len(t2d)):
        raise ValueError(f"{where}: d2t maps draft ids outside the target vocabulary [0, {len(t2d)})")
    if len(targets) > 1 and not (targets[1:] > targets[:-1]).all():
        raise ValueError(f"{where}: d2t does not give strictly ascending target ids; it is not a d2t offset table")
    if int(t2d.sum()) != len(d2t) or not bool(t2d[targets].all()):
        raise ValueError(f"{where}: t2d does not mark exactly the {len(d2t)} target ids that d2t maps to")


def load_parent_mapping(drafter_folder: str | Path, vocab_size: int | None = None, draft_vocab_size: int | None = None) -> VocabMapping:
    """The parent drafter's own d2t/t2d (never rebuilt), validated against its config and the target.

    Reads `model.safetensors` (or the shard that `model.safetensors.index.json` names for
    `d2t`). When the checkpoint has no `t2d` (vLLM does not need it, so some exports drop it),
    it is derived from `d2t`, which determines it. `draft_vocab_size` defaults to the one in
    the parent's config.json; `vocab_size` should be the target's.
    """
    folder = Path(drafter_folder)
    weights = folder / "model.safetensors"
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        if "d2t" in weight_map:
            weights = folder / weight_map["d2t"]
    if not weights.is_file():
        raise FileNotFoundError(
            f"parent drafter {folder} has no model.safetensors; point the warm start at the folder holding the drafter's config.json and weights"
        )
    config_path = folder / "config.json"
    if draft_vocab_size is None and config_path.is_file():
        draft_vocab_size = json.loads(config_path.read_text()).get("draft_vocab_size")
    with safe_open(weights, framework="pt") as f:
        keys = set(f.keys())
        if "d2t" not in keys:
            raise ValueError(
                f"{weights} has no d2t tensor, so the parent's draft-id -> target-id map is lost; "
                "a rebuilt mapping would misalign its lm_head. Use a parent checkpoint that saved d2t."
            )
        d2t = f.get_tensor("d2t").to(torch.int64)
        t2d = f.get_tensor("t2d").to(torch.bool) if "t2d" in keys else None
    if t2d is None:
        if vocab_size is None:
            raise ValueError(f"{weights} has no t2d; pass vocab_size (the target's) to derive it from d2t")
        targets = torch.arange(len(d2t)) + d2t
        if len(targets) and (targets.min() < 0 or targets.max() >= vocab_size):
            raise ValueError(f"{weights}: d2t maps draft ids outside the target vocabulary [0, {vocab_size})")
        t2d = torch.zeros(vocab_size, dtype=torch.bool)
        t2d[targets] = True
    mapping = VocabMapping(d2t=d2t, t2d=t2d, source=f"parent:{folder}")
    validate_mapping(mapping, str(weights), vocab_size=vocab_size, draft_vocab_size=draft_vocab_size)
    return mapping


def with_counts(mapping: VocabMapping, token_counts) -> VocabMapping:
    """The same mapping with corpus counts attached, so that its coverage on this corpus is known."""
    counts = torch.as_tensor(token_counts, dtype=torch.int64)
    if counts.shape != mapping.t2d.shape:
        raise ValueError(f"token_counts has shape {tuple(counts.shape)}, the mapping covers {tuple(mapping.t2d.shape)}")
    return VocabMapping(mapping.d2t, mapping.t2d, counts, mapping.filled, mapping.source)
