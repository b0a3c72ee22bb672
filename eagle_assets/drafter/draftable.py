"""Which positions of each training sample the drafter can draft, kept across epochs.

A position trains only when the target's most likely token over its *full* vocabulary is in
the draft vocabulary (SpecForge's `t2d[argmax]`). Finding that out multiplies the target's
final state by the lm_head rows outside the draft vocabulary: (V - N) rows, about five times
the draft head's at SmolLM2's 49,152 / 8,192, and the costliest part of a CPU training step
after the drafter itself. The answer depends only on the sample's target states, which never
change, so it is computed on the sample's first batch and looked up on every later one
(every later epoch, and every validation after the first).

    cache = DraftableCache()
    known = cache.lookup(batch["positions"], batch["lengths"], T)   # (B, T) bool, or None
    out = ttt_loss(..., outside_head=None if known is not None else outside_head, in_draft=known)
    if known is None: cache.store(batch["positions"], batch["lengths"], out.in_draft)
"""

from __future__ import annotations

import torch


class DraftableCache:
    """Per dataset position, the (length,) bool mask `ttt_loss` returns as `in_draft`."""

    def __init__(self) -> None:
        self._masks: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return len(self._masks)

    def lookup(self, positions: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor | None:
        """(B, width) bool for a batch whose samples are all known, padding False; else None.

        A batch with one unknown sample is computed whole: the outside-head matmul runs once
        per batch either way, and a sample first seen in a batch is stored from it.
        """
        keys = positions.tolist()
        if not all(k in self._masks for k in keys):
            return None
        rows = [self._masks[k] for k in keys]
        out = torch.zeros(len(rows), width, dtype=torch.bool, device=rows[0].device)
        for i, (row, n) in enumerate(zip(rows, lengths.tolist())):
            if row.shape[0] != n:
                raise ValueError(f"sample at position {keys[i]} has {n} tokens now but {row.shape[0]} when first seen")
            out[i, :n] = row
        return out

    def store(self, positions: torch.Tensor, lengths: torch.Tensor, in_draft: torch.Tensor) -> None:
        """Keep each new sample's mask (in_draft (B, T), cut to its length), on in_draft's device."""
        for key, n, row in zip(positions.tolist(), lengths.tolist(), in_draft.detach()):
            if key not in self._masks:  # the first computation stands
                self._masks[key] = row[:n].clone()
