"""The fused TTT loss (`drafter/ttt.py: ttt_loss`) against its dense formulation: time per
forward + backward, peak memory, and whether the two agree on the loss and the gradient.

    python3 benchmarks/ttt_loss.py --seq 4096 --steps 7     # GPU, a Llama-3.1-8B-shaped drafter
    python3 benchmarks/ttt_loss.py --smoke                  # CPU, tiny (seconds)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from eagle_assets.drafter.config import DrafterConfig  # noqa: E402
from eagle_assets.drafter.model import Eagle3Drafter  # noqa: E402
from eagle_assets.drafter.ttt import ttt_loss, ttt_loss_dense  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    """Time ttt_loss (forward + backward) against the dense baseline and check they agree.

    GPU, the SpecForge comparison shape (Llama-3.1-8B drafter):
        python3 benchmarks/ttt_loss.py --seq 4096 --steps 7
    CPU, tiny (seconds):
        python3 benchmarks/ttt_loss.py --smoke
    """
    ap = argparse.ArgumentParser(description=main.__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (a few seconds)")
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--intermediate", type=int, default=14336)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--draft-vocab", type=int, default=32000)
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--layers", type=int, default=1, help="drafter decoder layers (more than one: vLLM's later layers)")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--mask-undraftable", action="store_true", help="pass the outside-draft lm_head rows")
    ap.add_argument("--skip-dense", action="store_true", help="do not run the dense baseline (it needs O(T^2 K) memory)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.hidden, args.intermediate, args.heads, args.kv_heads = 64, 128, 4, 2
        args.vocab, args.draft_vocab, args.seq, args.steps, args.iters = 512, 128, 96, 3, 2
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    cfg = DrafterConfig(
        hidden_size=args.hidden,
        intermediate_size=args.intermediate,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.hidden // args.heads,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        rope_scaling=None,
        max_position_embeddings=max(8192, args.seq + args.steps),
        vocab_size=args.vocab,
        draft_vocab_size=args.draft_vocab,
        target_hidden_size=args.hidden,
        aux_layer_ids=(2, 16, 29),
        num_hidden_layers=args.layers,
    )
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg).to(device)
    with torch.no_grad():
        model.embed_tokens.weight.normal_(std=0.02)
    amp = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    B, T = args.batch, args.seq
    batch = dict(
        aux=torch.randn(B, T, cfg.fc_in_features, device=device, dtype=dt),
        final=torch.randn(B, T, cfg.target_hidden_size, device=device, dtype=dt),
        input_ids=torch.randint(0, cfg.vocab_size, (B, T), device=device),
        loss_mask=torch.ones(B, T, device=device),
        lengths=torch.full((B,), T, device=device),
    )
    lm_head = torch.randn(cfg.vocab_size, cfg.target_hidden_size, device=device, dtype=dt) * 0.02
    head, outside = lm_head[: cfg.draft_vocab_size], (lm_head[cfg.draft_vocab_size :] if args.mask_undraftable else None)

    def run(fn):
        model.zero_grad(set_to_none=True)
        with amp:
            out = fn(model, batch, head, args.steps, outside_head=outside)
        (out.loss_sum / out.num_tokens.clamp(min=1)).backward()
        return out

    def timed(fn, name):
        run(fn)  # warm-up (kernels, allocator)
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        for _ in range(args.iters):
            out = run(fn)
        if device.type == "cuda":
            torch.cuda.synchronize()
        sec = (time.perf_counter() - start) / args.iters
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        grad = model.fc.weight.grad.float().clone()
        print(
            f"{name:>6}: {sec * 1e3:9.1f} ms/iter  {B * T / sec:10.0f} tokens/s  peak {peak:6.2f} GiB  "
            f"loss {out.loss.item():.5f}  acc {[round(a, 3) for a in out.step_accuracy.tolist()]}"
        )
        return sec, out, grad

    print(
        f"device {device}, layers {cfg.num_hidden_layers}, hidden {cfg.hidden_size}, T {T}, batch {B}, steps {args.steps}, "
        f"draft vocab {cfg.draft_vocab_size}, vocab {cfg.vocab_size}"
    )
    fast_s, fast, fast_grad = timed(ttt_loss, "fused")
    if args.skip_dense:
        return
    dense_s, dense, dense_grad = timed(ttt_loss_dense, "dense")
    rel = ((fast_grad - dense_grad).norm() / dense_grad.norm().clamp(min=1e-12)).item()
    diff = (fast.loss - dense.loss).abs().item()
    print(f"speedup {dense_s / fast_s:.2f}x; |loss diff| {diff:.2e}; fc grad relative diff {rel:.2e}")
    if diff > 2e-2 * max(1.0, abs(dense.loss.item())) or rel > 5e-2:
        raise SystemExit("fused and dense TTT losses disagree: do not trust the fused path on this device")


if __name__ == "__main__":
    main()
