"""One drafter training on a CPU twice, fp32 and bf16 autocast: wall time and held-out AL side by side.

    python benchmarks/cpu_training.py --config data/drafter_checkpoint/<run>/run.json
    python benchmarks/cpu_training.py --config RUN.json --epochs 4 --out /tmp/cpu-training

A CPU trains in fp32 unless the run asks for `precision: bf16`. This reruns a training's own
config (the `run.json` the drafter asset writes beside its checkpoints) once with
`precision=fp32` and once with `precision=bf16`, each from scratch into its own folder under --out,
nothing exported, and prints each run's precision, wall time, training tokens/s and validation
(held-out loss, per-position acceptance and AL replayed along the held-out answers), with the
bf16 / fp32 ratios. Only dependency-free modules of `eagle_assets` are imported.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from eagle_assets.drafter.run_config import TrainConfig  # noqa: E402
from eagle_assets.drafter.train import train  # noqa: E402
from eagle_assets.engines.cpu_isa import host_cpu  # noqa: E402


def run(cfg: TrainConfig) -> dict:
    start = time.perf_counter()
    summary = train(cfg)
    summary["wall_s"] = time.perf_counter() - start
    summary["tokens_per_s"] = summary["tokens_seen"] / summary["wall_s"]
    return summary


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True, help="a training's run.json (the drafter asset writes one)")
    ap.add_argument("--out", type=Path, default=None, help="folder for the two runs (default: a temporary one)")
    ap.add_argument("--epochs", type=int, default=None, help="train this many epochs instead of the config's")
    args = ap.parse_args(argv)
    if not args.config.is_file():
        ap.error(f"{args.config} does not exist: pass the run.json of a finished drafter_checkpoint run")
    if torch.cuda.is_available():
        ap.error("a GPU is visible and the trainer would take it: run with CUDA_VISIBLE_DEVICES= to measure the CPU")
    base = TrainConfig.load(args.config)
    overrides = dict(export_engines=(), resume=False, checkpoint_every=0, warm_start=None, tensorboard_dir=None)
    if args.epochs is not None:
        overrides["epochs"] = args.epochs
    out = args.out or Path(tempfile.mkdtemp(prefix="cpu-training-"))
    print(f"CPU: {host_cpu().describe()}; runs under {out}", flush=True)
    results = {}
    for name in ("fp32", "bf16"):
        cfg = base.replace(out_dir=str(out / name), precision=name, **overrides)
        results[name] = run(cfg)
        print(f"{name}: done in {results[name]['wall_s']:.0f} s", flush=True)

    fp32, bf16 = results["fp32"], results["bf16"]
    print(
        f"\n{fp32['steps']} steps, {fp32['train_samples']} samples, {fp32['train_tokens']:,} tokens x {fp32['epochs']} epochs, "
        f"{fp32['val_samples']} held out, K={fp32['ttt_steps']}"
    )
    print(f"{'':<14} {'precision':<14} {'wall s':>8} {'tokens/s':>9} {'val loss':>9} {'val AL':>7}  p_k")
    for name, s in results.items():
        accept = " / ".join(f"{p:.2f}" for p in (s["val_accept"] or []))
        val_loss = f"{s['val_loss']:.3f}" if s["val_loss"] is not None else "n/a"
        val_al = f"{s['val_al']:.2f}" if s["val_al"] is not None else "n/a"
        print(f"{name + ' asked':<14} {s['precision']:<14} {s['wall_s']:>8.0f} {s['tokens_per_s']:>9.0f} {val_loss:>9} {val_al:>7}  {accept}")
    print(f"bf16 / fp32: {fp32['wall_s'] / bf16['wall_s']:.2f}x faster", end="")
    if fp32["val_al"] and bf16["val_al"]:
        print(f", validation AL {bf16['val_al']:.3f} against {fp32['val_al']:.3f} ({bf16['val_al'] - fp32['val_al']:+.3f})")
    else:
        print()


if __name__ == "__main__":
    main()
