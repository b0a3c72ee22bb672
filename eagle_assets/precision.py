"""Numeric settings shared by the fp32 reference paths (in-process generation, the offline decoder)."""

from __future__ import annotations

import torch


def use_exact_fp32(device: str | torch.device) -> None:
    """Keep fp32 matmuls fp32 on CUDA: TF32 would round their inputs to 10-bit mantissas, and the
    result would no longer be the function the CPU engine serves in fp32 (greedy paths drift)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
