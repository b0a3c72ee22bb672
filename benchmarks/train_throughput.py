"""Drafter training throughput: our EAGLE-3 step next to SpecForge 0.2.0's, same inputs, same weights.

    python benchmarks/train_throughput.py                      # GPU: Llama-3.1-8B-shaped drafter, T=2048, 4096
    python benchmarks/train_throughput.py --smoke              # CPU: tiny sizes (checks the script end to end)
    python benchmarks/train_throughput.py --nproc 1 2 --parallelism ddp fsdp2   # + scaling through torchrun

For each sequence length it times, on one device, one full optimiser step (forward, backward,
AdamW) of:
- ours: `TrainObjective` (the drafter + `ttt_loss`) through `train.optimizer_step`, exactly as
  the trainer runs it (fp32 master weights, bf16 autocast, fused AdamW on CUDA);
- SpecForge 0.2.0: `OnlineEagle3Model` over its `LlamaForCausalLMEagle3` with
  attention_backend="flex_attention", bf16 weights under its `BF16Optimizer`, fed the target's
  final hidden state and lm_head weight through `target_hidden_for_compact` /
  `target_head_weight` (its compact teacher), with its own input shift (`TargetHead.preprocess`).
Both start from the same weights (rounded to bf16) and see the same batch: the first-step
losses must agree (they are reported per position, SpecForge's normalisation: the 0.8^i
weighted sum of per-step cross-entropy sums over B*T). It prints tokens/s, step time, peak
memory, loss, the ours/SpecForge ratio, and MFU against a bf16 matmul peak measured here.

`--nproc 1 2` reruns our step under `torchrun` with 1 and 2 processes (DDP and/or FSDP2, one
micro-batch of T tokens per process) and prints global tokens/s and scaling efficiency
(tokens/s at N / (N x tokens/s at 1)).

SpecForge is imported lazily: from the environment, else from the wheel in `.whl/` (extracted to
a temporary folder); without it (or on CPU, where its Triton loss cannot run) our side still
runs and the script says why SpecForge was skipped. Only dependency-free modules of
`eagle_assets` are imported (no Dagster, no serving engine). Timing: CUDA events around each
step after warm-up steps (which also absorb SpecForge's torch.compile); wall clock on CPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from profiling import print_profile  # noqa: E402  (benchmarks/profiling.py, beside this script)
from specforge_glue import SPECFORGE_VERSION, STEP_DECAY, import_specforge, specforge_config, specforge_state  # noqa: E402

from eagle_assets.drafter.config import DrafterConfig  # noqa: E402
from eagle_assets.drafter.model import Eagle3Drafter  # noqa: E402
from eagle_assets.drafter.parallelize import TrainObjective, parallelize  # noqa: E402
from eagle_assets.drafter.train import build_optimizer, optimizer_step, setup_distributed  # noqa: E402

LR, CLIP, BETAS = 1e-4, 0.5, (0.9, 0.999)  # SpecForge's AdamW defaults, used on both sides


@dataclass(frozen=True)
class Shape:
    """The drafter and target sizes of one benchmark."""

    name: str
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    draft_vocab: int
    ttt_steps: int
    rope_theta: float
    target_layers: int


LLAMA_8B = Shape("llama-3.1-8b", 4096, 14336, 32, 8, 128, 128256, 32000, 7, 500000.0, 32)
# A drafter of Kimi-K2.5 as `DrafterConfig.from_target_config` builds it: the target's width and
# MLP, its 64 heads (MLA has no key-value groups: 64 of them too) of 7168 / 64 dims, plain RoPE at
# its theta, the preset's 32,000 draft ids and 7 TTT steps; its 163,840-id head as the teacher.
KIMI_K25 = Shape("kimi-k2.5", 7168, 18432, 64, 64, 112, 163840, 32000, 7, 50000.0, 61)
SHAPES = {"llama-3.1-8b": LLAMA_8B, "kimi-k2.5": KIMI_K25}
SMOKE = Shape("smoke", 64, 128, 4, 2, 16, 512, 128, 3, 10000.0, 8)


def drafter_config(shape: Shape, max_len: int) -> DrafterConfig:
    L = shape.target_layers
    return DrafterConfig(
        hidden_size=shape.hidden,
        intermediate_size=shape.intermediate,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        head_dim=shape.head_dim,
        rms_norm_eps=1e-5,
        rope_theta=shape.rope_theta,
        rope_scaling=None,
        max_position_embeddings=max(8192, max_len),
        vocab_size=shape.vocab,
        draft_vocab_size=shape.draft_vocab,
        target_hidden_size=shape.hidden,
        aux_layer_ids=(2, L // 2, L - 3),
        target_num_layers=L,
    )


# ----------------------------------------------------------------------------- inputs and weights


@dataclass
class Problem:
    """One synthetic batch and the target's tensors, identical for both implementations."""

    aux: torch.Tensor  # (B, T, 3H) bf16: concatenated aux states
    final: torch.Tensor  # (B, T, H) bf16: the target's normed final state
    input_ids: torch.Tensor  # (B, T) long, tokens of the draft vocabulary
    loss_mask: torch.Tensor  # (B, T) float, all ones (every position is an assistant token)
    lm_head: torch.Tensor  # (V, H) bf16
    embedding: torch.Tensor  # (V, H) bf16
    d2t: torch.Tensor  # (N,) long
    t2d: torch.Tensor  # (V,) bool


