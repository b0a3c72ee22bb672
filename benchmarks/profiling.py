"""What the benchmark scripts share: one step's costliest operators under torch.profiler."""

from __future__ import annotations

from collections.abc import Callable

import torch


def print_profile(step: Callable[[], object], device: torch.device, rows: int, name_width: int = 70) -> None:
    """Run `step` once under torch.profiler and print the `rows` operators that took the most
    device time (CPU time on a CPU), synchronising so that the step's kernels are all counted."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=name_width), flush=True)
