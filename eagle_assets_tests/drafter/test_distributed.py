"""Two gloo processes (DDP, then FSDP2) compute what one process computes on the same global
batch: the same per-step losses and the same gradients, in fp32, also across a resume.

One process accumulates 2 micro-batches per step; two processes take one each. The gradient
of step 1 is read back from the checkpoint: with no clipping, AdamW's first moment after one
step is exactly (1 - beta1) * grad.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file

from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets_tests.drafter.test_train import read_metrics, write_tiny_run

STEPS = 3
RESUMED_AT = 1  # the first launch stops (and checkpoints) after step 1; the second resumes
LAUNCHES_DEADLINE_S = 300  # ~10 s here; a hung rendezvous would otherwise wait gloo's 30 minutes


def free_ports(n: int) -> list[int]:
    """n distinct free TCP ports (all held open while choosing, so they differ)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _worker(rank: int, world: int, runs: list[tuple[str, int]]) -> None:
    """One torchrun-like rank: the environment torchrun would set, then the trainer's own entry.

    Each run gets its own rendezvous port, as each torchrun launch does: reusing one would let
    a fast rank reach the previous run's store before the slow rank has torn it down.
    """
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    from eagle_assets.drafter.train import main

    for config, port in runs:  # each run joins and leaves its own process group
        os.environ["MASTER_PORT"] = str(port)
        main(["--config", config])


def _run_ranks(launches: list[tuple[str, int]], deadline_s: float) -> None:
    """Both ranks through every launch; a hang fails within `deadline_s` instead of gloo's 30 minutes."""
    context = mp.start_processes(_worker, args=(2, launches), nprocs=2, start_method="spawn", join=False)
    deadline = time.monotonic() + deadline_s
    while not context.join(timeout=max(0.0, deadline - time.monotonic())):
        if time.monotonic() >= deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"the two ranks did not finish {len(launches)} launches in {deadline_s:.0f} s (a hang at a launch's start or end)")


def _step1_grads(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """Gradients of step 1: exp_avg / (1 - beta1) from the step-1 checkpoint."""
    tensors = load_file(str(Path(cfg.checkpoint_dir) / "step-00000001" / ckpt.OPTIMIZER_FILE))
    return {k: v / (1 - cfg.betas[0]) for k, v in tensors.items() if k.endswith("/exp_avg")}


def _assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str, **tolerance) -> None:
    torch.testing.assert_close(actual, expected, msg=lambda m: f"{what}: {m}", **tolerance)


def _losses(cfg: TrainConfig) -> list[float]:
    return [r["loss"] for r in read_metrics(cfg.out_dir) if "loss" in r]


def test_two_processes_equal_one_with_the_same_global_batch(tmp_path, one_thread):
    """Each distributed run is also resumed: one launch takes step 1, a second continues to step 3."""
    from eagle_assets.drafter.train import train

    base = write_tiny_run(
        tmp_path,
        num_samples=16,
        max_steps=STEPS,
        micro_batch_samples=2,
        grad_clip=None,
        cosine=False,
        checkpoint_every=2,
        keep_last=STEPS,
        warmup_steps=1,
        lr=1e-2,
    )
    single = base.replace(out_dir=str(tmp_path / "one"), grad_accum=2, checkpoint_every=1)
    runs = {mode: base.replace(out_dir=str(tmp_path / mode), parallelism=mode, max_steps=RESUMED_AT) for mode in ("ddp", "fsdp2")}
    configs = []
    for mode, cfg in runs.items():
        configs.append(str(cfg.save(tmp_path / f"{mode}-first.json")))
        configs.append(str(cfg.replace(max_steps=STEPS).save(tmp_path / f"{mode}-resumed.json")))
    launches = list(zip(configs, free_ports(len(configs)), strict=True))
    _run_ranks(launches, deadline_s=LAUNCHES_DEADLINE_S)
    train(single)

    ref_losses, ref_grads = _losses(single), _step1_grads(single)
    assert len(ref_losses) == STEPS and len(ref_grads) == 13  # fc, 10 layer weights, norm, lm_head
    ref_final = load_file(str(Path(single.checkpoint_dir) / f"step-{STEPS:08d}" / ckpt.MODEL_FILE))
    for mode, cfg in runs.items():
        summary = json.loads((Path(cfg.out_dir) / "summary.json").read_text())
        assert summary["resumed_from_step"] == RESUMED_AT and summary["world_size"] == 2
        assert _losses(cfg) == pytest.approx(ref_losses, rel=1e-6, abs=1e-7), mode
        grads = _step1_grads(cfg)
        assert set(grads) == set(ref_grads)
        for name, g in ref_grads.items():
            assert g.abs().max() > 0, name  # every weight learns
            _assert_close(grads[name], g, f"{mode} grad {name}", rtol=1e-5, atol=1e-7)
        final = load_file(str(Path(cfg.checkpoint_dir) / f"step-{STEPS:08d}" / ckpt.MODEL_FILE))
        assert set(final) == set(ref_final)
        for name, w in ref_final.items():
            _assert_close(final[name], w, f"{mode} weight {name}", rtol=1e-5, atol=1e-6)