def make_problem(shape: Shape, seq_len: int, batch: int, seed: int, device: torch.device, batch_seed: int | None = None) -> Problem:
    """Deterministic: each implementation regenerates its own identical copy (so that the peak
    memory of one never includes the other's tensors). `seed` fixes the target (vocabulary,
    lm_head, embedding), `batch_seed` (default `seed`) the batch.

    The final state points at lm_head's row of the next token plus noise, so the target's
    distribution is peaked (mostly on drafted tokens) with a soft tail, as a trained target's is.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    gb = torch.Generator(device=device).manual_seed(seed if batch_seed is None else batch_seed)
    V, H, N = shape.vocab, shape.hidden, shape.draft_vocab

    def randn(*size, gen=g):
        return torch.randn(*size, generator=gen, device=device)

    draft_ids = torch.randperm(V, generator=g, device=device)[:N].sort().values  # (N,)
    t2d = torch.zeros(V, dtype=torch.bool, device=device)
    t2d[draft_ids] = True
    d2t = draft_ids - torch.arange(N, device=device)
    lm_head = (randn(V, H) / math.sqrt(H)).to(torch.bfloat16)  # rows of norm ~1
    embedding = (randn(V, H) * 0.02).to(torch.bfloat16)
    input_ids = draft_ids[torch.randint(0, N, (batch, seq_len), generator=gb, device=device)]  # (B, T)
    nxt = torch.cat([input_ids[:, 1:], input_ids[:, -1:]], dim=1)
    rows = lm_head[nxt].float()  # (B, T, H)
    final = (randn(batch, seq_len, H, gen=gb) + 6.0 * rows / rows.norm(dim=-1, keepdim=True)).to(torch.bfloat16)
    aux = randn(batch, seq_len, 3 * H, gen=gb).to(torch.bfloat16)
    loss_mask = torch.ones(batch, seq_len, device=device)
    return Problem(aux, final, input_ids, loss_mask, lm_head, embedding, d2t, t2d)


def initial_weights(config: DrafterConfig, seed: int, device: torch.device) -> dict[str, torch.Tensor]:
    """Trainable drafter weights (the model's own initialisation, seeded), rounded to bf16 so that
    both sides start from the same numbers. Built without the embedding: it is the target's."""
    with torch.device("meta"):
        model = Eagle3Drafter(config)
    model.to_empty(device=device)
    torch.manual_seed(seed)
    model.reset_parameters()
    return {k: v.to(torch.bfloat16).float() for k, v in model.trainable_state_dict().items() if v.is_floating_point()}


# ----------------------------------------------------------------------------- timing helpers


class Timer:
    """CUDA events on GPU, wall clock on CPU; `elapsed_ms` per recorded step."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.times: list[float] = []

    def run(self, fn):
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = fn()
            end.record()
            torch.cuda.synchronize()
            self.times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            out = fn()
            self.times.append((time.perf_counter() - t0) * 1e3)
        return out

    @property
    def mean_ms(self) -> float:
        return sum(self.times) / max(1, len(self.times))


def reset_memory(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def measure_matmul_peak(device: torch.device, smoke: bool) -> tuple[float, str]:
    """Dense matmul FLOP/s measured here: bf16 8192^3 on GPU (fp32 on CPU). Returns (flops, what)."""
    if device.type == "cuda":
        n, dtype, iters, what = 8192, torch.bfloat16, 30, "bf16 8192^3 matmul"
    else:
        n, dtype, iters, what = (256 if smoke else 2048), torch.float32, 5, f"fp32 {256 if smoke else 2048}^3 matmul (CPU)"
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    timer = Timer(device)
    for _ in range(iters):
        timer.run(lambda: a @ b)
    return 2 * n**3 / (timer.mean_ms / 1e3), what


def step_flops(shape: Shape, seq_len: int, batch: int) -> float:
    """Model FLOPs of one training step: 3x the forward matmuls that train (forward + backward),
    1x the frozen teacher head (full-vocabulary logits, forward only). Both sides do this work."""
    H, D, nh, nkv, inter, N, V, K = (
        shape.hidden,
        shape.head_dim,
        shape.heads,
        shape.kv_heads,
        shape.intermediate,
        shape.draft_vocab,
        shape.vocab,
        shape.ttt_steps,
    )
    tokens = batch * seq_len
    per_token_step = (
        2 * (2 * H) * (nh * D + 2 * nkv * D)  # q, k, v from [embedding ; hidden]
        + 2 * nh * D * H  # o_proj
        + 3 * 2 * H * inter  # gate, up, down
        + 2 * H * N  # lm_head over the draft vocabulary
        + 2 * 2 * nh * D * (seq_len / 2)  # causal scores and values (mean key count T/2)
    )
    trained = tokens * (2 * 3 * H * H + K * per_token_step)  # fc once, then K unrolled steps
    teacher = tokens * 2 * H * V
    return 3 * trained + teacher


# ----------------------------------------------------------------------------- ours


def run_ours(shape: Shape, seq_len: int, batch: int, steps: int, warmup: int, device: torch.device, seed: int, profile: int = 0) -> dict:
    """Time our optimiser step on one device; returns tokens/s, step ms, peak GiB and losses.
    profile > 0: then profile one more step and print its `profile` costliest operators."""
    reset_memory(device)
    config = drafter_config(shape, seq_len + shape.ttt_steps + 1)
    p = make_problem(shape, seq_len, batch, seed, device)
    use_bf16 = device.type == "cuda"
    with torch.device(device):
        drafter = Eagle3Drafter(config)
    drafter.load_state_dict(initial_weights(config, seed, device), strict=False)
    drafter.set_vocab_mapping(p.d2t, p.t2d)
    drafter.embed_tokens.to(p.embedding.dtype if use_bf16 else torch.float32)
    drafter.load_target_embedding(p.embedding.to(drafter.embed_tokens.weight.dtype))
    head_dtype = torch.bfloat16 if use_bf16 else torch.float32
    target_head = p.lm_head[p.t2d].to(head_dtype)  # (N, H), draft ids ascend with target ids
    outside_head = p.lm_head[~p.t2d].to(head_dtype)  # (V-N, H)
    del p.lm_head
    objective = TrainObjective(drafter, shape.ttt_steps)
    optimizer = build_optimizer(objective, LR, BETAS, 0.0, fused=device.type == "cuda")
    batch_dict = {
        "aux": p.aux,
        "final": p.final,
        "input_ids": p.input_ids,
        "loss_mask": p.loss_mask,
        "lengths": torch.full((batch,), seq_len, device=device),
    }
    if not use_bf16:
        batch_dict["aux"], batch_dict["final"] = p.aux.float(), p.final.float()
        target_head, outside_head = target_head.float(), outside_head.float()

    def step():
        return optimizer_step(
            objective,
            optimizer,
            None,
            [batch_dict],
            target_head,
            outside_head,
            ttt_steps=shape.ttt_steps,
            world_size=1,
            grad_clip=CLIP,
            use_bf16=use_bf16,
            device=device,
        )

    losses = []
    for _ in range(warmup):
        losses.append(float(step()[0]) / (batch * seq_len))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer = Timer(device)
    for _ in range(steps):
        totals = timer.run(step)
        losses.append(float(totals[0]) / (batch * seq_len))
    if profile:
        print_profile(step, device, profile)
    result = {
        "impl": "ours",
        "seq_len": seq_len,
        "step_ms": timer.mean_ms,
        "tokens_per_s": batch * seq_len / (timer.mean_ms / 1e3),
        "peak_gib": peak_gib(device),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
    }
    return result  # the model, optimiser and inputs go with this frame


# ----------------------------------------------------------------------------- SpecForge


def build_specforge(sf: dict, shape: Shape, seq_len: int, device: torch.device, seed: int, p: Problem):
    config = drafter_config(shape, seq_len + shape.ttt_steps + 1)
    draft = sf["LlamaForCausalLMEagle3"](specforge_config(config), attention_backend="flex_attention")
    state = specforge_state(initial_weights(config, seed, device))
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or set(missing) - {"embed_tokens.weight", "d2t", "t2d"}:
        raise RuntimeError(f"weight names do not line up with SpecForge's: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        draft.embed_tokens.weight.copy_(p.embedding.float())
        draft.d2t.copy_(p.d2t)
        draft.t2d.copy_(p.t2d)
    draft.embed_tokens.weight.requires_grad_(False)  # frozen, as SpecForge's trainer loads it
    draft = draft.to(device=device, dtype=torch.bfloat16)  # its trainer keeps bf16 weights (d2t/t2d keep theirs) ...
    model = sf["OnlineEagle3Model"](draft, length=shape.ttt_steps, attention_backend="flex_attention")
    optimizer = sf["BF16Optimizer"](
        draft, lr=LR, max_grad_norm=CLIP, total_steps=10_000, warmup_ratio=0.0, lr_scheduler="constant"
    )  # ... and fp32 masters in its optimiser
    return model, optimizer


def run_specforge(sf: dict, shape: Shape, seq_len: int, batch: int, steps: int, warmup: int, device: torch.device, seed: int) -> dict:
    reset_memory(device)
    p = make_problem(shape, seq_len, batch, seed, device)
    model, optimizer = build_specforge(sf, shape, seq_len, device, seed, p)
    pad = sf["padding"]
    # SpecForge's TargetHead.preprocess: tokens and target states shift left by one; aux does not.
    input_ids = pad(p.input_ids, left=False)
    final = pad(p.final, left=False)
    loss_mask = p.loss_mask[..., None]
    attention_mask = torch.ones_like(p.input_ids)

    def step():
        plosses, *_ = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            target=None,
            hidden_states=p.aux,
            target_hidden_for_compact=final,
            target_head_weight=p.lm_head,
        )
        loss = sum(STEP_DECAY**i * pl for i, pl in enumerate(plosses))
        loss.backward()
        optimizer.step()
        return loss.detach()

    losses = []
    for _ in range(warmup):
        losses.append(float(step()))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer = Timer(device)
    for _ in range(steps):
        losses.append(float(timer.run(step)))
    result = {
        "impl": "specforge",
        "seq_len": seq_len,
        "step_ms": timer.mean_ms,
        "tokens_per_s": batch * seq_len / (timer.mean_ms / 1e3),
        "peak_gib": peak_gib(device),
        "loss_first": losses[0],
        "loss_last": losses[-1],
        "losses": losses,
    }
    return result


# ----------------------------------------------------------------------------- scaling (torchrun)


def scaling_worker(args) -> None:
    """One rank of `torchrun ... --worker`: our step under DDP or FSDP2, one micro-batch per rank."""
    import torch.distributed as dist

    env = setup_distributed()
    shape = SMOKE if args.smoke else SHAPES[args.shape]
    T, batch = args.seq_lens[0], args.batch
    device = env.device
    use_bf16 = device.type == "cuda"
    config = drafter_config(shape, T + shape.ttt_steps + 1)
    # the same target and vocabulary on every rank, a different batch per rank
    shared = make_problem(shape, T, batch, args.seed, device, batch_seed=args.seed + 1 + env.rank)
    with torch.device(device):
        drafter = Eagle3Drafter(config)
    drafter.load_state_dict(initial_weights(config, args.seed, device), strict=False)
    drafter.set_vocab_mapping(shared.d2t, shared.t2d)
    drafter.embed_tokens.to(torch.bfloat16 if use_bf16 else torch.float32)
    drafter.load_target_embedding(shared.embedding.to(drafter.embed_tokens.weight.dtype))
    head_dtype = torch.bfloat16 if use_bf16 else torch.float32
    target_head = shared.lm_head[shared.t2d].to(head_dtype)
    outside_head = shared.lm_head[~shared.t2d].to(head_dtype)
    objective = TrainObjective(drafter, shape.ttt_steps)
    model = parallelize(objective, args.parallelism[0], device, ignored_params={drafter.embed_tokens.weight})
    fused = use_bf16 and args.parallelism[0] == "ddp"
    optimizer = build_optimizer(model, LR, BETAS, 0.0, fused=fused)
    batch_dict = {
        "aux": shared.aux if use_bf16 else shared.aux.float(),
        "final": shared.final if use_bf16 else shared.final.float(),
        "input_ids": shared.input_ids,
        "loss_mask": shared.loss_mask,
        "lengths": torch.full((batch,), T, device=device),
    }
    del shared

    def step():
        return optimizer_step(
            model,
            optimizer,
            None,
            [batch_dict],
            target_head,
            outside_head,
            ttt_steps=shape.ttt_steps,
            world_size=env.world_size,
            grad_clip=CLIP,
            use_bf16=use_bf16,
            device=device,
        )

    for _ in range(args.warmup):
        step()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    timer = Timer(device)
    for _ in range(args.steps):
        timer.run(step)
    stats = torch.tensor([timer.mean_ms, peak_gib(device) or 0.0], device=device)
    if dist.is_initialized():
        dist.all_reduce(stats, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
    if env.rank == 0:
        step_ms = float(stats[0])
        out = {
            "parallelism": args.parallelism[0],
            "nproc": env.world_size,
            "seq_len": T,
            "step_ms": step_ms,
            "tokens_per_s": env.world_size * batch * T / (step_ms / 1e3),
            "peak_gib": float(stats[1]) if device.type == "cuda" else None,
        }
        Path(args.worker_out).write_text(json.dumps(out))
    if env.owns_group:
        dist.destroy_process_group()


def run_scaling(args, device: torch.device) -> list[dict]:
    results = []
    available = torch.cuda.device_count() if device.type == "cuda" else os.cpu_count() or 1
    for mode in args.parallelism:
        for n in args.nproc:
            if device.type == "cuda" and n > available:
                print(f"  skip {mode} x{n}: only {available} GPU(s) visible", flush=True)
                continue
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "result.json"
                cmd = [
                    sys.executable,
                    "-m",
                    "torch.distributed.run",
                    "--standalone",
                    f"--nproc_per_node={n}",
                    str(Path(__file__).resolve()),
                    "--worker",
                    "--worker-out",
                    str(out),
                    "--parallelism",
                    mode,
                    "--seq-lens",
                    str(args.seq_lens[0]),
                    "--batch",
                    str(args.batch),
                    "--steps",
                    str(args.steps),
                    "--warmup",
                    str(args.warmup),
                    "--seed",
                    str(args.seed),
                ]
                if args.smoke:
                    cmd.append("--smoke")
                print(f"  torchrun: {mode} x{n} ...", flush=True)
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0 or not out.is_file():
                    print(f"  {mode} x{n} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", flush=True)
                    continue
                results.append(json.loads(out.read_text()))
    return results


# ----------------------------------------------------------------------------- report


def _fmt(x, spec: str, none: str = "n/a") -> str:
    return none if x is None else format(x, spec)


def print_comparison(rows: list[dict], peak: float, peak_what: str, shape: Shape, batch: int) -> None:
    print(
        f"\nTraining step, {shape.name} drafter (H={shape.hidden}, I={shape.intermediate}, heads {shape.heads}/"
        f"{shape.kv_heads}, V={shape.vocab}, N={shape.draft_vocab}, TTT {shape.ttt_steps}), batch {batch}"
    )
    print(f"MFU against the measured peak: {peak / 1e12:.3g} TFLOP/s ({peak_what})")
    print(
        "loss: per position, the 0.8^i-weighted sum over TTT steps (SpecForge's normalisation), "
        "first step (same weights, same batch) and last timed step.\n"
        "  Expected first-step difference ~1/T: at the sequence end SpecForge also trains the row whose\n"
        "  target is the last position (it pairs loss_mask[t+i] with token t+2+i); ours needs token t+2+i."
    )
    header = f"{'T':>6} {'impl':>10} {'tokens/s':>11} {'step ms':>9} {'peak GiB':>9} {'MFU':>6} {'loss first':>11} {'loss last':>10}"
    print(header)
    print("-" * len(header))
    by_len: dict[int, dict[str, dict]] = {}
    for r in rows:
        by_len.setdefault(r["seq_len"], {})[r["impl"]] = r
    for T, impls in sorted(by_len.items()):
        flops = step_flops(shape, T, batch)
        for name in ("ours", "specforge"):
            r = impls.get(name)
            if r is None:
                continue
            mfu = flops / (r["step_ms"] / 1e3) / peak
            r["mfu"] = mfu
            print(
                f"{T:>6} {name:>10} {r['tokens_per_s']:>11.0f} {r['step_ms']:>9.2f} {_fmt(r['peak_gib'], '9.2f'):>9} "
                f"{mfu:>6.1%} {r['loss_first']:>11.5f} {r['loss_last']:>10.5f}"
            )
        if "ours" in impls and "specforge" in impls:
            o, s = impls["ours"], impls["specforge"]
            mem = f"{o['peak_gib'] / s['peak_gib']:.2f}x" if o["peak_gib"] and s["peak_gib"] else "n/a"
            rel = abs(o["loss_first"] - s["loss_first"]) / max(abs(s["loss_first"]), 1e-12)
            print(
                f"{T:>6} {'ours/SF':>10} {o['tokens_per_s'] / s['tokens_per_s']:>10.2f}x "
                f"{o['step_ms'] / s['step_ms']:>8.2f}x {mem:>9} {'':>6} {'rel diff':>11} {rel:>10.2e}"
            )


def print_scaling(results: list[dict]) -> None:
    if not results:
        return
    print("\nScaling through torchrun (one micro-batch of T tokens per process; efficiency = tok/s(N) / (N x tok/s(1)))")
    header = f"{'mode':>6} {'procs':>5} {'T':>6} {'tokens/s':>11} {'per proc':>10} {'step ms':>9} {'peak GiB':>9} {'efficiency':>10}"
    print(header)
    print("-" * len(header))
    base = {r["parallelism"]: r for r in results if r["nproc"] == 1}
    for r in results:
        b = base.get(r["parallelism"])
        eff = r["tokens_per_s"] / (r["nproc"] * b["tokens_per_s"]) if b else None
        print(
            f"{r['parallelism']:>6} {r['nproc']:>5} {r['seq_len']:>6} {r['tokens_per_s']:>11.0f} "
            f"{r['tokens_per_s'] / r['nproc']:>10.0f} {r['step_ms']:>9.2f} {_fmt(r['peak_gib'], '9.2f'):>9} "
            f"{_fmt(eff, '10.1%'):>10}"
        )
    modes = {r["parallelism"]: r for r in results if r["nproc"] == max(x["nproc"] for x in results)}
    if "ddp" in modes and "fsdp2" in modes:
        d, f = modes["ddp"], modes["fsdp2"]
        print(
            f"FSDP2 / DDP at {d['nproc']} process(es): {f['tokens_per_s'] / d['tokens_per_s']:.2f}x tokens/s"
            + (f", {f['peak_gib'] / d['peak_gib']:.2f}x peak memory" if d["peak_gib"] and f["peak_gib"] else "")
        )


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, CPU-friendly: checks the script end to end")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="llama-3.1-8b", help="the drafter and target sizes (default llama-3.1-8b)")
    ap.add_argument("--seq-lens", type=int, nargs="+", default=None, help="sequence lengths (default 2048 4096; smoke 64 128)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 5; smoke 2)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed warm-up steps (default 3; smoke 1)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-specforge", action="store_true", help="time our step only")
    ap.add_argument("--nproc", type=int, nargs="*", default=[], help="process counts for the torchrun scaling runs, e.g. 1 2")
    ap.add_argument("--parallelism", nargs="+", default=["ddp", "fsdp2"], choices=["ddp", "fsdp2"])
    ap.add_argument("--json", type=Path, default=None, help="also write every number to this file")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="after timing ours, profile one step: its N costliest operators")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.seq_lens = args.seq_lens or ([64, 128] if args.smoke else [2048, 4096])
    args.steps = args.steps or (2 if args.smoke else 5)
    args.warmup = args.warmup if args.warmup is not None else (1 if args.smoke else 3)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.worker:
        scaling_worker(args)
        return {}
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    elif not args.smoke:
        print("no CUDA device: the Llama-8B-shaped run needs a GPU; use --smoke on CPU", file=sys.stderr)
        sys.exit(2)
    shape = SMOKE if args.smoke else SHAPES[args.shape]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {name}; torch {torch.__version__}")
    sf, why = (None, "skipped (--no-specforge)") if args.no_specforge else import_specforge()
    if sf is None:
        print(f"SpecForge: not run: {why}. Timing ours only.")
    elif device.type != "cuda":
        print("SpecForge: not run: its loss is a Triton kernel, which needs a GPU. Timing ours only.")
        sf = None
    else:
        print(f"SpecForge {SPECFORGE_VERSION}: {sf['where']}")
    peak, peak_what = measure_matmul_peak(device, args.smoke)
    rows = []
    for T in args.seq_lens:
        print(f"T={T}: ours ...", flush=True)
        rows.append(run_ours(shape, T, args.batch, args.steps, args.warmup, device, args.seed, args.profile))
        if sf is not None:
            print(f"T={T}: SpecForge ...", flush=True)
            try:
                rows.append(run_specforge(sf, shape, T, args.batch, args.steps, args.warmup, device, args.seed))
            except Exception as err:  # report, keep our numbers
                print(f"  SpecForge failed at T={T}: {type(err).__name__}: {err}", flush=True)
                reset_memory(device)
    reset_memory(device)
    print_comparison(rows, peak, peak_what, shape, args.batch)
    scaling = run_scaling(args, device) if args.nproc else []
    print_scaling(scaling)
    report = {
        "device": name,
        "torch": torch.__version__,
        "shape": asdict(shape),
        "peak_flops": peak,
        "peak_what": peak_what,
        "step": rows,
        "scaling": scaling,
        "specforge": sf["where"] if sf else why,
    }
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
