"""EAGLE-3 drafter training from hidden-state shards: DDP or FSDP2, exact resume, one JSON config.

    torchrun --nproc_per_node 8 -m eagle_assets.drafter.train --config run.json
    python -m eagle_assets.drafter.train --config run.json        # one process (CPU or one GPU)

What a run does (settings in `run_config.TrainConfig`):
- reads the shards through `data.ShardDataset`, or computes the states online from the target
  or an extraction server (`sources.py`), holds out a stable hash-chosen validation split, and
  plans length-aware micro-batches whose order is fixed by (seed, epoch);
- builds the drafter (new, from the target's config.json, or warm-started from a parent
  drafter), copies the target's embedding into it (frozen) and takes the target lm_head's
  draft-vocabulary rows as the teacher head;
- wraps drafter + `ttt_loss` in one module, parallelised with DDP (default) or FSDP2; gloo on
  CPU, nccl on GPU; bf16 autocast or fp32 as `precision` says (auto: bf16 on GPU, fp32 on CPU);
- accumulates `grad_accum` micro-batches per process (no gradient sync on all but the last)
  and normalises by the *global* count of trained positions, all-reduced, so N processes
  compute exactly what one process computes on the same global batch;
- AdamW with linear warm-up and cosine decay, gradient clipping;
- every `checkpoint_every` steps, rank 0 writes an atomic checkpoint (model, optimiser,
  scheduler, RNG states of every rank, data position); a restart resumes from the newest
  complete one and follows the same trajectory as an uninterrupted run; an online source that
  fails (its server died) checkpoints the steps trained before the run stops;
- logs loss, per-step accuracy, learning rate and tokens/s to `metrics.jsonl`, the tracker
  (TensorBoard, MLflow or W&B: `trackers.py`) and a tqdm bar (rank 0 only); validates every
  `val_interval` steps (per-position acceptance estimate and acceptance length); exports the
  drafter with `export.py`.

Multi-node runs need `out_dir` on a filesystem every node sees: rank 0 writes the checkpoints
and every rank reads the newest one on resume.

One process alone reports to an orchestrator: rank 0 through `main(argv, reporter=...)` with an
object that has `log(msg)` and `report_metrics(dict)` (and optionally `report_final(dict)`).
When no reporter is given and `DAGSTER_PIPES_CONTEXT` is set, the first process of the node
Dagster launched (local rank 0) opens a Dagster Pipes session and reports through it; the
other processes never open one. That process is rank 0 except under torchrun's c10d
rendezvous, which numbers the nodes in its own order; every reported number is all-reduced,
so it reports what rank 0 would. Dagster itself is never imported.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import math
import os
import random
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
import torch.distributed as dist

from eagle_assets import precision
from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.config import DrafterConfig
from eagle_assets.drafter.data import (
    BatchingSpec,
    BatchPlanner,
    SamplerState,
    ShardDataset,
    describe,
    rank_micro_batches,
    validation_batches,
)
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.parallelize import TrainObjective, grad_sync, parallelize
from eagle_assets.drafter.parent_gate import ParentComparison, compare_with_parent
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets.drafter.sources import HiddenStateSourceError, open_training_data
from eagle_assets.drafter.trackers import open_tracker
from eagle_assets.drafter.ttt import replay_drafting, replay_drafting_per_sequence
from eagle_assets.durable import write_durably

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
PARENT_VALIDATION_FILE = "parent_validation.json"
PARENT_NUMBERING_FILE = "parent_numbering.json"
"""How the warm start's parent's layer ids were read, and why (kept for a resumed run)."""


def _parent_val_al(path: Path) -> float | None:
    return json.loads(path.read_text()).get("val_al") if path.is_file() else None


class Reporter(Protocol):
    """Where rank 0 sends progress: Dagster Pipes in production, anything with these two methods."""

    def log(self, msg: str) -> None: ...

    def report_metrics(self, metrics: dict) -> None: ...


class PipesReporter:
    """A `Reporter` over an open Dagster Pipes context (`dagster_pipes.open_dagster_pipes()`)."""

    def __init__(self, pipes):
        self.pipes = pipes

    def log(self, msg: str) -> None:
        self.pipes.log.info(msg)

    def report_metrics(self, metrics: dict) -> None:
        self.pipes.report_custom_message(metrics)

    def report_final(self, summary: dict) -> None:
        metadata = {k: v for k, v in summary.items() if isinstance(v, (int, float, str, bool)) or v is None}
        self.pipes.report_asset_materialization(metadata=metadata)


# ----------------------------------------------------------------------------- process group


@dataclass
class DistEnv:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool
    """True when this module initialised the process group (and so destroys it)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> DistEnv:
    """Join torchrun's process group when its variables are set; one process otherwise."""
    cuda = torch.cuda.is_available()
    if dist.is_available() and dist.is_initialized():
        rank, world = dist.get_rank(), dist.get_world_size()
        local = int(os.environ.get("LOCAL_RANK", rank))
        device = torch.device("cuda", local) if cuda else torch.device("cpu")
        return DistEnv(rank, world, local, device, owns_group=False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or "RANK" not in os.environ:
        device = torch.device("cuda", 0) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        return DistEnv(0, 1, 0, device, owns_group=False)
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        device = torch.device("cuda", local)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
    return DistEnv(rank, world, local, device, owns_group=True)


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t)
    return t


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _from_rank0(obj):
    """Rank 0's `obj` on every rank (a collective: every rank calls it); also a barrier."""
    if not (dist.is_available() and dist.is_initialized()):
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


# ----------------------------------------------------------------------------- schedule


class WarmupCosine:
    """lr multiplier at step s: linear warm-up to 1 over `warmup` steps, then cosine to `floor`."""

    def __init__(self, warmup: int, total: int, floor: float, cosine: bool = True):
        self.warmup, self.total, self.floor, self.cosine = warmup, total, floor, cosine

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if not self.cosine:
            return 1.0
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        return self.floor + (1.0 - self.floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _scheduler_state(scheduler) -> dict:
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}


# ----------------------------------------------------------------------------- model building


