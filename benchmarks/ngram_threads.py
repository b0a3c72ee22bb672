"""n-gram speculation on the CPU engine: numba's OpenMP layer against its own thread pool, side by side.

    python benchmarks/ngram_threads.py                      # 8 MT-Bench prompts, concurrency 1 and 8
    python benchmarks/ngram_threads.py --num-prompts 16 -k 3 --concurrency 1

vLLM's n-gram proposer runs numba parallel loops after `set_num_threads(1)`. On numba's OpenMP
layer (numba's choice when nothing says otherwise), over the Intel OpenMP the CPU engine preloads,
that leaves the model worker's thread a team of one, so every forward after the first proposal
runs on one core. `engines/vllm_launch.py: engine_environment` sets `NUMBA_THREADING_LAYER=workqueue`
(numba's own pool). This starts the real vLLM CPU server without speculation and with n-gram
under each layer, sends the same MT-Bench first turns (greedy, a fixed output length), and prints
tokens/s, n-gram's speedup over no speculation, and ours against the OpenMP layer.
"""

from __future__ import annotations

import argparse
import os

from env_override import environment_variable
from served_on_cpu import served_on_cpu

from eagle_assets.bench.served import ServedRun, SweepSettings, mt_bench_prompts
from eagle_assets.engines.vllm_launch import ngram_config

LAYERS = {
    "numba's OpenMP layer": "omp",  # what the engine gets when nothing sets the layer
    "ours (workqueue)": None,  # unset: engine_environment applies workqueue
}


def serve_and_measure(label: str, spec: dict | None, layer: str | None, prompts, sweep: SweepSettings) -> ServedRun:
    with environment_variable("NUMBA_THREADING_LAYER", layer):
        run = served_on_cpu(label, spec, prompts, sweep)
    for lv in run.levels:
        print(f"  {label}: {lv.tokens_per_s:.1f} tok/s at concurrency {lv.concurrency}", flush=True)
    return run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("-k", type=int, default=3, help="n-gram's draft tokens per step")
    ap.add_argument("--concurrency", type=int, action="append", help="concurrency levels (repeat); default 1 and 8")
    a = ap.parse_args(argv)
    sweep = SweepSettings(output_len=a.output_len, concurrencies=tuple(a.concurrency or [1, 8]), progress=False)
    prompts = mt_bench_prompts(a.num_prompts)
    print(f"{len(os.sched_getaffinity(0))} CPUs; {a.num_prompts} MT-Bench first turns, {a.output_len} tokens each, greedy", flush=True)
    base = serve_and_measure("no speculation", None, None, prompts, sweep)
    ngram = {name: serve_and_measure(f"n-gram K={a.k}, {name}", ngram_config(a.k), layer, prompts, sweep) for name, layer in LAYERS.items()}
    omp, ours = ngram.values()
    print(f"{'concurrency':>12} {'no speculation':>15} " + " ".join(f"{name:>22}" for name in LAYERS) + f" {'ours / OpenMP':>14}")
    for c in sweep.concurrencies:
        b = base.level(c).tokens_per_s
        cells = [f"{r.level(c).tokens_per_s:.1f} ({r.level(c).tokens_per_s / b:.2f}x)" for r in (omp, ours)]
        print(f"{c:>12} {b:>15.1f} " + " ".join(f"{x:>22}" for x in cells) + f" {ours.level(c).tokens_per_s / omp.level(c).tokens_per_s:>13.2f}x")
    al = [r.level(sweep.concurrencies[0]).spec.al for r in (omp, ours)]
    print(f"served AL over drafts: OpenMP layer {al[0]:.3f}, ours {al[1]:.3f} (the same greedy decoding)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
