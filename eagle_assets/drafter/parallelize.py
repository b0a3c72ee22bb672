"""Data parallelism for a built drafter: DDP (replicated) or FSDP2 (`fully_shard`).

The model file holds the architecture only; this module decides how it spreads over
processes (torchtitan's split). The trainer wraps the drafter and its loss in one
`nn.Module` (`TrainObjective`) so that every forward goes through the wrapper: DDP needs its
own forward to run for gradient synchronisation, and FSDP2 gathers the root's parameters in
the root's forward hook.

    objective = TrainObjective(drafter, ttt_steps=7)
    model = parallelize(objective, "fsdp2", device)
    out = model(batch, target_head)            # TTTOutput (summed loss, token counts)
    with grad_sync(model, enabled=False): ...  # accumulation micro-steps

Without an initialised process group, `parallelize` returns the module unchanged.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
import torch.distributed as dist
from torch import nn

from eagle_assets.drafter.draftable import DraftableCache
from eagle_assets.drafter.ttt import ttt_loss


class TrainObjective(nn.Module):
    """The drafter plus its training-time-test loss, as one module to wrap.

    A batch that carries `positions` (B,) (its samples' dataset positions, as
    `ShardDataset.collate` gives them) has its drafted-argmax mask computed once per sample and
    looked up afterwards (`DraftableCache`): the loss is the same, without the outside head's
    matmul after a sample's first batch.
    """

    def __init__(self, drafter: nn.Module, ttt_steps: int, target_temperature: float = 1.0, unreached_weight: float = 1.0):
        super().__init__()
        self.drafter = drafter
        self.ttt_steps = ttt_steps
        self.target_temperature = target_temperature
        self.unreached_weight = unreached_weight
        self.draftable = DraftableCache()

    def forward(
        self, batch: dict[str, torch.Tensor], target_head: torch.Tensor, outside_head: torch.Tensor | None = None, with_correct_rows: bool = False
    ):
        """batch: the `ttt_loss` layout, optionally `positions`; target_head (N, Ht); outside_head (V-N, Ht) or None."""
        positions, width = batch.get("positions"), batch["input_ids"].shape[1]
        cached = outside_head is not None and positions is not None  # no outside head: every position drafts
        lengths = batch.get("lengths") if cached else None
        if cached and lengths is None:  # built only when absent: dict.get's default would build it every batch
            lengths = torch.full_like(positions, width)
        known = self.draftable.lookup(positions, lengths, width) if cached else None
        out = ttt_loss(
            self.drafter,
            batch,
            target_head,
            self.ttt_steps,
            outside_head=None if known is not None else outside_head,
            with_correct_rows=with_correct_rows,
            target_temperature=self.target_temperature,
            unreached_weight=self.unreached_weight,
            in_draft=known,
        )
        if cached and known is None:
            self.draftable.store(positions, lengths, out.in_draft)
        return out


def is_distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def parallelize(
    module: nn.Module,
    mode: str,
    device: torch.device,
    mp_dtype: torch.dtype | None = None,
    ignored_params: set[nn.Parameter] | None = None,
) -> nn.Module:
    """Wrap `module` (a `TrainObjective`) for data parallel training.

    ddp:   `DistributedDataParallel`; buffers (d2t, t2d) are constants, so they are not
           re-broadcast every step (gloo cannot send bool tensors anyway).
    fsdp2: `fully_shard` on the whole objective. Parameters stay fp32 masters; `mp_dtype`
           (optional) is the dtype parameters are gathered in; gradients reduce in fp32.
           `ignored_params` (the frozen target embedding) stay whole on every rank: a lookup
           table needs no gradient, and gathering it every step would cost bandwidth for nothing.
    """
    if not is_distributed():
        return module
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        with warnings.catch_warnings():
            # torch 2.13 deprecates broadcast_buffers for forward_sync_buffers, which would still
            # sync at init (a bool broadcast gloo lacks); torch 2.11 has only broadcast_buffers.
            warnings.filterwarnings("ignore", message=".*broadcast_buffers.*", category=FutureWarning)
            return DDP(module, device_ids=ids, broadcast_buffers=False, find_unused_parameters=False)
    if mode == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # One FSDP unit for the whole drafter: `ttt_loss` reaches into the decoder layer's
        # submodules and weights without calling the layer itself, so a per-layer unit would
        # never be gathered; a one-layer drafter gains nothing from finer units anyway.
        # Between steps parameters, gradients and optimiser state stay sharded.
        mp = MixedPrecisionPolicy(param_dtype=mp_dtype, reduce_dtype=torch.float32) if mp_dtype else MixedPrecisionPolicy()
        fully_shard(module, mp_policy=mp, ignored_params=ignored_params)
        return module
    raise ValueError(f"parallelism={mode!r}: use 'ddp' or 'fsdp2'")


@contextlib.contextmanager
def grad_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce on accumulation micro-steps (DDP `no_sync`, FSDP2
    `set_requires_gradient_sync`); the last micro-step of an optimiser step syncs."""
    if enabled or not is_distributed():
        yield
        return
    if hasattr(model, "no_sync"):
        with model.no_sync():
            yield
        return
    if hasattr(model, "set_requires_gradient_sync"):
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)
        return
    yield