def _check_inputs(cfg: TrainConfig) -> None:
    """Clear errors for missing inputs before anything heavy is loaded."""
    problems = []
    if not Path(cfg.vocab_mapping).exists():
        problems.append(
            f"vocab_mapping {cfg.vocab_mapping} does not exist: materialise the vocab_mapping asset "
            "(or point vocab_mapping at its vocab_mapping.safetensors)"
        )
    target = Path(cfg.target)
    if not (target / "config.json").is_file():
        problems.append(f"target {target} has no config.json: give the target's HF folder (config.json + safetensors)")
    if cfg.warm_start and not (Path(cfg.warm_start) / "config.json").is_file():
        problems.append(f"warm_start {cfg.warm_start} has no config.json: give the parent drafter's HF folder")
    if problems:
        raise FileNotFoundError("cannot start training:\n  - " + "\n  - ".join(problems))


def resolve_drafter_config(cfg: TrainConfig, target_config: dict, aux_layer_ids, draft_vocab_size: int) -> DrafterConfig:
    """The drafter's architecture for a new (not warm-started) drafter."""
    if isinstance(cfg.drafter, dict):
        config = DrafterConfig.from_dict(cfg.drafter)
    else:
        if isinstance(cfg.drafter, str):
            from eagle_assets.targets import get_preset

            p = get_preset(cfg.drafter)
            target_config = {
                "hidden_size": p.hidden_size,
                "num_hidden_layers": p.num_layers,
                "vocab_size": p.vocab_size,
                "num_attention_heads": p.num_attention_heads,
                "num_key_value_heads": p.num_key_value_heads,
                "intermediate_size": p.intermediate_size,
                "rope_theta": p.rope_theta,
                "max_position_embeddings": p.max_position_embeddings,
            }
        config = DrafterConfig.from_target_config(
            target_config,
            aux_layer_ids=aux_layer_ids,
            draft_vocab_size=draft_vocab_size,
            intermediate_size=cfg.drafter_intermediate_size,
            num_hidden_layers=cfg.drafter_num_layers,
        )
    if cfg.drafter_shape and not isinstance(cfg.drafter, dict):
        config = replace(config, **cfg.drafter_shape)
    return replace(config, ptd_token_id=cfg.ptd_token_id) if cfg.ptd_token_id is not None else config


def _check_fit(config: DrafterConfig, ds: ShardDataset, d2t: torch.Tensor, t2d: torch.Tensor, where: str) -> None:
    problems = []
    if tuple(config.aux_layer_ids) != tuple(ds.aux_layer_ids):
        problems.append(
            f"the drafter reads aux layers {list(config.aux_layer_ids)} but training reads {list(ds.aux_layer_ids)} "
            f"(the shards hold {list(ds.stored_aux_layer_ids)}): "
            + (
                "set the run's aux_layer_ids to the drafter's (the shards hold them)"
                if set(config.aux_layer_ids) <= set(ds.stored_aux_layer_ids)
                else "extract hidden states at the drafter's layer ids (or drop the ids from the drafter config)"
            )
        )
    if config.target_hidden_size != ds.hidden_size:
        problems.append(f"the drafter expects target states of width {config.target_hidden_size}, the shards hold {ds.hidden_size}")
    if config.draft_vocab_size != d2t.shape[0] or config.vocab_size != t2d.shape[0]:
        problems.append(
            f"the drafter has draft/target vocab {config.draft_vocab_size}/{config.vocab_size}, the vocab mapping {d2t.shape[0]}/{t2d.shape[0]}"
        )
    if problems:
        raise ValueError(f"{where} does not fit the data:\n  - " + "\n  - ".join(problems))


def build_drafter(cfg: TrainConfig, ds: ShardDataset, d2t: torch.Tensor, t2d: torch.Tensor, embedding: torch.Tensor) -> Eagle3Drafter:
    """A new drafter (seeded) or the warm-start parent, with the target embedding and vocab mapping."""
    target_config = json.loads((Path(cfg.target) / "config.json").read_text())
    if cfg.warm_start:
        from eagle_assets.drafter.warm_start import warm_start

        if cfg.drafter is not None:
            raise ValueError("set either `drafter` or `warm_start`: a warm start takes the parent's architecture")
        numbering = cfg.parent_numbering if cfg.parent_numbering in ("vllm", "sglang") else None
        drafter = warm_start(cfg.warm_start, target_config, layer_id_numbering=numbering, target_embedding=embedding.float())
        if not (torch.equal(drafter.d2t.cpu(), d2t.long()) and torch.equal(drafter.t2d.cpu(), t2d.bool())):
            raise ValueError(
                f"vocab_mapping {cfg.vocab_mapping} differs from the parent drafter's d2t/t2d ({cfg.warm_start}): "
                "a warm start must keep the parent's mapping (its lm_head rows follow it). Use the mapping "
                "inherited from the parent (hidden_states.vocab.load_parent_mapping)."
            )
        _check_fit(drafter.config, ds, d2t, t2d, f"parent drafter {cfg.warm_start}")
        return drafter
    config = resolve_drafter_config(cfg, target_config, ds.aux_layer_ids, int(d2t.shape[0]))
    _check_fit(config, ds, d2t, t2d, "the drafter config")
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (FSDP2 shards local copies)
    drafter = Eagle3Drafter(config)
    drafter.load_target_embedding(embedding.float())
    drafter.set_vocab_mapping(d2t, t2d)
    return drafter


def build_optimizer(model: torch.nn.Module, lr: float, betas: tuple[float, float], weight_decay: float, fused: bool = False) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters; weight decay on matrices only (norm weights keep theirs).

    `fused` (CUDA, replicated parameters) runs the update as one kernel per parameter group.
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=1e-8, fused=fused or None)


def autocast_context(use_bf16: bool, device_type: str = "cuda"):
    return torch.autocast(device_type, dtype=torch.bfloat16) if use_bf16 else contextlib.nullcontext()


