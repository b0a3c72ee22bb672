"""What the engine-setting benchmarks share: the served configurations, and a table of two settings."""

from __future__ import annotations

from pathlib import Path

from eagle_assets.bench.served import ServedRun
from eagle_assets.engines.vllm_launch import ngram_config, speculative_config

BASELINE = "no speculation"


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
