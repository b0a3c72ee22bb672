"""What the engine-setting benchmarks share: their options, the served configurations, and a
table of two settings."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from eagle_assets.bench.served import ServedRun, SweepSettings
from eagle_assets.engines.vllm_launch import ngram_config, speculative_config

BASELINE = "no speculation"


def parse_arguments(doc: str, argv: list[str] | None, num_prompts: int, ks: list[int]) -> argparse.Namespace:
    """The options of a side-by-side script (`doc` is its docstring): the drafter folder (checked),
    prompts, output length, K (default `ks`) and concurrencies, gathered in `sweep`."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--drafter", type=Path, required=True, help="the drafter's vLLM export folder")
    ap.add_argument("--num-prompts", type=int, default=num_prompts)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("-k", type=int, action="append", help=f"draft tokens per step (repeat); default {' and '.join(map(str, ks))}")
    ap.add_argument("--concurrency", type=int, action="append", help="concurrency levels (repeat); default 1")
    a = ap.parse_args(argv)
    if not (a.drafter / "config.json").is_file():
        sys.exit(f"{a.drafter} has no config.json: pass the drafter's vLLM export folder (drafter-vllm/)")
    a.k = a.k or list(ks)
    a.sweep = SweepSettings(output_len=a.output_len, concurrencies=tuple(a.concurrency or [1]), progress=False)
    return a


def speculation_configs(drafter: Path, ks: list[int]) -> dict[str, dict | None]:
    """{label: speculative config}: no speculation, EAGLE-3 at each K, n-gram at the last K."""
    out: dict[str, dict | None] = {BASELINE: None}
    out.update({f"EAGLE-3 K={k}": speculative_config(drafter, k) for k in ks})
    out[f"n-gram K={ks[-1]}"] = ngram_config(ks[-1])
    return out


def table(runs: dict[str, dict[str, ServedRun]], concurrencies: tuple[int, ...], before: str, after: str) -> str:
    """Tokens/s of each configuration under two settings of the engine (`runs[setting][label]`),
    each speculative one with its speedup over the baseline of the same setting, and after / before."""
    a_runs, b_runs = runs[before], runs[after]
    lines = [f"{'':>24} {before:>18} {after:>18} {after + ' / ' + before:>16}"]
    for c in concurrencies:
        for label in a_runs:
            a, b = a_runs[label].level(c), b_runs[label].level(c)
            cells = [f"{x.tokens_per_s:.1f}" for x in (a, b)]
            if label != BASELINE:
                sa, sb = a.tokens_per_s / a_runs[BASELINE].level(c).tokens_per_s, b.tokens_per_s / b_runs[BASELINE].level(c).tokens_per_s
                cells = [f"{cells[0]} ({sa:.2f}x)", f"{cells[1]} ({sb:.2f}x)"]
            lines.append(f"{'c=' + str(c) + ' ' + label:>24} {cells[0]:>18} {cells[1]:>18} {b.tokens_per_s / a.tokens_per_s:>15.2f}x")
    for label in a_runs:
        if label.startswith("EAGLE-3"):
            al = [runs[n][label].level(concurrencies[0]).spec.al for n in (before, after)]
            lines.append(f"served AL, {label}: {before} {al[0]:.3f}, {after} {al[1]:.3f}")
    return "\n".join(lines)