def optimizer_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler,
    micro_batches: list[dict],
    target_head: torch.Tensor,
    outside_head: torch.Tensor | None,
    *,
    ttt_steps: int,
    world_size: int,
    grad_clip: float | None,
    use_bf16: bool,
    device: torch.device,
) -> torch.Tensor:
    """One optimiser step of the (wrapped) `TrainObjective` over this rank's micro-batches.

    Each micro-batch's *summed* loss is back-propagated (gradient sync only on the last one);
    once every rank's count of trained positions is known (one all-reduce), the gradients are
    scaled to the global per-position mean. So N ranks x M micro-batches compute the same
    update as one process over the same N*M micro-batches. Returns the all-reduced totals on
    device, unsynchronised: [loss_sum, tokens, step_loss_sum (K), step_tokens (K),
    step_correct (K), grad_norm].
    """
    K = ttt_steps
    totals = torch.zeros(2 + 3 * K, dtype=torch.float32, device=device)
    for i, batch in enumerate(micro_batches):
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with grad_sync(model, enabled=i == len(micro_batches) - 1):
            with autocast_context(use_bf16, device.type):
                out = model(batch, target_head, outside_head)
            out.loss_sum.backward()
        totals += torch.cat(
            [
                out.loss_sum.detach().reshape(1),
                out.num_tokens.reshape(1),
                out.step_loss_sum,
                out.step_tokens,
                out.step_correct,
            ]
        ).float()
    _all_reduce(totals)
    # DDP and FSDP2 average gradients over ranks; the loss is a global per-position mean.
    scale = world_size / totals[1].clamp(min=1.0)
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad  # FSDP2: this rank's shard
        g.mul_(scale.to(g.dtype))
    if grad_clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
    else:
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return torch.cat([totals, norm.detach().float().reshape(1).to(totals.device)])


# ----------------------------------------------------------------------------- the trainer


def finetune_skip_reason(cfg: TrainConfig, train_samples: int, samples: int) -> str | None:
    """Why a warm start is not fine-tuned, or None when it is: on fewer training samples than
    `min_finetune_samples`, a fine-tune cannot move the parent measurably, and the held-out share
    of so small a corpus could not tell the two apart."""
    if not cfg.warm_start or train_samples >= cfg.min_finetune_samples:
        return None
    return (
        f"not fine-tuned: {train_samples} training samples are fewer than min_finetune_samples ({cfg.min_finetune_samples}), too "
        f"few to move the parent drafter measurably or to tell a fine-tune from it; the parent is exported as it is, measured on "
        f"all {samples} samples of the corpus"
    )


def _hardware(device: torch.device) -> str:
    """What trained, for the summary: the GPU's name, or the CPU's kind (its kernels differ by kind)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from eagle_assets.engines.cpu_isa import host_cpu

    return host_cpu().describe()


def _drafter_state(drafter: Eagle3Drafter) -> dict[str, torch.Tensor]:
    """A CPU copy of a plain drafter's weights in `_full_state`'s form (no frozen embedding)."""
    return {k: v.detach().cpu().clone() for k, v in drafter.state_dict().items() if not k.startswith("embed_tokens.")}


def _full_state(model, optimizer) -> tuple[dict, dict]:
    """Unsharded CPU state dicts of the drafter and the optimiser (a collective under FSDP2)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    msd = get_model_state_dict(model, options=opts)
    osd = get_optimizer_state_dict(model, optimizer, options=opts) if optimizer is not None else None
    drafter_state = {k[len("drafter.") :]: v for k, v in msd.items() if k.startswith("drafter.") and not k.startswith("drafter.embed_tokens.")}
    return drafter_state, osd


