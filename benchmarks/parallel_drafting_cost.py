"""What a drafting round costs in vLLM on this CPU, drafted step by step (EAGLE-3) or in one forward (parallel drafting).

    python benchmarks/parallel_drafting_cost.py --drafter data/smollm2-135m-instruct/drafter/drafter-vllm
    python benchmarks/parallel_drafting_cost.py --drafter DIR -k 3 -k 4 --compiled --num-prompts 16
    python benchmarks/parallel_drafting_cost.py --drafter CHAIN_DIR --parallel-drafter PARALLEL_DIR -k 3 -k 4

EAGLE-3 drafts K tokens in K drafter forwards: one over the tokens verification accepted, then
K-1 of one token each, feeding back its own hidden state. vLLM also serves *parallel drafting*
(`"parallel_drafting": true`, P-EAGLE): K-1 mask slots (a fixed token, `ptd_token_id`, and a
learned state, `mask_hidden`) ride along in the first forward, so a round has one drafter
forward whatever K. On a small target each forward carries a fixed cost (scheduling, attention
metadata, a kernel launch per operator), so the saving could outweigh what the mask slots lose
in acceptance: a mask slot does not see the tokens drafted before it.

This measures the cost side, on the real vLLM CPU server and the same MT-Bench first turns
(greedy, a fixed output length): no speculation, the drafter at each K as trained, and a copy of
it made parallel (`ptd_token_id` 0, `mask_hidden` zeros: its mask slots are untrained, so its AL
is not what a drafter trained for parallel drafting reaches; its round's cost is). A round's
cost at concurrency 1 is served AL / tokens/s, printed in steps of the target without
speculation. From them: the AL a parallel drafter needs to match the step-by-step drafter's
speedup (break-even) and to reach 1.6x.

With --parallel-drafter, a drafter trained for parallel drafting (`ptd_token_id` in its config;
best trained on the step-by-step drafter's corpus) is served in the copy's place: then the
parallel rows' AL and speedup are its own, beside the step-by-step drafter's in the same run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from served_on_cpu import served_on_cpu

from eagle_assets.bench.served import ServedRun, SweepSettings, mt_bench_prompts
from eagle_assets.drafter.config import folder_drafts_in_parallel
from eagle_assets.engines.vllm_launch import speculative_config

BASELINE = "no speculation"
MASK_TOKEN_ID = 0


def parallel_copy(drafter: Path, folder: Path) -> Path:
    """The drafter with untrained mask slots added, exported as vLLM serves a parallel drafter."""
    import torch

    from eagle_assets.drafter.export import export_vllm, load_drafter
    from eagle_assets.drafter.model import Eagle3Drafter

    model, config = load_drafter(drafter)
    config = replace(config, ptd_token_id=MASK_TOKEN_ID)
    parallel = Eagle3Drafter(config)
    parallel.load_state_dict(model.state_dict(), strict=False)  # every weight but mask_hidden
    with torch.no_grad():
        parallel.mask_hidden.zero_()
    return export_vllm(parallel, config, folder / "parallel")


def round_steps(run: ServedRun, baseline: ServedRun) -> float | None:
    """A round's time at concurrency 1, in steps of the target without speculation."""
    spec, plain = run.level(1), baseline.level(1)
    if spec is None or spec.spec is None:
        return None
    return (spec.spec.al / spec.tokens_per_s) * plain.tokens_per_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--drafter", type=Path, required=True, help="a drafter's vLLM export folder")
    ap.add_argument(
        "--parallel-drafter", type=Path, help="a drafter trained for parallel drafting (vLLM export) to serve instead of an untrained copy"
    )
    ap.add_argument("-k", type=int, action="append", help="draft tokens per round (repeat); default 3")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--compiled", action="store_true", help="serve compiled (torch.compile), as a deployment does")
    a = ap.parse_args(argv)
    if not (a.drafter / "config.json").is_file() or not (a.drafter / "model.safetensors").is_file():
        sys.exit(f"{a.drafter} lacks config.json or model.safetensors: pass a drafter's vLLM export folder (drafter-vllm/)")
    if a.parallel_drafter is not None:
        if not folder_drafts_in_parallel(a.parallel_drafter):
            sys.exit(
                f"{a.parallel_drafter} is not a parallel drafter's vLLM export (no ptd_token_id in config.json): "
                "train one with ptd_token_id set (TrainConfig.ptd_token_id, quality_drafter.py --ptd-token-id)"
            )
    ks = tuple(a.k or [3])
    sweep = SweepSettings(output_len=a.output_len, concurrencies=(1,), progress=False)
    prompts = mt_bench_prompts(a.num_prompts)
    print(
        f"{a.num_prompts} MT-Bench first turns, {a.output_len} tokens each, greedy, concurrency 1, {'compiled' if a.compiled else 'eager'}",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        if a.parallel_drafter is not None:
            parallel = a.parallel_drafter.resolve()
            print(f"parallel: {parallel} (trained for parallel drafting)", flush=True)
        else:
            parallel = parallel_copy(a.drafter.resolve(), Path(tmp))
            print("parallel: a copy of the drafter with untrained mask slots (its AL is not a trained one's)", flush=True)
        configs: dict[str, dict | None] = {BASELINE: None}
        for k in ks:
            configs[f"step by step, K={k}"] = speculative_config(a.drafter.resolve(), k)
            configs[f"parallel, K={k}"] = speculative_config(parallel, k)  # parallel_drafting from its ptd_token_id
        runs: dict[str, ServedRun] = {}
        for label, spec in configs.items():
            runs[label] = served_on_cpu(label, spec, prompts, sweep, compiled=a.compiled)
            print(f"  {label}: {runs[label].level(1).tokens_per_s:.1f} tok/s", flush=True)

    base = runs[BASELINE]
    print(f"\n{'':<22} {'served AL':>9} {'tok/s':>7} {'speedup':>8} {'round (target steps)':>21}")
    print(f"{BASELINE:<22} {'':>9} {base.level(1).tokens_per_s:>7.1f} {'':>8} {1.0:>21.2f}")
    rounds = {}
    for label, run in runs.items():
        if label == BASELINE:
            continue
        level = run.level(1)
        rounds[label] = round_steps(run, base)
        print(
            f"{label:<22} {level.spec.al:>9.2f} {level.tokens_per_s:>7.1f} "
            f"{level.tokens_per_s / base.level(1).tokens_per_s:>7.2f}x {rounds[label]:>21.2f}"
        )
    for k in ks:
        step, par = rounds[f"step by step, K={k}"], rounds[f"parallel, K={k}"]
        print(
            f"K={k}: a parallel round costs {par / step:.2f} of a step-by-step one; a parallel drafter matches a "
            f"step-by-step one of AL A from AL {par / step:.2f} x A, and reaches 1.6x from AL {1.6 * par:.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
