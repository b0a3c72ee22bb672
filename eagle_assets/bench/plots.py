"""PNG plots of a benchmark: acceptance per position, throughput and speedup against concurrency.

Drawn with matplotlib's Agg canvas directly (no pyplot, no global backend switch, safe in
worker processes without a display). Every file is written under a temporary name and renamed.

    from eagle_assets.bench.plots import plot_acceptance
    plot_acceptance({"offline": [0.8, 0.6, 0.4], "served": [0.78, 0.55, 0.41]}, "acc.png")
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from eagle_assets.bench.served import ServedRun
from eagle_assets.durable import no_room, replace_durably

# One colour per series name, so the same configuration looks the same in every plot.
COLOURS = {
    "offline": "#4c72b0",
    "served": "#dd8452",
    "baseline": "#555555",
    "baseline (end)": "#aaaaaa",
    "baseline (control)": "#aaaaaa",
    "eagle3": "#dd8452",
    "ngram": "#55a868",
}
_FALLBACK = ("#8172b3", "#c44e52", "#937860", "#da8bc3", "#8c8c8c")


def _colour(name: str, i: int) -> str:
    return COLOURS.get(name, _FALLBACK[i % len(_FALLBACK)])


def _save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}.png")
    FigureCanvasAgg(fig)
    try:
        fig.savefig(tmp, format="png", dpi=120, bbox_inches="tight")
        replace_durably(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half image
        raise no_room(exc, path, f"the plot {path.name}", f"{path} keeps what it held before") or exc from None
    return path


def plot_acceptance(series: Mapping[str, Sequence[float]], path: str | Path, title: str = "") -> Path:
    """Grouped bars of p_k per draft position k, one bar per series ("offline", "served", ...)."""
    series = {k: [float(x) for x in v] for k, v in series.items() if v}
    if not series:
        raise ValueError("no per-position acceptance to plot: every series is empty")
    k = max(len(v) for v in series.values())
    width = 0.8 / len(series)
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.add_subplot()
    for i, (name, values) in enumerate(series.items()):
        xs = [pos + 1 + (i - (len(series) - 1) / 2) * width for pos in range(len(values))]
        ys = [0.0 if math.isnan(v) else v for v in values]
        bars = ax.bar(xs, ys, width=width, label=name, color=_colour(name, i))
        ax.bar_label(bars, labels=[f"{v:.2f}" for v in values], fontsize=7, padding=1)
    ax.set_xticks(range(1, k + 1))
    ax.set_xlabel("draft position k")
    ax.set_ylabel("p_k = drafts with token k accepted / drafts")
    ax.set_ylim(0, 1.08)
    ax.set_title(title or "Per-position acceptance")
    ax.legend()
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def plot_throughput(runs: Sequence[ServedRun], path: str | Path, title: str = "") -> Path:
    """Output tokens/s against concurrency, one line per engine configuration."""
    if not runs:
        raise ValueError("no served runs to plot")
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.add_subplot()
    for i, run in enumerate(runs):
        levels = sorted(run.levels, key=lambda lv: lv.concurrency)
        ax.plot([lv.concurrency for lv in levels], [lv.tokens_per_s for lv in levels], marker="o", label=run.label, color=_colour(run.label, i))
    ax.set_xscale("log", base=2)
    concurrencies = sorted({lv.concurrency for r in runs for lv in r.levels})
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "Served throughput")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)


def plot_speedup(speedups: Mapping[str, Mapping[int, float]], path: str | Path, title: str = "") -> Path:
    """Speedup (tokens/s over the baseline's) against concurrency, one line per configuration."""
    speedups = {k: v for k, v in speedups.items() if v}
    if not speedups:
        raise ValueError("no speedups to plot: a baseline run and a speculative run are both needed")
    fig = Figure(figsize=(6.4, 3.8))
    ax = fig.add_subplot()
    for i, (label, by_c) in enumerate(speedups.items()):
        cs = sorted(by_c)
        ax.plot(cs, [by_c[c] for c in cs], marker="o", label=label, color=_colour(label, i))
    ax.axhline(1.0, color="#555555", linestyle="--", linewidth=1, label="baseline (1.0x)")
    concurrencies = sorted({c for v in speedups.values() for c in v})
    ax.set_xscale("log", base=2)
    ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel("speedup (x baseline tokens/s)")
    ax.set_title(title or "Speedup over no speculation")
    ax.legend()
    ax.grid(alpha=0.3)
    return _save(fig, path)
