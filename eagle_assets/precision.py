"""Numeric settings: exact fp32 for the reference paths (in-process generation, the offline
decoder), and the trainer's precision as its setting chooses it."""

from __future__ import annotations

import torch


def use_exact_fp32(device: str | torch.device) -> None:
    """Keep fp32 matmuls fp32 on CUDA: TF32 would round their inputs to 10-bit mantissas, and the
    result would no longer be the function the CPU engine serves in fp32 (greedy paths drift)."""
    if torch.device(device).type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def trains_in_bf16(setting: str, device: str | torch.device) -> bool:
    """Whether training runs under bf16 autocast, by `TrainConfig.precision`: "auto" on CUDA
    only (a CPU's bf16 kernels differ by processor kind, and so would the run's numbers),
    "bf16" everywhere, "fp32" nowhere."""
    if setting == "auto":
        return torch.device(device).type == "cuda"
    return setting == "bf16"


def precision_note(setting: str, use_bf16: bool, device: str | torch.device) -> str:
    """One line for the log and the model card: what the run trains in, and why."""
    chosen = "bf16 autocast" if use_bf16 else "fp32"
    if setting != "auto":
        return f"{chosen} (precision={setting})"
    kind = torch.device(device).type
    why = "the tensor cores' rate" if kind == "cuda" else "the same numbers on every CPU kind"
    return f"{chosen} (precision=auto on {kind}: {why})"