class Trainer:
    """One training run; `run()` returns the summary (on every rank)."""

    def __init__(self, cfg: TrainConfig, env: DistEnv, reporter: Reporter | None = None):
        self.cfg, self.env, self.reporter = cfg, env, reporter
        self.out = Path(cfg.out_dir)
        self.bar = None
        self.tracker = None

    def close(self) -> None:
        """Release the training data (an online source's target, or its requests in flight)."""
        if getattr(self, "ds", None) is not None:
            self.ds.close()

    # ------------------------------------------------------------------ logging
    def log(self, msg: str) -> None:
        """Printed by rank 0; sent by the reporting process (`_open_reporter`), which may be another."""
        if self.env.is_main:
            if self.bar is not None:
                self.bar.write(msg, file=sys.stderr)
            else:
                print(msg, file=sys.stderr, flush=True)
        if self.reporter is not None:
            self.reporter.log(msg)

    def _scalars(self, step: int, metrics: dict) -> None:
        """metrics.jsonl and the tracker (rank 0) + reporter (the reporting process)."""
        row = {"step": step, **metrics}
        if self.env.is_main:
            with open(self.out / METRICS_FILE, "a") as f:
                f.write(json.dumps(row) + "\n")
        if self.tracker is not None:
            self.tracker.log(step, metrics)
        if self.reporter is not None:
            self.reporter.report_metrics(row)

    def _truncate_metrics(self, last_step: int) -> None:
        """Drop metrics.jsonl rows after the resumed step (a killed run may have logged past it),
        and any line that is not a row (the torn last line of a killed write), durably."""
        path = self.out / METRICS_FILE
        if not self.env.is_main or not path.is_file():
            return
        keep = [row for row in _read_metrics(path, self.log) if row["step"] <= last_step]
        write_durably(path, "".join(json.dumps(row) + "\n" for row in keep).encode())

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        cfg, env = self.cfg, self.env
        _check_inputs(cfg)
        self.out.mkdir(parents=True, exist_ok=True)
        random.seed(cfg.seed)
        np.random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)

        from eagle_assets.drafter.target_head import draft_head, outside_head, read_target_head
        from eagle_assets.hidden_states.vocab import load_vocab_mapping

        mapping = load_vocab_mapping(cfg.vocab_mapping)
        embedding, lm_head = read_target_head(cfg.target)
        self.numbering = None
        if cfg.warm_start:
            cfg = self.cfg = self._read_parent_numbering(cfg, mapping, embedding, lm_head)
        self.ds = open_training_data(cfg, env.device, self.log)  # shards, or online (drafter/sources.py)
        self.train_ids, self.val_ids = self.ds.split(cfg.val_fraction)
        self.finetune_skipped = finetune_skip_reason(cfg, len(self.train_ids), len(self.ds))
        if self.finetune_skipped:
            # Nothing trains: every sample measures the parent.
            self.train_ids, self.val_ids = [], sorted(self.train_ids + self.val_ids)
            self.log(self.finetune_skipped)
        self.log(f"data: {describe(self.ds, self.train_ids, self.val_ids)}")
        drafter = build_drafter(cfg, self.ds, mapping.d2t, mapping.t2d, embedding)
        self.drafter_config = drafter.config
        # The parent's weights, exported instead of the fine-tune's where the parent measures higher.
        self.parent_state = _drafter_state(drafter) if cfg.warm_start and env.is_main and not self.finetune_skipped else None
        if "sglang" in cfg.export_engines:
            # The SGLang export's own config refuses what SGLang cannot serve (more layers, the
            # last layer's output, ids it cannot number): ask it before training, not after it.
            try:
                drafter.config.to_sglang_config()
            except ValueError as err:
                raise ValueError(f"{err} So leave sglang out of export_engines (checked before training, not after it).") from None

        # The setting decides, never a timing: the same run config gives the same numerics on
        # every host of one device type (the weights, optimiser and loss sums stay fp32 either way).
        self.use_bf16 = precision.trains_in_bf16(cfg.precision, env.device)
        self.precision_note = precision.precision_note(cfg.precision, self.use_bf16, env.device)
        self.log(f"precision: {self.precision_note}")
        head_dtype = torch.bfloat16 if self.use_bf16 else torch.float32
        self.target_head = draft_head(lm_head, mapping.d2t).to(env.device, head_dtype)  # (N, Ht)
        self.outside_head = outside_head(lm_head, mapping.t2d).to(env.device, head_dtype) if cfg.mask_undraftable else None  # (V-N, Ht)
        del embedding, lm_head

        self.spec = BatchingSpec(
            micro_batch_tokens=cfg.micro_batch_tokens,
            micro_batch_samples=cfg.micro_batch_samples,
            batches_per_step=env.world_size * cfg.grad_accum,
            length_window=cfg.length_window,
        )
        self.planner = BatchPlanner(self.ds.lengths(self.train_ids), self.train_ids, self.spec, cfg.seed) if self.train_ids else None
        if self.planner is None:
            self.total_steps = 0
        else:
            self.total_steps = cfg.max_steps if cfg.max_steps is not None else self.planner.total_steps(cfg.epochs, None)
        self.epoch_limit = cfg.epochs if cfg.max_steps is None else sys.maxsize

        # Resume: weights go into the plain module before it is wrapped; the rest after.
        self.resumed = None
        if env.is_main:
            ckpt.remove_stale_temp(cfg.checkpoint_dir)
        _barrier()
        latest = ckpt.latest_checkpoint(cfg.checkpoint_dir) if cfg.resume else None
        if latest is not None:
            self.resumed = ckpt.load_checkpoint(latest)
            self._check_resumable(self.resumed)
            if not torch.equal(self.resumed.model_state["d2t"], mapping.d2t.long()):
                raise ValueError(
                    f"{latest} was trained with another vocab mapping than {cfg.vocab_mapping}: its lm_head rows "
                    "follow the old one. Restore that mapping, or start afresh with resume=false"
                )
            missing, unexpected = drafter.load_state_dict(self.resumed.model_state, strict=False)
            if unexpected or [k for k in missing if not k.startswith("embed_tokens.")]:
                raise ValueError(f"{latest}: checkpoint does not match the drafter (missing {missing}, unexpected {unexpected})")

        drafter.to(env.device)
        if self.use_bf16:
            drafter.embed_tokens.to(torch.bfloat16)  # frozen lookup table: half the memory
        self.objective = TrainObjective(drafter, cfg.ttt_steps, cfg.target_temperature, cfg.unreached_weight)
        ignored = {drafter.embed_tokens.weight}
        self.model = parallelize(self.objective, cfg.parallelism, env.device, ignored_params=ignored)
        fused = env.device.type == "cuda" and cfg.parallelism == "ddp"  # FSDP2 shards: foreach update
        self.optimizer = build_optimizer(self.model, cfg.lr, cfg.betas, cfg.weight_decay, fused=fused)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, WarmupCosine(cfg.warmup_steps, self.total_steps, cfg.min_lr_ratio, cfg.cosine)
        )
        self.step = 0
        self.sampler = SamplerState()
        self.tokens_seen = 0
        if self.resumed is not None:
            self._restore(self.resumed)

    def _read_parent_numbering(self, cfg: TrainConfig, mapping, embedding: torch.Tensor, lm_head: torch.Tensor) -> TrainConfig:
        """The config with the parent's reading of its layer ids settled: its marker's, the one
        given, or, for an unmarked parent ("measure"), the reading under which it accepts more
        on the held-out samples, measured here on the shards at both readings' layers. Older
        SGLang wrote the output of layer k as k, one less than vLLM and we do, so a parent
        trained that way and read as written drafts from layers one off: a drafter that serves,
        at lower acceptance, and no other check notices. The choice is written out (and read
        back on a resumed run) and goes into the summary."""
        from eagle_assets.drafter.warm_start import parent_readings

        kept = self.out / PARENT_NUMBERING_FILE
        if kept.is_file() and cfg.resume and ckpt.latest_checkpoint(cfg.checkpoint_dir) is not None:
            self.numbering = json.loads(kept.read_text())
        else:
            target = json.loads((Path(cfg.target) / "config.json").read_text())
            layers = int((target.get("text_config") or target)["num_hidden_layers"])
            readings = parent_readings(cfg.warm_start, layers)
            if len(readings) == 1:
                ((reading, ids),) = readings.items()
                self.numbering = {"reading": reading, "aux_layer_ids": list(ids), "how": "its config says so, or no other reading fits the target"}
            elif cfg.parent_numbering in readings:
                ids = readings[cfg.parent_numbering]
                self.numbering = {"reading": cfg.parent_numbering, "aux_layer_ids": list(ids), "how": "as the run's parent_numbering says"}
            elif cfg.hidden_states != "shards":
                # Online, the states are computed at the layers asked for: no stored pair of
                # readings to measure the parent on, so its ids are read as written.
                reading, ids = next(iter(readings.items()))  # "vllm" first (NUMBERINGS)
                self.numbering = {
                    "reading": reading,
                    "aux_layer_ids": list(ids),
                    "how": "as written: training online keeps no second reading's states to measure it on (set parent_numbering)",
                }
            else:
                self.numbering = _from_rank0(self._measure_readings(cfg, readings, mapping, embedding, lm_head) if self.env.is_main else None)
            if self.env.is_main:
                _write_json(kept, self.numbering)
        accept = ", ".join(f"{r} {al:.3f}" for r, al in (self.numbering.get("val_al") or {}).items())
        self.log(
            f"parent drafter's layer ids read as {self.numbering['reading']}-numbered: {self.numbering['aux_layer_ids']} "
            f"({self.numbering['how']}{': held-out AL ' + accept if accept else ''})"
        )
        ids = tuple(self.numbering["aux_layer_ids"])
        if cfg.aux_layer_ids is not None and tuple(cfg.aux_layer_ids) != ids:
            raise ValueError(
                f"aux_layer_ids {list(cfg.aux_layer_ids)} are not the parent drafter's {list(ids)} (read as {self.numbering['reading']})"
            )
        return cfg.replace(parent_numbering=self.numbering["reading"], aux_layer_ids=ids)

    def _measure_readings(self, cfg: TrainConfig, readings: dict, mapping, embedding: torch.Tensor, lm_head: torch.Tensor) -> dict:
        """The parent's held-out AL at each reading the shards hold (chain drafting replayed
        along the held-out answers, as validation measures it), and the better reading; a tie
        keeps "vllm", the numbering as written."""
        from eagle_assets.drafter.target_head import draft_head, outside_head
        from eagle_assets.drafter.warm_start import warm_start

        stored = ShardDataset(cfg.shard_dirs, cfg.max_seq_len).stored_aux_layer_ids
        held = {r: ids for r, ids in readings.items() if set(ids) <= set(stored)}
        if not held:
            raise ValueError(
                f"the shards hold aux layers {list(stored)}, none of the parent drafter's readings {dict(readings)}: extract the hidden "
                "states with hidden_state_shards.parent_drafter set (both readings' layers are then kept), or set parent_numbering"
            )
        if len(held) == 1:
            ((reading, ids),) = held.items()
            return {"reading": reading, "aux_layer_ids": list(ids), "how": "the only reading whose layers the shards hold"}
        device = self.env.device
        target = json.loads((Path(cfg.target) / "config.json").read_text())
        head = draft_head(lm_head, mapping.d2t).to(device, torch.float32)
        outside = outside_head(lm_head, mapping.t2d).to(device, torch.float32) if cfg.mask_undraftable else None
        spec = BatchingSpec(
            micro_batch_tokens=cfg.micro_batch_tokens,
            micro_batch_samples=cfg.micro_batch_samples,
            batches_per_step=1,
            length_window=cfg.length_window,
        )
        al = {}
        for reading, ids in held.items():
            ds = ShardDataset(cfg.shard_dirs, cfg.max_seq_len, aux_layer_ids=ids)
            _, val_ids = ds.split(cfg.val_fraction)
            if not val_ids:
                raise ValueError("no held-out samples to measure the parent's readings on: raise val_fraction, or set parent_numbering")
            parent = warm_start(cfg.warm_start, target, layer_id_numbering=reading, target_embedding=embedding.float())
            objective = TrainObjective(parent.to(device), cfg.ttt_steps, cfg.target_temperature, cfg.unreached_weight).eval()
            totals = torch.zeros(2 + 4 * cfg.ttt_steps + 1, dtype=torch.float32)
            with torch.no_grad():
                for positions, counts in validation_batches(ds.lengths(val_ids), val_ids, spec, 1, cfg.val_max_batches)[0]:
                    batch = self._to_device(ds.collate(positions, torch.float32))
                    out = objective(batch, head, outside, with_correct_rows=True)
                    rounds = replay_drafting(out.correct_rows, batch["loss_mask"], batch.get("lengths"))
                    row = torch.cat(
                        [out.loss_sum.reshape(1), out.num_tokens.reshape(1), out.step_loss_sum, out.step_tokens, out.step_correct, rounds]
                    )
                    totals += row.float().cpu() * (1.0 if counts else 0.0)
            al[reading] = validation_metrics(totals, cfg.ttt_steps)["val_al"]
        best = max(held, key=lambda r: (al[r], r == "vllm"))
        return {"reading": best, "aux_layer_ids": list(held[best]), "how": "measured on the held-out samples", "val_al": al}

    def _check_resumable(self, c: ckpt.Checkpoint) -> None:
        st = c.trainer_state
        if st["batches_per_step"] != self.spec.batches_per_step:
            raise ValueError(
                f"{c.path} was written with {st['batches_per_step']} micro-batches per step (world_size x grad_accum), "
                f"this run has {self.spec.batches_per_step}: set grad_accum so that world_size x grad_accum = "
                f"{st['batches_per_step']}, or start afresh with resume=false"
            )
        saved = st["config"]
        for key in ("seed", "micro_batch_tokens", "micro_batch_samples", "max_seq_len", "length_window", "val_fraction", "ttt_steps"):
            if saved.get(key) != getattr(self.cfg, key):
                raise ValueError(
                    f"{c.path} was written with {key}={saved.get(key)!r}, this run has {getattr(self.cfg, key)!r}: "
                    "the data order would differ. Restore the setting, or start afresh with resume=false"
                )
        # Older checkpoints have no entry for these: they were all written at the default.
        for key in ("target_temperature", "unreached_weight"):
            if saved.get(key, 1.0) != getattr(self.cfg, key):
                raise ValueError(
                    f"{c.path} was written with {key}={saved.get(key, 1.0)!r}, this run has {getattr(self.cfg, key)!r}: "
                    "the loss would change objective mid-run. Restore the setting, or start afresh with resume=false"
                )

    def _restore(self, c: ckpt.Checkpoint) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        st = c.trainer_state
        set_optimizer_state_dict(self.model, self.optimizer, c.optimizer_state, options=StateDictOptions(full_state_dict=True))
        self.scheduler.load_state_dict({**st["scheduler"], "lr_lambdas": [None] * len(self.optimizer.param_groups)})
        self.step = int(st["step"])
        self.sampler = SamplerState.from_dict(st["sampler"])
        self.tokens_seen = int(st["tokens_seen"])
        rng = st["rng"]
        if self.env.rank < len(rng):
            ckpt.restore_rng_state(rng[self.env.rank])
        self.log(f"resumed from {c.path} at step {self.step} (epoch {self.sampler.epoch}, step {self.sampler.step} of it)")

    # ------------------------------------------------------------------ checkpoints
    def save(self) -> Path | None:
        drafter_state, optim_state = _full_state(self.model, self.optimizer)
        rng = ckpt.gather_json(ckpt.capture_rng_state())
        path = None
        if self.env.is_main:
            state = {
                "sampler": self.sampler.to_dict(),
                "tokens_seen": self.tokens_seen,
                "scheduler": _scheduler_state(self.scheduler),
                "rng": rng,
                "batches_per_step": self.spec.batches_per_step,
                "world_size": self.env.world_size,
                "config": self.cfg.to_dict(),
                "drafter_config": self.drafter_config.to_dict(),
            }
            path = ckpt.save_checkpoint(self.cfg.checkpoint_dir, self.step, drafter_state, optim_state, state, self.cfg.keep_last)
        _barrier()
        self.log(f"checkpoint: {Path(self.cfg.checkpoint_dir) / ckpt.checkpoint_name(self.step)}")
        return path

    # ------------------------------------------------------------------ one step
    def _plan(self):
        """(data position after the step, this rank's micro-batches as sample positions, global
        tokens) of each step left to train; the training data turns them into batches."""
        if self.planner is None:  # nothing to train (a warm start not fine-tuned)
            return
        planned = self.planner.iterate(SamplerState(self.sampler.epoch, self.sampler.step), self.epoch_limit)
        for here, step_batches in itertools.islice(planned, max(0, self.total_steps - self.step)):
            tokens = sum(sum(self.ds.lengths(b)) for b in step_batches)
            yield SamplerState(here.epoch, here.step + 1), rank_micro_batches(step_batches, self.env.rank, self.env.world_size), tokens

    def _next_step(self, steps) -> tuple | None:
        """The next step's data, or None at the end. An online source that fails on any rank stops
        every rank alike: the steps trained so far are checkpointed, then the failure is raised."""
        failure = None
        try:
            item = next(steps, None)
        except HiddenStateSourceError as err:
            item, failure = None, err
        if self.env.world_size > 1 and self.ds.source != "shards":  # the ranks agree, or one would wait on the others forever
            failed = _all_reduce(torch.tensor([0.0 if failure is None else 1.0], device=self.env.device))
            if failure is None and failed.item() > 0:
                failure = HiddenStateSourceError("another process lost its online hidden-state source (its log names it)")
        if failure is None:
            return item
        last = ckpt.latest_checkpoint(self.cfg.checkpoint_dir)
        if self.step > 0 and (last is None or last.name != ckpt.checkpoint_name(self.step)):
            self.save()
        self.log(f"stopped at step {self.step} of {self.total_steps}: {failure}")
        raise failure

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.env.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, micro_batches: list[dict]) -> torch.Tensor:
        self.last_lr = self.optimizer.param_groups[0]["lr"]  # the rate this step uses
        return optimizer_step(
            self.model,
            self.optimizer,
            self.scheduler,
            micro_batches,
            self.target_head,
            self.outside_head,
            ttt_steps=self.cfg.ttt_steps,
            world_size=self.env.world_size,
            grad_clip=self.cfg.grad_clip,
            use_bf16=self.use_bf16,
            device=self.env.device,
        )

    # ------------------------------------------------------------------ validation
    @torch.no_grad()
    def validate(self) -> dict:
        """Held-out loss, per-step accuracy, and the per-position acceptance and AL of chain
        drafting replayed along the held-out answers (`ttt.replay_drafting`). The replay's counts
        per held-out sample, in `val_ids` order, are left in `self.val_counts` ((n, K+1), for the
        paired comparison with a parent)."""
        K = self.cfg.ttt_steps
        per_rank = validation_batches(self.ds.lengths(self.val_ids), self.val_ids, self.spec, self.env.world_size, self.cfg.val_max_batches)
        if not self.val_ids:
            self.val_counts = np.zeros((0, K + 1))
            return {}
        mine = per_rank[self.env.rank]
        dtype = torch.bfloat16 if self.use_bf16 else torch.float32
        totals = torch.zeros(2 + 3 * K + K + 1, dtype=torch.float32, device=self.env.device)
        row_of = {p: i for i, p in enumerate(self.val_ids)}
        per_sample = torch.zeros(len(self.val_ids), K + 1, dtype=torch.float32, device=self.env.device)  # each filled by one rank
        self.model.eval()
        for positions, counts in mine:
            batch = self._to_device(self.ds.collate(positions, dtype))
            with autocast_context(self.use_bf16, self.env.device.type):
                out = self.model(batch, self.target_head, self.outside_head, with_correct_rows=True)
            sequences = replay_drafting_per_sequence(out.correct_rows, batch["loss_mask"], batch.get("lengths")).to(totals.device)
            if counts:
                per_sample[[row_of[p] for p in positions]] = sequences
            row = torch.cat(
                [
                    out.loss_sum.reshape(1),
                    out.num_tokens.reshape(1),
                    out.step_loss_sum,
                    out.step_tokens,
                    out.step_correct,
                    sequences.sum(0),
                ]
            ).float()
            totals += row * (1.0 if counts else 0.0)
        self.model.train()
        _all_reduce(totals)
        _all_reduce(per_sample)
        self.val_counts = per_sample.cpu().numpy()
        return validation_metrics(totals.cpu(), K)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict | None:
        cfg, env = self.cfg, self.env
        self.setup()
        start_step = self.step
        if env.is_main:
            from tqdm import tqdm

            self._truncate_metrics(start_step)
            self.tracker = open_tracker(cfg, resumed_at=start_step)
            self.bar = tqdm(total=self.total_steps, initial=start_step, desc="train", unit="step", dynamic_ncols=True)
        self.log(
            f"training {self.total_steps} steps ({cfg.parallelism}, {env.world_size} process(es) x "
            f"{cfg.grad_accum} accumulation, device {env.device}, bf16={self.use_bf16}, ttt_steps={cfg.ttt_steps})"
        )
        last_val: dict = {}
        parent_file = self.out / PARENT_VALIDATION_FILE
        if cfg.warm_start and start_step == 0 and not self.finetune_skipped:
            # The parent on the same held-out samples, before any update: the end of the run
            # compares the fine-tune with this. Written once; a resumed run reads it back.
            parent_val = self.validate()
            if env.is_main:
                _write_json(parent_file, {**parent_val, "counts_per_sample": self.val_counts.tolist()})
            al = parent_val.get("val_al")
            self.log("parent drafter on the held-out samples: " + (f"AL {al:.3f}" if al is not None else "no held-out samples"))
        window_tokens, window_start, t0 = 0, time.perf_counter(), time.perf_counter()
        dtype = torch.bfloat16 if self.use_bf16 else torch.float32
        stream = self.ds.stream(self._plan(), dtype, env.device)
        steps = iter(stream)
        try:
            while self.step < self.total_steps and (item := self._next_step(steps)) is not None:
                next_pos, micro, tokens = item
                totals = self.train_step(micro)
                self.step += 1
                self.sampler = next_pos
                self.tokens_seen += tokens
                window_tokens += tokens
                if self.bar is not None:
                    self.bar.update(1)
                last = self.step == self.total_steps
                if cfg.log_every and (self.step % cfg.log_every == 0 or last):
                    now = time.perf_counter()
                    metrics = train_metrics(totals.cpu(), cfg.ttt_steps)
                    metrics.update(
                        lr=self.last_lr,
                        tokens_per_s=window_tokens / max(now - window_start, 1e-9),
                        epoch=self.sampler.epoch,
                        tokens_seen=self.tokens_seen,
                    )
                    if not math.isfinite(metrics["loss"]):
                        raise FloatingPointError(
                            f"loss is {metrics['loss']} at step {self.step}; lower lr or grad_clip and resume from "
                            f"the last checkpoint in {cfg.checkpoint_dir}"
                        )
                    self._scalars(self.step, metrics)
                    if self.bar is not None:
                        self.bar.set_postfix(loss=f"{metrics['loss']:.4f}", acc0=f"{metrics['acc'][0]:.3f}", tok_s=f"{metrics['tokens_per_s']:.0f}")
                    window_tokens, window_start = 0, now
                if cfg.val_interval and self.step % cfg.val_interval == 0 and not last:
                    last_val = self._validate_and_log()
                if cfg.checkpoint_every and (self.step % cfg.checkpoint_every == 0 or last):
                    self.save()
        finally:
            stream.close()
        last_val = self._validate_and_log() or last_val
        comparison = self._compare_with_parent(parent_file) if env.is_main else None  # the main rank exports
        keep_parent = comparison is not None and comparison.kept == "parent"
        exports = self.export(self.parent_state if keep_parent else None)
        summary = None
        if env.is_main:
            summary = self._summary(last_val, exports, time.perf_counter() - t0, start_step, comparison)
            _write_json(self.out / SUMMARY_FILE, summary)
            from eagle_assets.drafter.model_card import write_model_card

            for engine, path in exports.items():
                write_model_card(path, summary, self.cfg, engine)
            self.bar.close()
            if self.tracker is not None:
                self.tracker.close()
        summary = _from_rank0(summary)  # the reporting process may be another rank
        if self.reporter is not None and hasattr(self.reporter, "report_final"):
            self.reporter.report_final(summary)
        return summary

    def _validate_and_log(self) -> dict:
        metrics = self.validate()
        if metrics:
            self._scalars(self.step, metrics)
            accept = ", ".join(f"{p:.3f}" for p in metrics["val_accept"])
            self.log(f"validation at step {self.step}: loss {metrics['val_loss']:.4f}, AL {metrics['val_al']:.3f}, p_k [{accept}]")
        return metrics

    def _compare_with_parent(self, parent_file: Path) -> ParentComparison | None:
        """The trained drafter against its parent on the same held-out samples (a warm start
        that trained, with held-out samples), logged; None otherwise."""
        if not self.cfg.warm_start or self.finetune_skipped or not self.val_ids or not parent_file.is_file():
            return None
        parent = json.loads(parent_file.read_text()).get("counts_per_sample")
        if parent is None or not np.asarray(parent)[:, 0].any():  # written before counts were kept, or nothing drafted
            return None
        comparison = compare_with_parent(np.asarray(parent), self.val_counts, seed=self.cfg.seed)
        self.log(comparison.sentence())
        return comparison

    def export(self, state: dict | None = None) -> dict[str, str]:
        """Export the trained drafter, or `state` (the parent's weights) in its place."""
        if not self.cfg.export_engines:
            return {}
        drafter_state, _ = _full_state(self.model, None)
        drafter_state = state if state is not None else drafter_state
        out = {}
        if self.env.is_main:
            from eagle_assets.drafter.export import export_sglang, export_vllm

            writers = {"vllm": export_vllm, "sglang": export_sglang}
            for engine in self.cfg.export_engines:
                path = writers[engine](drafter_state, self.drafter_config, self.cfg.export_dir(engine))
                out[engine] = str(path)
        out = _from_rank0(out)  # the reporting process may be another rank
        for engine, path in out.items():
            self.log(f"exported the {engine} drafter to {path}")
        return out

    def _summary(self, val: dict, exports: dict, seconds: float, start_step: int, comparison: ParentComparison | None = None) -> dict:
        last = ckpt.latest_checkpoint(self.cfg.checkpoint_dir)
        rows = _read_metrics(self.out / METRICS_FILE)
        train_rows = [r for r in rows if "loss" in r]
        parent_file = self.out / PARENT_VALIDATION_FILE
        finetuned_al = val.get("val_al")
        if comparison is not None and comparison.kept == "parent":
            val = json.loads(parent_file.read_text())  # the exported drafter's validation: the parent's
        if not self.cfg.warm_start:
            exported = "trained"
        elif self.finetune_skipped:
            exported = "parent, not fine-tuned"
        else:
            exported = comparison.kept if comparison is not None else "fine-tune"
        return {
            "steps": self.step,
            "resumed_from_step": start_step or None,
            "tokens_seen": self.tokens_seen,
            "world_size": self.env.world_size,
            "parallelism": self.cfg.parallelism,
            "precision": "bf16 autocast" if self.use_bf16 else "fp32",
            "precision_setting": self.cfg.precision,
            "precision_note": self.precision_note,
            "hardware": _hardware(self.env.device),
            "final_loss": train_rows[-1]["loss"] if train_rows else None,
            "val_loss": val.get("val_loss"),
            "val_al": val.get("val_al"),
            "val_accept": val.get("val_accept"),
            "ttt_steps": self.cfg.ttt_steps,
            "epochs": self.cfg.epochs,
            "train_samples": len(self.train_ids),
            "train_tokens": sum(self.ds.lengths(self.train_ids)),
            "val_samples": len(self.val_ids),
            "checkpoint": str(last) if last else None,
            "exports": exports,
            "seconds": seconds,
            "drafter_config": self.drafter_config.to_dict(),
            "aux_layer_ids": list(self.drafter_config.aux_layer_ids),
            "warm_start": self.cfg.warm_start,
            "exported": exported,
            "finetune_skipped": self.finetune_skipped,
            "finetuned_val_al": finetuned_al if self.cfg.warm_start and not self.finetune_skipped else None,
            "parent_val_al": (finetuned_al if self.finetune_skipped else _parent_val_al(parent_file)) if self.cfg.warm_start else None,
            "parent_comparison": comparison.to_dict() if comparison is not None else None,
            "hidden_states": self.ds.source,
            "hidden_states_origin": self.ds.origin,
            "parent_numbering": self.numbering,
        }


