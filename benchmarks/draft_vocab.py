"""Served tokens/s of drafters that differ in their draft vocabulary, side by side in one run.

    python benchmarks/draft_vocab.py --drafter v32000/drafter-vllm --drafter v8000/drafter-vllm --drafter v4000/drafter-vllm
    python benchmarks/draft_vocab.py --drafter A --drafter B --num-prompts 80 --concurrency 1 --concurrency 8 -k 3

The draft vocabulary's head is most of a small drafter's weights (SmolLM2's 576-wide drafter:
8,192 ids are ~4.7M of ~9.8M parameters, 32,000 ids ~18.4M of ~23.5M), and every draft step
reads it. This starts the real vLLM CPU server without speculation, then with each drafter at
the same K, sends the same MT-Bench first turns (greedy, a fixed output length) and prints, per
drafter: tokens/s and speedup, the served AL from the engine's counters, and what one draft
step cost at concurrency 1: (seconds per round - seconds per plain step) / K, where a round
yields AL tokens on average.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from served_on_cpu import served_on_cpu

from eagle_assets.bench.served import ServedRun, SweepSettings, mt_bench_prompts
from eagle_assets.engines.vllm_launch import speculative_config

BASELINE = "no speculation"


def draft_vocab_size(drafter: Path) -> int:
    config = json.loads((drafter / "config.json").read_text())
    return int(config.get("draft_vocab_size") or config["vocab_size"])


def label_of(drafter: Path) -> str:
    return f"draft vocab {draft_vocab_size(drafter):,} ({drafter.parent.name or drafter.name})"


def measure(drafters: list[Path], k: int, prompts, sweep: SweepSettings) -> dict[str, ServedRun]:
    """{label: ServedRun}: the baseline first, then each drafter at K."""
    configs: dict[str, dict | None] = {BASELINE: None}
    configs.update({label_of(d): speculative_config(d, k) for d in drafters})
    runs: dict[str, ServedRun] = {}
    for label, spec in configs.items():
        runs[label] = served_on_cpu(label, spec, prompts, sweep)
        level = runs[label].level(sweep.concurrencies[0])
        print(f"  {label}: {level.tokens_per_s:.1f} tok/s at concurrency {level.concurrency}", flush=True)
    return runs


def draft_step_ms(run: ServedRun, baseline: ServedRun, k: int) -> float | None:
    """One draft step's cost at concurrency 1: a round's time less a plain step's, over K."""
    spec, plain = run.level(1), baseline.level(1)
    if spec is None or plain is None or spec.spec is None:
        return None
    round_s = spec.spec.al / spec.tokens_per_s
    return 1000 * (round_s - 1 / plain.tokens_per_s) / k


def table(runs: dict[str, ServedRun], k: int, concurrencies: tuple[int, ...]) -> str:
    base = runs[BASELINE]
    head = f"{'':>36} {'served AL':>10} {'p_k':>18} {'draft step':>11}" + "".join(f" {'c=' + str(c) + ' tok/s':>18}" for c in concurrencies)
    lines = [head]
    for label, run in runs.items():
        first = run.level(concurrencies[0])
        spec = first.spec if label != BASELINE else None
        al = f"{spec.al:.3f}" if spec else ""
        pk = " / ".join(f"{p:.2f}" for p in spec.per_position_acceptance) if spec else ""
        step = draft_step_ms(run, base, k) if label != BASELINE else None
        cells = []
        for c in concurrencies:
            tps = run.level(c).tokens_per_s
            cells.append(f"{tps:.1f}" if label == BASELINE else f"{tps:.1f} ({tps / base.level(c).tokens_per_s:.2f}x)")
        lines.append(f"{label:>36} {al:>10} {pk:>18} {'' if step is None else f'{step:.1f} ms':>11}" + "".join(f" {x:>18}" for x in cells))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", type=Path, action="append", required=True, help="a drafter's vLLM export folder (repeat)")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("-k", type=int, default=3, help="draft tokens per step, the same for every drafter")
    ap.add_argument("--concurrency", type=int, action="append", help="concurrency levels (repeat); default 1")
    a = ap.parse_args(argv)
    for d in a.drafter:
        if not (d / "config.json").is_file():
            sys.exit(f"{d} has no config.json: pass each drafter's vLLM export folder (drafter-vllm/)")
    concurrencies = tuple(a.concurrency or [1])
    if 1 not in concurrencies:
        sys.exit("--concurrency 1 is needed: a draft step's cost is read at concurrency 1")
    sweep = SweepSettings(output_len=a.output_len, concurrencies=concurrencies, progress=False)
    print(f"{a.num_prompts} MT-Bench first turns, {a.output_len} tokens each, greedy, K={a.k}", flush=True)
    runs = measure([d.resolve() for d in a.drafter], a.k, mt_bench_prompts(a.num_prompts), sweep)
    print(table(runs, a.k, concurrencies))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
