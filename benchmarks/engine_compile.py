"""Served tokens/s on this CPU host: vLLM running the models eagerly against compiled, side by side.

    python benchmarks/engine_compile.py --drafter DIR                  # 16 MT-Bench prompts, K=3
    python benchmarks/engine_compile.py --drafter DIR --num-prompts 80 -k 2 -k 3 --concurrency 1 --concurrency 8

On a CPU host our servers run eagerly by default (`--enforce-eager`, compilation off): a server
starts several times sooner, which tests, `make run` and the drafter's checks want. A
deployment compiles (torch.compile with inductor, the target and the drafter alike), and that
changes both tokens/s and the speedup speculation shows. For each mode this starts the real
vLLM CPU server without speculation, with the EAGLE-3 drafter at each K and with n-gram
speculation (the last K), sends the same MT-Bench first turns (greedy, a fixed output length),
and prints tokens/s, each method's speedup over the baseline of the same mode and compiled
against eager. Served acceptance comes from the engine's counters and should not move with the
mode (the same fp32 greedy decoding).
"""

from __future__ import annotations

import time
from pathlib import Path

from served_on_cpu import served_on_cpu
from side_by_side import parse_arguments, speculation_configs, table

from eagle_assets.bench.served import ServedRun, SweepSettings, mt_bench_prompts

MODES = {"eager": False, "compiled": True}


def measure(drafter: Path, ks: list[int], prompts, sweep: SweepSettings) -> dict[str, dict[str, ServedRun]]:
    """{mode: {config label: ServedRun}}."""
    runs: dict[str, dict[str, ServedRun]] = {}
    for mode, compiled in MODES.items():
        for label, spec in speculation_configs(drafter, ks).items():
            start = time.perf_counter()
            run = served_on_cpu(label, spec, prompts, sweep, compiled=compiled)
            runs.setdefault(mode, {})[label] = run
            level = run.level(sweep.concurrencies[0])
            print(
                f"  {mode}, {label}: {level.tokens_per_s:.1f} tok/s at concurrency {level.concurrency} "
                f"({time.perf_counter() - start:.0f} s with the server's start)",
                flush=True,
            )
    return runs


def main(argv: list[str] | None = None) -> int:
    a = parse_arguments(__doc__, argv, num_prompts=16, ks=[3])
    print(f"{a.num_prompts} MT-Bench first turns, {a.output_len} tokens each, greedy; drafter {a.drafter}", flush=True)
    runs = measure(a.drafter.resolve(), a.k, mt_bench_prompts(a.num_prompts), a.sweep)
    print(table(runs, a.sweep.concurrencies, "eager", "compiled"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