# ----------------------------------------------------------------------------- metrics


def train_metrics(totals: torch.Tensor, K: int) -> dict:
    """Scalars from the all-reduced totals of one step (see `Trainer.train_step`)."""
    loss_sum, tokens = float(totals[0]), float(totals[1])
    step_loss, step_tokens, step_correct = totals[2 : 2 + K], totals[2 + K : 2 + 2 * K], totals[2 + 2 * K : 2 + 3 * K]
    return {
        "loss": loss_sum / max(tokens, 1.0),
        "tokens": tokens,
        "step_loss": (step_loss / step_tokens.clamp(min=1)).tolist(),
        "acc": (step_correct / step_tokens.clamp(min=1)).tolist(),
        "grad_norm": float(totals[2 + 3 * K]),
    }


def acceptance_length(accept: list[float]) -> float:
    """Expected tokens per verification step from per-position acceptance p_k: 1 + sum_k p_k."""
    return 1.0 + float(sum(accept))


def validation_metrics(totals: torch.Tensor, K: int) -> dict:
    """Held-out metrics from `Trainer.validate`'s totals [loss_sum, tokens, step_loss_sum (K),
    step_tokens (K), step_correct (K), replayed round counts (K+1)].

    `val_accept` p_k and `val_al` = 1 + sum_k p_k come from drafting replayed along the held-out
    answers (the reference decoder's definitions, docs/design.md "Metrics"). The teacher-forced
    estimate, the running product of per-step accuracies, is kept as `val_accept_teacher_forced`:
    it averages over every position alike and so reads higher than drafting achieves."""
    loss_sum, tokens = float(totals[0]), float(totals[1])
    step_loss, step_tokens, step_correct = totals[2 : 2 + K], totals[2 + K : 2 + 2 * K], totals[2 + 2 * K : 2 + 3 * K]
    rounds = totals[2 + 3 * K : 3 + 4 * K]
    acc = step_correct / step_tokens.clamp(min=1)
    accept = (rounds[1:] / rounds[0].clamp(min=1)).tolist()
    return {
        "val_loss": loss_sum / max(tokens, 1.0),
        "val_tokens": tokens,
        "val_step_loss": (step_loss / step_tokens.clamp(min=1)).tolist(),
        "val_acc": acc.tolist(),
        "val_rounds": float(rounds[0]),
        "val_accept": accept,
        "val_al": acceptance_length(accept),
        "val_accept_teacher_forced": torch.cumprod(acc, dim=0).tolist(),
    }


