"""Numeric settings: exact fp32 for the reference paths (in-process generation, the offline
decoder), and whether the trainer's bf16 autocast pays on this device."""

from __future__ import annotations

import functools
import time

import torch


def use_exact_fp32(device: str | torch.device) -> None:
    """Keep fp32 matmuls fp32 on CUDA: TF32 would round their inputs to 10-bit mantissas, and the
    result would no longer be the function the CPU engine serves in fp32 (greedy paths drift)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


@functools.cache
def cpu_bf16_speedup(size: int = 512, reps: int = 3) -> float:
    """How many times faster a bf16 matmul runs than an fp32 one on this host's CPU, measured.

    CPUs with bf16 instructions (AVX512-BF16, AMX) run bf16 matmuls several times faster than
    fp32 (benchmarks/results/cpu_training_cpu2_2026-12-02.md); without them bf16 is emulated
    and slower. Which kind a host is cannot be read portably from torch, so the trainer asks
    this once, with a few small matmuls."""
    a, b = torch.randn(size, 2 * size), torch.randn(2 * size, 4 * size)

    def best_of(x: torch.Tensor, y: torch.Tensor) -> float:
        x @ y  # warm-up: oneDNN picks its kernel on the first call
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            x @ y
            times.append(time.perf_counter() - start)
        return min(times)

    return best_of(a, b) / best_of(a.bfloat16(), b.bfloat16())


CPU_BF16_MIN_SPEEDUP = 1.5
"""Below this, bf16 autocast on a CPU would not pay for its casts and rounding: train in fp32."""


def bf16_autocast_pays(device: str | torch.device) -> bool:
    """Train in bf16 autocast on this device: always on CUDA; on a CPU when its bf16 matmuls
    run at least CPU_BF16_MIN_SPEEDUP times fp32's."""
    kind = torch.device(device).type
    return kind == "cuda" or (kind == "cpu" and cpu_bf16_speedup() >= CPU_BF16_MIN_SPEEDUP)
