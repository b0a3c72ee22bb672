"""Two gloo processes (DDP, then FSDP2) compute what one process computes on the same global
batch: the same per-step losses and the same gradients, in fp32.

One process accumulates 2 micro-batches per step; two processes take one each. The gradient
of step 1 is read back from the checkpoint: with no clipping, AdamW's first moment after one
step is exactly (1 - beta1) * grad.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets_tests.drafter.test_train import one_thread, read_metrics, write_tiny_run  # noqa: F401

STEPS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, configs: list[str]) -> None:
    """One torchrun-like rank: the environment torchrun would set, then the trainer's own entry."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from eagle_assets.drafter.train import main

    for config in configs:  # each run joins and leaves its own process group
        main(["--config", config])


def _step1_grads(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """Gradients of step 1: exp_avg / (1 - beta1) from the step-1 checkpoint."""
    tensors = load_file(str(Path(cfg.checkpoint_dir) / "step-00000001" / ckpt.OPTIMIZER_FILE))
    return {k: v / (1 - cfg.betas[0]) for k, v in tensors.items() if k.endswith("/exp_avg")}


def _losses(cfg: TrainConfig) -> list[float]:
    return [r["loss"] for r in read_metrics(cfg.out_dir) if "loss" in r]


def test_two_processes_equal_one_with_the_same_global_batch(tmp_path, one_thread):  # noqa: F811
    from eagle_assets.drafter.train import train

    base = write_tiny_run(
        tmp_path, num_samples=16, max_steps=STEPS, micro_batch_samples=2, grad_clip=None,
        checkpoint_every=1, keep_last=STEPS, warmup_steps=1, lr=1e-2,
    )
    single = base.replace(out_dir=str(tmp_path / "one"), grad_accum=2)
    ddp = base.replace(out_dir=str(tmp_path / "ddp"), parallelism="ddp")
    fsdp = base.replace(out_dir=str(tmp_path / "fsdp2"), parallelism="fsdp2")
    paths = [str(ddp.save(tmp_path / "ddp.json")), str(fsdp.save(tmp_path / "fsdp2.json"))]
    mp.start_processes(_worker, args=(2, _free_port(), paths), nprocs=2, start_method="spawn", join=True)
    train(single)

    ref_losses, ref_grads = _losses(single), _step1_grads(single)
    assert len(ref_losses) == STEPS and len(ref_grads) == 13  # fc, 10 layer weights, norm, lm_head
    for cfg in (ddp, fsdp):
        assert _losses(cfg) == pytest.approx(ref_losses, rel=1e-6, abs=1e-7), cfg.parallelism
        grads = _step1_grads(cfg)
        assert set(grads) == set(ref_grads)
        for name, g in ref_grads.items():
            assert g.abs().max() > 0, name  # every weight learns
            torch.testing.assert_close(grads[name], g, rtol=1e-5, atol=1e-7, msg=lambda m: f"{cfg.parallelism} {name}: {m}")
        final = load_file(str(Path(cfg.checkpoint_dir) / f"step-{STEPS:08d}" / ckpt.MODEL_FILE))
        ref_final = load_file(str(Path(single.checkpoint_dir) / f"step-{STEPS:08d}" / ckpt.MODEL_FILE))
        for name, w in ref_final.items():
            torch.testing.assert_close(final[name], w, rtol=1e-5, atol=1e-6, msg=lambda m: f"{cfg.parallelism} {name}: {m}")