def _read_metrics(path: Path, warn: Callable[[str], None] | None = None) -> list[dict]:
    """The rows of metrics.jsonl, in order. A line that is not a JSON object with an integer
    "step" (the torn last line of a run killed mid-write, or garbage) is left out, and `warn`
    (default: a warning on stderr) is told which: the file is a log, and the rows after the
    resumed checkpoint are logged again when their steps are replayed."""
    if not path.is_file():
        return []
    rows, bad = [], []
    for number, line in enumerate(path.read_bytes().split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        message = f"{path}: line(s) {bad[:5]} are not metric rows (a torn write?); left out"
        (warn or (lambda m: print(m, file=sys.stderr)))(message)
    return rows


def _write_json(path: Path, obj) -> None:
    write_durably(path, json.dumps(obj, indent=2).encode())


# ----------------------------------------------------------------------------- entry points


def _open_reporter(reporter: Reporter | None, env: DistEnv, stack: contextlib.ExitStack) -> Reporter | None:
    """The caller's reporter on rank 0, or Dagster Pipes on the first process Dagster launched.

    Dagster sets the Pipes variables on the one node it launches (the others are started by
    hand or by a job controller, without them). torchrun's c10d rendezvous ignores
    `--node_rank` and numbers the nodes in its own order (sorted host names, then process
    ids), so global rank 0 may run on another node, where no Pipes context exists: the launched
    node's local rank 0 reports instead, so that Dagster sees the run whatever rank it got."""
    if reporter is not None:
        return reporter if env.rank == 0 else None
    if os.environ.get("DAGSTER_PIPES_CONTEXT") and env.local_rank == 0:
        from dagster_pipes import open_dagster_pipes

        return PipesReporter(stack.enter_context(open_dagster_pipes()))
    return None


def train(cfg: TrainConfig, reporter: Reporter | None = None) -> dict | None:
    """Run one training (joining torchrun's process group if there is one)."""
    env = setup_distributed()
    try:
        return _train_in(env, cfg, reporter)
    except BaseException as err:
        if env.owns_group:  # the traceback's frames hold the trainer; freed after the group below, it would hang
            traceback.clear_frames(err.__traceback__)
        raise
    finally:
        if env.owns_group and dist.is_initialized():
            # The wrapped model (DDP's reducer, FSDP's mesh) must die while the group still
            # holds the process group: if the model's reference is the last, its destructor
            # joins gloo's worker threads holding the GIL, while a worker finishing a
            # collective waits for the GIL to free that collective's tensors (a deadlock that
            # leaves the next launch's rendezvous waiting 30 minutes). `_train_in` has
            # returned, so only reference cycles can still hold it.
            gc.collect()
            dist.destroy_process_group()


def _train_in(env: DistEnv, cfg: TrainConfig, reporter: Reporter | None) -> dict | None:
    with contextlib.ExitStack() as stack:
        rep = _open_reporter(reporter, env, stack)
        trainer = Trainer(cfg, env, rep)
        stack.callback(trainer.close)
        return trainer.run()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m eagle_assets.drafter.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="run.json written by TrainConfig.save()")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, reporter: Reporter | None = None) -> dict | None:
    """Command-line entry: `--config run.json`; returns the summary."""
    args = parse_args(argv)
    return train(TrainConfig.load(args.config), reporter=reporter)


if __name__ == "__main__":
    main()
