"""Served tokens/s on this CPU host: vLLM's own thread binding against ours, side by side.

    python benchmarks/engine_threads.py --drafter DIR                  # 8 MT-Bench prompts, K=2 and 3
    python benchmarks/engine_threads.py --drafter DIR --num-prompts 16 -k 3 --concurrency 1 --concurrency 8

vLLM keeps one core out of its model worker's OpenMP threads for its front end; on a host of
`SMALL_CPU_HOST` CPUs or fewer, `engines/vllm_launch.py: cpu_threads_bind` gives the worker every
core. For each binding this starts the real vLLM CPU server without speculation, with the
EAGLE-3 drafter at each K and with n-gram speculation (the last K), sends the same MT-Bench first
turns (greedy, a fixed output length), and prints tokens/s, each method's speedup over the
baseline of the same binding and ours against vLLM's. Served acceptance comes from the engine's
counters and should not move with the binding (the same fp32 greedy decoding, on one thread or
two).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from env_override import environment_variable
from served_on_cpu import served_on_cpu
from side_by_side import parse_arguments, speculation_configs, table

from eagle_assets.bench.served import ServedRun, SweepSettings, mt_bench_prompts
from eagle_assets.engines.vllm_launch import cpu_threads_bind

BINDINGS = {
    "vLLM's": "auto",  # vLLM's default: one core kept for the API server and scheduler
    "ours": None,  # unset: engine_environment applies cpu_threads_bind
}


def measure(drafter: Path, ks: list[int], prompts, sweep: SweepSettings) -> dict[str, dict[str, ServedRun]]:
    """{binding: {config label: ServedRun}}."""
    runs: dict[str, dict[str, ServedRun]] = {}
    for name, value in BINDINGS.items():
        with environment_variable("VLLM_CPU_OMP_THREADS_BIND", value):
            for label, spec in speculation_configs(drafter, ks).items():
                run = served_on_cpu(label, spec, prompts, sweep)
                runs.setdefault(name, {})[label] = run
                level = run.level(sweep.concurrencies[0])
                print(f"  {name} binding, {label}: {level.tokens_per_s:.1f} tok/s at concurrency {level.concurrency}", flush=True)
    return runs


def main(argv: list[str] | None = None) -> int:
    a = parse_arguments(__doc__, argv, num_prompts=8, ks=[2, 3])
    cpus = sorted(os.sched_getaffinity(0))
    if cpu_threads_bind(cpus) is None:
        sys.exit(f"this host has {len(cpus)} CPUs: ours is vLLM's own binding here, nothing to compare")
    print(f"{len(cpus)} CPUs; {a.num_prompts} MT-Bench first turns, {a.output_len} tokens each, greedy; drafter {a.drafter}", flush=True)
    runs = measure(a.drafter.resolve(), a.k, mt_bench_prompts(a.num_prompts), a.sweep)
    print(table(runs, a.sweep.concurrencies, "vLLM's", "ours"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
