"""The table `data_scaling_gpu.sh` prints: MT-Bench AL against the share of the corpus trained on.

    python3 benchmarks/data_scaling_summary.py ROOT/sharegpt OUT

Reads each variant's `quality_figures.json` under ROOT (the first source's corpus folder), fits
AL = a + b * log2(share) by least squares over the seed-0, 8-epoch variants, and prints the slope per doubling of data,
the spread between the two seeds of the full run, and how many doublings of data the fit asks
for each AL in `TARGETS` (a straight line in log data: where the curve bends down, more).
Writes every figure to OUT/data_scaling.json.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

SCALING = {"f0.125": 0.125, "f0.25": 0.25, "f0.5": 0.5, "f1": 1.0}  # seed 0, 8 epochs
OTHERS = {"f1-seed1": 1.0}
TARGETS = (2.5, 2.8)


def fit_log2(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of AL = a + b * log2(share), least squares."""
    xs, ys = [math.log2(s) for s, _ in points], [al for _, al in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def doublings_for(al: float, a: float, b: float) -> float:
    """Doublings of the full corpus the line asks for `al` (inf when it does not rise)."""
    return (al - a) / b if b > 0 else math.inf


def main(root: Path, out: Path) -> dict:
    figures = {name: json.loads((root / name / "quality_figures.json").read_text()) for name in {**SCALING, **OTHERS}}
    for name, share in {**SCALING, **OTHERS}.items():
        train, offline = figures[name]["train"], figures[name]["offline"]
        p_k = " / ".join(f"{p:.2f}" for p in offline["per_position_acceptance"])
        print(
            f"{name:9s} share {share:5.3f}  samples {train.get('train_samples')}  steps {train.get('steps')}  "
            f"MT-Bench AL {offline['al']:.3f} ({p_k})  validation AL {train.get('val_al', float('nan')):.3f}"
        )
    a, b = fit_log2([(share, figures[name]["offline"]["al"]) for name, share in SCALING.items()])
    spread = abs(figures["f1"]["offline"]["al"] - figures["f1-seed1"]["offline"]["al"])
    needs = {al: doublings_for(al, a, b) for al in TARGETS}
    print(f"fit: AL = {a:.3f} + {b:.3f} * log2(share of the corpus); two seeds of the full run differ by {spread:.3f}")
    for al, d in needs.items():
        print(
            f"AL {al}: {d:.1f} doublings of the corpus by the fit ({2**d:.0f}x its samples)"
            if math.isfinite(d)
            else f"AL {al}: the fit does not rise"
        )
    summary = {"variants": figures, "fit": {"a": a, "b_per_doubling": b}, "seed_spread": spread, "doublings_for": needs}
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_scaling.json").write_text(json.dumps(summary, indent=1, default=str))
    return summary


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
