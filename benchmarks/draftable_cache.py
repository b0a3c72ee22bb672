"""A training step with the drafted-argmax mask recomputed, looked up, or not applied at all.

    python benchmarks/draftable_cache.py                    # SmolLM2-135M's drafter, 4 x 256 tokens
    python benchmarks/draftable_cache.py --epochs 12 --rounds 8

Which positions train depends on whether the target's argmax over its whole vocabulary is in
the draft vocabulary: the target's final states times the lm_head rows outside it (40,960 of
SmolLM2's 49,152). The trainer computes that once per sample and looks it up afterwards
(`drafter.draftable.DraftableCache`, through `TrainObjective`). This times one full optimiser
step (`train.optimizer_step`: forward, backward, AdamW) at SmolLM2's drafter sizes, three ways
on the same batch, interleaved round by round so that drift on a shared host hits all three:

- recomputed: the mask from the outside head every step (a sample's first epoch; every step
  before the cache);
- looked up: the same batch with its dataset positions, its mask from the cache;
- no mask: no outside head (`mask_undraftable=False`), the floor the cache can reach.

It prints the step times, the ratios, and what they make of a training of `--epochs` epochs
(the first recomputes, the rest look up). Inputs follow `train_throughput.make_problem`: the
final state points at the next token's lm_head row, so most targets are drafted, as in a real
corpus. CPU (fp32) by default where there is no GPU; bf16 autocast on CUDA, as the trainer.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from train_throughput import BETAS, CLIP, LR, Shape, Timer, drafter_config, initial_weights, make_problem  # noqa: E402

from eagle_assets.drafter.model import Eagle3Drafter  # noqa: E402
from eagle_assets.drafter.parallelize import TrainObjective  # noqa: E402
from eagle_assets.drafter.train import build_optimizer, optimizer_step  # noqa: E402

# SmolLM2-135M-Instruct's drafter shape: 8,192 draft ids, at 7 TTT steps (the preset trains 3).
SMOLLM2 = Shape("smollm2-135m", 576, 1536, 9, 3, 64, 49152, 8192, 7, 100000.0, 30)
MODES = ("recomputed", "looked up", "no mask")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=4, help="sequences per micro-batch (default 4)")
    ap.add_argument("--seq-len", type=int, default=256, help="tokens per sequence (default 256: the default preset's 1,024-token micro-batch)")
    ap.add_argument("--rounds", type=int, default=6, help="timed rounds, each one step of every mode (default 6)")
    ap.add_argument("--epochs", type=int, default=12, help="epochs of the projected training (default 12, the default preset's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    shape, use_bf16 = SMOLLM2, device.type == "cuda"
    torch.manual_seed(args.seed)

    p = make_problem(shape, args.seq_len, args.batch, args.seed, device)
    config = drafter_config(shape, args.seq_len + shape.ttt_steps + 1)
    with torch.device(device):
        drafter = Eagle3Drafter(config)
    drafter.load_state_dict(initial_weights(config, args.seed, device), strict=False)
    drafter.set_vocab_mapping(p.d2t, p.t2d)
    dtype = torch.bfloat16 if use_bf16 else torch.float32
    drafter.embed_tokens.to(dtype)
    drafter.load_target_embedding(p.embedding.to(dtype))
    target_head, outside_head = p.lm_head[p.t2d].to(dtype), p.lm_head[~p.t2d].to(dtype)
    objective = TrainObjective(drafter, shape.ttt_steps)
    optimizer = build_optimizer(objective, LR, BETAS, 0.0, fused=use_bf16)
    batch = {
        "aux": p.aux.to(dtype),
        "final": p.final.to(dtype),
        "input_ids": p.input_ids,
        "loss_mask": p.loss_mask,
        "lengths": torch.full((args.batch,), args.seq_len, device=device),
    }
    with_positions = {**batch, "positions": torch.arange(args.batch, device=device)}
    runs = {
        "recomputed": (batch, outside_head),
        "looked up": (with_positions, outside_head),
        "no mask": (batch, None),
    }

    def step(mode: str):
        data, outside = runs[mode]
        return optimizer_step(
            objective,
            optimizer,
            None,
            [data],
            target_head,
            outside,
            ttt_steps=shape.ttt_steps,
            world_size=1,
            grad_clip=CLIP,
            use_bf16=use_bf16,
            device=device,
        )

    trained = {}
    for mode in MODES:  # warm-up; the first "looked up" step fills the cache
        trained[mode] = float(step(mode)[1])
    assert len(objective.draftable) == args.batch and trained["looked up"] == trained["recomputed"]
    timers = {mode: Timer(device) for mode in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            timers[mode].run(lambda mode=mode: step(mode))
    ms = {mode: timers[mode].mean_ms for mode in MODES}

    tokens = args.batch * args.seq_len
    print(
        f"{shape.name} drafter, {device.type} ({'bf16 autocast' if use_bf16 else 'fp32'}, {torch.get_num_threads()} threads), "
        f"{args.batch} x {args.seq_len} tokens, {shape.ttt_steps} TTT steps, {args.rounds} rounds"
    )
    print(f"positions that train: {trained['recomputed']:.0f} of {tokens} with the mask, {trained['no mask']:.0f} without")
    print(f"{'step':<12} {'ms':>9} {'tokens/s':>10} {'vs recomputed':>14}")
    for mode in MODES:
        print(f"{mode:<12} {ms[mode]:>9.1f} {tokens / ms[mode] * 1e3:>10.0f} {ms['recomputed'] / ms[mode]:>13.2f}x")
    share = (ms["recomputed"] - ms["looked up"]) / ms["recomputed"]
    E = args.epochs
    projected = (ms["recomputed"] + (E - 1) * ms["looked up"]) / (E * ms["recomputed"])
    print(
        f"the mask's matmul: {share:.0%} of a recomputed step; a {E}-epoch training takes "
        f"{projected:.2f} of its time without the cache ({1 / projected:.2f}x faster)"
    )


if __name__ == "__main__":
    main()
