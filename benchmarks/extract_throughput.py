"""Hidden-state extraction throughput against its limit, side by side, in one run.

    python benchmarks/extract_throughput.py              # one GPU: Llama-3.1-8B and SmolLM2 shapes
    python benchmarks/extract_throughput.py --kimi       # one GPU: Kimi-K2.5's shape, experts grouped and looped
    python benchmarks/extract_throughput.py --smoke      # tiny sizes on CPU: checks that it runs
    python benchmarks/extract_throughput.py --scratch /nvme/tmp --json out.json

For each model shape (random bf16 weights built from a LlamaConfig on the device; nothing is
downloaded) it writes a synthetic corpus to local disk and measures:

    ours      `extract_all` over that corpus, shards written to local disk (fsynced, renamed)
    forward   the bare base-model forward over the same batches (same padding, no hooks, no I/O)
    disk      sustained write bandwidth of the scratch disk (a few GB written, then fsync)
              divided by the shard bytes per token
    limit     min(forward, disk)
    ratio     ours / limit (goal >= 0.9: the writes hide behind the forward passes)

The Kimi-K2.5 case (`--kimi`) builds the target's full width (hidden 7168, MLA with its real
head dimensions, 384 experts of 2048, top-8, a shared expert) with a few decoder layers (one
dense, then MoE) of random bf16 weights, times every layer of the bare forward with CUDA events,
and extrapolates to the 61 layers of the real model: tokens / (the rest + the dense layer + 60
MoE layers). It does so with the experts grouped (transformers' `grouped_mm`: one grouped
matmul over the experts) and looped (`eager`), and runs `extract_all` itself on the few layers
against their bare forward (ours / forward). bf16 weights: the real INT4 checkpoint is served by
the engines' own kernels (`hidden_states/engine_extract.py`), not by this path.

Needs torch, transformers, safetensors, pyarrow, fsspec, numpy and tqdm; imports only the
project's pure modules (no dagster, no engine). The full run writes at most ~10 GB at a time
to the scratch folder, deleted as it goes (run time: benchmarks/results/extract_throughput_*).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle_assets.formats import hidden_state_bytes_per_token, stable_id  # noqa: E402
from eagle_assets.hidden_states.corpus_io import load_shard_samples  # noqa: E402
from eagle_assets.hidden_states.extract import ExtractSettings, extract_all, pad_batch, plan_batches, target_parts  # noqa: E402
from eagle_assets.hidden_states.writer import start_writeback  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """One model shape to measure and how much work to give it."""

    name: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tokens: int
    """Corpus tokens to extract (and to run through the bare forward)."""
    min_len: int
    max_len: int
    """Sample lengths are uniform in [min_len, max_len]."""
    batch_tokens: int


GPU_SHAPES = (
    Shape("llama-3.1-8b shape", 4096, 32, 32, 8, 14336, 128256, tokens=300_000, min_len=256, max_len=2048, batch_tokens=16384),
    Shape("smollm2-135m shape", 576, 30, 9, 3, 1536, 49152, tokens=2_000_000, min_len=256, max_len=2048, batch_tokens=65536),
)
SMOKE_SHAPES = (
    Shape("llama-3.1-8b (smoke)", 64, 8, 4, 2, 128, 1000, tokens=3_000, min_len=20, max_len=200, batch_tokens=1024),
    Shape("smollm2-135m (smoke)", 48, 7, 3, 1, 96, 1000, tokens=3_000, min_len=20, max_len=200, batch_tokens=1024),
)


@dataclass(frozen=True)
class MoeShape:
    """Kimi-K2.5's text model (DeepSeek-V3 architecture) at full width, with `moe_layers` MoE layers."""

    name: str = "kimi-k2.5 shape"
    hidden_size: int = 7168
    num_heads: int = 64
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    intermediate_size: int = 18432
    moe_intermediate_size: int = 2048
    experts: int = 384
    experts_per_token: int = 8
    vocab_size: int = 163840
    real_layers: int = 61
    moe_layers: int = 2
    tokens: int = 120_000
    min_len: int = 256
    max_len: int = 2048
    batch_tokens: int = 16384


KIMI_SHAPE = MoeShape()
KIMI_SMOKE = MoeShape(
    "kimi-k2.5 (smoke)",
    hidden_size=64,
    num_heads=2,
    q_lora_rank=32,
    kv_lora_rank=512,
    intermediate_size=128,
    moe_intermediate_size=32,
    experts=8,
    experts_per_token=2,
    vocab_size=1000,
    real_layers=61,
    moe_layers=2,
    tokens=2_000,
    min_len=20,
    max_len=200,
    batch_tokens=1024,
)


def build_moe_model(shape: MoeShape, device: torch.device):
    from transformers import AutoModelForCausalLM, DeepseekV3Config

    config = DeepseekV3Config(
        vocab_size=shape.vocab_size,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        moe_intermediate_size=shape.moe_intermediate_size,
        num_hidden_layers=1 + shape.moe_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_heads,
        n_shared_experts=1,
        n_routed_experts=shape.experts,
        routed_scaling_factor=2.827,
        kv_lora_rank=shape.kv_lora_rank,
        q_lora_rank=shape.q_lora_rank,
        qk_rope_head_dim=64,
        v_head_dim=128,
        qk_nope_head_dim=128,
        n_group=1,
        topk_group=1,
        num_experts_per_tok=shape.experts_per_token,
        first_k_dense_replace=1,
        max_position_embeddings=max(4096, shape.max_len),
        num_mtp_layers=0,
        initializer_range=0.02,
    )
    torch.manual_seed(0)
    with device:  # random weights made on the device, in bf16 directly
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


@torch.inference_mode()
def layer_times(model, corpus: Path, settings: ExtractSettings, device: torch.device) -> tuple[float, list[float], int]:
    """(whole forward seconds, seconds per decoder layer, tokens) of the bare base-model forward
    over the extraction's batches, the layers timed with CUDA events (wall clock on CPU)."""
    parts = target_parts(model)
    inputs, tokens = [], 0
    for i in range(settings.num_shards):
        s = load_shard_samples(str(corpus), i, settings.num_shards)
        for a, b in plan_batches(s.token_counts, settings.batch_tokens):
            ids, _, mask = pad_batch(s.input_ids[a:b])
            inputs.append((ids, mask))
            tokens += sum(s.token_counts[a:b])
    cuda = device.type == "cuda"
    marks: dict[int, list] = {j: [] for j in range(len(parts.layers))}
    clock = (lambda: torch.cuda.Event(enable_timing=True)) if cuda else None

    def pre(j):
        def hook(module, args, kwargs):
            if cuda:
                ev = clock()
                ev.record()
                marks[j].append([ev, None])
            else:
                marks[j].append([time.perf_counter(), None])

        return hook

    def post(j):
        def hook(module, args, output):
            if cuda:
                ev = clock()
                ev.record()
                marks[j][-1][1] = ev
            else:
                marks[j][-1][1] = time.perf_counter()

        return hook

    def one_pass() -> float:
        sync(device)
        start = time.perf_counter()
        for ids, mask in inputs:
            mask = None if mask is None else mask.to(device, non_blocking=True)
            parts.base(input_ids=ids.to(device, non_blocking=True), attention_mask=mask, use_cache=False)
        sync(device)
        return time.perf_counter() - start

    one_pass()  # kernel selection for every padded length
    handles = [
        h
        for j, layer in enumerate(parts.layers)
        for h in (layer.register_forward_pre_hook(pre(j), with_kwargs=True), layer.register_forward_hook(post(j)))
    ]
    try:
        whole = one_pass()
    finally:
        for h in handles:
            h.remove()
    per_layer = [sum((a.elapsed_time(b) / 1e3) if cuda else (b - a) for a, b in marks[j]) for j in marks]
    return whole, per_layer, tokens


@dataclass
class MoeRow:
    shape: str
    experts: str
    layers: int
    forward_tok_s: float
    dense_ms_per_1k: float
    moe_ms_per_1k: float
    rest_ms_per_1k: float
    extrapolated_tok_s: float


def measure_moe(shape: MoeShape, device: torch.device, scratch: Path, num_shards: int) -> tuple[list[MoeRow], float, float]:
    """The per-layer times with experts grouped and looped, and (grouped) our extraction
    against the bare forward of the same few layers: (rows, ours tok/s, forward tok/s)."""
    t0 = time.perf_counter()
    model = build_moe_model(shape, device)
    corpus, out = scratch / "moe-corpus", scratch / "moe-shards"
    tokens = write_corpus(
        corpus, Shape(shape.name, shape.hidden_size, 0, 0, 0, 0, shape.vocab_size, shape.tokens, shape.min_len, shape.max_len, shape.batch_tokens)
    )
    print(f"[{shape.name}] {1 + shape.moe_layers} layers + corpus ({tokens:,} tokens) ready in {time.perf_counter() - t0:.1f} s", flush=True)
    L = 1 + shape.moe_layers
    settings = ExtractSettings(aux_layer_ids=(1, L - 1, L), num_shards=num_shards, batch_tokens=shape.batch_tokens, progress=False)
    rows = []
    for impl in ("grouped_mm", "eager"):
        model.set_experts_implementation(impl)
        whole, per_layer, n = layer_times(model, corpus, settings, device)
        dense, moe = per_layer[0], sum(per_layer[1:]) / shape.moe_layers
        rest = max(whole - sum(per_layer), 0.0)
        full = rest + dense + (shape.real_layers - 1) * moe
        rows.append(MoeRow(shape.name, impl, L, n / whole, 1e3 * dense / n * 1e3, 1e3 * moe / n * 1e3, 1e3 * rest / n * 1e3, n / full))
        print(
            f"[{shape.name}] experts {impl}: {L} layers {n / whole:,.0f} tok/s; extrapolated to {shape.real_layers} layers {n / full:,.0f} tok/s",
            flush=True,
        )
    model.set_experts_implementation("grouped_mm")
    forward = bare_forward(model, corpus, settings, device)
    extract_all(model, str(corpus), out, settings, target_fingerprint="synthetic", shards=[0])  # warm-up
    shutil.rmtree(out)
    sync(device)
    start = time.perf_counter()
    extract_all(model, str(corpus), out, settings, target_fingerprint="synthetic")
    sync(device)
    ours = tokens / (time.perf_counter() - start)
    print(f"[{shape.name}] extraction over {L} layers {ours:,.0f} tok/s, bare forward {forward:,.0f} tok/s", flush=True)
    shutil.rmtree(out)
    shutil.rmtree(corpus)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows, ours, forward


def print_moe_table(rows: list[MoeRow], ours: float, forward: float, device: str, disk_bytes_s: float, hidden: int) -> None:
    print(
        f"\nKimi-K2.5-shaped extraction on {device} (full width, {rows[0].layers} layers measured, per-layer times "
        "extrapolated to 61; bf16 random weights)"
    )
    head = f"{'experts':<12} {'tok/s measured':>15} {'dense ms/1k tok':>16} {'MoE ms/1k tok':>14} {'rest ms/1k tok':>15} {'tok/s at 61 layers':>19}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.experts:<12} {r.forward_tok_s:>15,.0f} {r.dense_ms_per_1k:>16.2f} {r.moe_ms_per_1k:>14.2f} {r.rest_ms_per_1k:>15.2f} "
            f"{r.extrapolated_tok_s:>19,.0f}"
        )
    disk_tok_s = disk_bytes_s / hidden_state_bytes_per_token(3, hidden)
    limit = min(forward, disk_tok_s)
    print(f"grouped / looped experts at 61 layers: {rows[0].extrapolated_tok_s / rows[1].extrapolated_tok_s:.2f}x")
    print(
        f"our extraction over the {rows[0].layers} measured layers: {ours:,.0f} tok/s against a limit of {limit:,.0f} "
        f"(bare forward {forward:,.0f}, disk {disk_bytes_s / 1e9:.2f} GB/s = {disk_tok_s:,.0f} tok/s of 3 aux + final states): "
        f"{ours / limit:.2f} of it. At 61 layers the forward, not the disk, is the limit "
        f"({rows[0].extrapolated_tok_s:,.0f} tok/s need {rows[0].extrapolated_tok_s * hidden_state_bytes_per_token(3, hidden) / 1e9:.2f} GB/s)."
    )


def build_model(shape: Shape, device: torch.device):
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        intermediate_size=shape.intermediate_size,
        vocab_size=shape.vocab_size,
        max_position_embeddings=max(4096, shape.max_len),
        initializer_range=0.02,
    )
    torch.manual_seed(0)
    with device:  # random weights made on the device, in bf16 directly: no fp32 copy of 8B weights
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    return model.eval()


def write_corpus(folder: Path, shape: Shape, seed: int = 0) -> int:
    """A synthetic corpus of random ids in the corpus schema; returns its token count."""
    rng = np.random.default_rng(seed)
    rows, total = [], 0
    while total < shape.tokens:
        n = int(rng.integers(shape.min_len, shape.max_len + 1))
        ids = rng.integers(0, shape.vocab_size, n, dtype=np.int32)
        mask = np.zeros(n, np.uint8)
        mask[n // 3 :] = 1  # the "assistant" part
        rows.append({"sample_id": stable_id("bench", len(rows)), "input_ids": ids, "loss_mask": mask, "num_tokens": n, "target": "synthetic"})
        total += n
    table = pa.table(
        {
            "sample_id": [r["sample_id"] for r in rows],
            "input_ids": pa.array([r["input_ids"] for r in rows], type=pa.list_(pa.int32())),
            "loss_mask": pa.array([r["loss_mask"] for r in rows], type=pa.list_(pa.uint8())),
            "num_tokens": pa.array([r["num_tokens"] for r in rows], type=pa.int32()),
            "target": [r["target"] for r in rows],
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-00000.parquet")
    (folder / "manifest.json").write_text(json.dumps({"shards": ["part-00000.parquet"]}))
    return total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def bare_forward(model, corpus: Path, settings: ExtractSettings, device: torch.device) -> float:
    """Tokens/s of the base model alone over the same batches extraction runs (no hooks, no I/O)."""
    base = target_parts(model).base
    batches_per_shard = []
    for i in range(settings.num_shards):
        s = load_shard_samples(str(corpus), i, settings.num_shards)
        batches_per_shard.append((s, plan_batches(s.token_counts, settings.batch_tokens)))
    # Inputs are built before the clock starts: the loop below is the GPU's share only.
    inputs, tokens = [], 0
    for s, batches in batches_per_shard:
        for a, b in batches:
            ids, _, mask = pad_batch(s.input_ids[a:b])
            if device.type == "cuda":  # pinned, as the extraction does: the copies stay asynchronous
                ids, mask = ids.pin_memory(), None if mask is None else mask.pin_memory()
            inputs.append((ids, mask))
            tokens += sum(s.token_counts[a:b])

    def one_pass() -> float:
        sync(device)
        start = time.perf_counter()
        for ids, mask in inputs:
            mask = None if mask is None else mask.to(device, non_blocking=True)
            base(input_ids=ids.to(device, non_blocking=True), attention_mask=mask, use_cache=False)
        sync(device)
        return tokens / (time.perf_counter() - start)

    # Every padded length is a new shape for the attention and matmul kernels: the first pass
    # pays their selection, as extraction's warm-up shard does. The limit is the warm pass.
    one_pass()
    return one_pass()


def disk_write_bandwidth(folder: Path, total_bytes: int, block: int = 64 << 20) -> float:
    """Bytes/s of sequential writes to `folder`, fsync included (the page cache does not count).

    Each block's writeback is started as soon as it is written, as the shard writer does, so
    this is the disk's streaming rate rather than a copy into memory followed by one flush.
    """
    path = folder / "disk-bandwidth.bin"
    buf = np.random.default_rng(0).integers(0, 256, min(block, total_bytes), dtype=np.uint8).tobytes()
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = 0
        while written < total_bytes:
            n = os.write(fd, buf)
            start_writeback(fd, written, n)
            written += n
        os.fsync(fd)
    finally:
        os.close(fd)
    seconds = time.perf_counter() - start
    path.unlink()
    return written / seconds


@dataclass
class Row:
    shape: str
    tokens: int
    bytes_per_token: int
    ours_tok_s: float
    forward_tok_s: float
    disk_bytes_s: float
    disk_tok_s: float
    limit_tok_s: float
    ratio: float


def profile_extraction(model, corpus: Path, out: Path, settings: ExtractSettings, device: torch.device, rows: int, name: str) -> None:
    """One more extraction of shard 0 under torch.profiler: the share of its wall time the GPU
    spent in kernels (below 1, the GPU waited on the host), and the operators that took the most
    host and device time, so what holds the extraction below its limit can be read off."""
    from torch.profiler import ProfilerActivity, profile

    shutil.rmtree(out, ignore_errors=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        extract_all(model, str(corpus), out, settings, target_fingerprint="synthetic", shards=[0])
        sync(device)
    wall = time.perf_counter() - start
    events = prof.key_averages()
    if device.type == "cuda":
        kernel_s = sum(e.self_device_time_total for e in events) / 1e6
        print(f"[{name}] profile of shard 0: {wall:.2f} s wall, GPU kernels {kernel_s:.2f} s ({kernel_s / wall:.0%} busy)", flush=True)
        print(events.table(sort_by="self_cuda_time_total", row_limit=rows, max_name_column_width=60), flush=True)
    print(events.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60), flush=True)
    shutil.rmtree(out, ignore_errors=True)


def measure(shape: Shape, device: torch.device, scratch: Path, disk_bytes_s: float, num_shards: int, profile_rows: int = 0) -> Row:
    t0 = time.perf_counter()
    model = build_model(shape, device)
    corpus, out = scratch / "corpus", scratch / "shards"
    tokens = write_corpus(corpus, shape)
    print(f"[{shape.name}] model + corpus ({tokens:,} tokens) ready in {time.perf_counter() - t0:.1f} s", flush=True)
    L = shape.num_layers
    settings = ExtractSettings(aux_layer_ids=(2, L // 2, L - 3), num_shards=num_shards, batch_tokens=shape.batch_tokens, progress=False)

    forward = bare_forward(model, corpus, settings, device)
    print(f"[{shape.name}] bare forward {forward:,.0f} tok/s", flush=True)

    # Warm-up extraction of one shard (kernels, pinned buffers), then the timed run from scratch.
    extract_all(model, str(corpus), out, settings, target_fingerprint="synthetic", shards=[0])
    shutil.rmtree(out)
    sync(device)
    start = time.perf_counter()
    results = extract_all(model, str(corpus), out, settings, target_fingerprint="synthetic")
    sync(device)
    ours = tokens / (time.perf_counter() - start)
    assert sum(r.manifest.extra["num_tokens"] for r in results) == tokens
    print(f"[{shape.name}] extraction {ours:,.0f} tok/s", flush=True)

    if profile_rows:
        profile_extraction(model, corpus, out, settings, device, profile_rows, shape.name)
    bpt = hidden_state_bytes_per_token(3, shape.hidden_size)
    disk_tok_s = disk_bytes_s / bpt
    limit = min(forward, disk_tok_s)
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(corpus)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return Row(shape.name, tokens, bpt, ours, forward, disk_bytes_s, disk_tok_s, limit, ours / limit)


def print_table(rows: list[Row], device: str) -> None:
    print(f"\nhidden-state extraction on {device} (3 aux + final, bf16)")
    head = f"{'shape':<22} {'B/token':>8} {'ours tok/s':>12} {'forward tok/s':>14} {'disk GB/s':>10} {'disk tok/s':>12} {'limit tok/s':>12} {'ours/limit':>10}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r.shape:<22} {r.bytes_per_token:>8,} {r.ours_tok_s:>12,.0f} {r.forward_tok_s:>14,.0f} "
            f"{r.disk_bytes_s / 1e9:>10.2f} {r.disk_tok_s:>12,.0f} {r.limit_tok_s:>12,.0f} {r.ratio:>10.2f}"
        )
    print("goal: ours/limit >= 0.90 (limit = min(forward, disk bandwidth / bytes per token))")


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--smoke", action="store_true", help="tiny shapes on CPU: checks the script runs")
    ap.add_argument("--scratch", type=Path, default=None, help="local-disk folder for corpus and shards (default: a temp folder)")
    ap.add_argument("--disk-gb", type=float, default=None, help="GB written to measure the disk (default 6, smoke 0.05)")
    ap.add_argument("--num-shards", type=int, default=4)
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    ap.add_argument("--kimi", action="store_true", help="the Kimi-K2.5-shaped case only (full width, a few layers, extrapolated)")
    ap.add_argument("--shapes", nargs="+", default=None, help="only the shapes whose name starts with these (e.g. smollm2)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="also profile one shard per shape: its N costliest operators")
    args = ap.parse_args(argv)

    device = torch.device("cpu" if args.smoke or not torch.cuda.is_available() else "cuda")
    if not args.smoke and device.type != "cuda":
        ap.error("no CUDA device: the full benchmark needs one GPU; use --smoke on CPU")
    shapes = SMOKE_SHAPES if args.smoke else GPU_SHAPES
    disk_gb = args.disk_gb if args.disk_gb is not None else (0.05 if args.smoke else 6.0)
    began = time.perf_counter()
    scratch_root = Path(tempfile.mkdtemp(prefix="extract-bench-", dir=args.scratch))
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    if args.kimi:
        shape = KIMI_SMOKE if args.smoke else KIMI_SHAPE
        try:
            disk = disk_write_bandwidth(scratch_root, int(disk_gb * 1e9))
            moe_rows, ours, forward = measure_moe(shape, device, scratch_root, args.num_shards)
        finally:
            shutil.rmtree(scratch_root, ignore_errors=True)
        print_moe_table(moe_rows, ours, forward, name, disk, shape.hidden_size)
        print(f"total {time.perf_counter() - began:.0f} s")
        if args.json:
            args.json.write_text(
                json.dumps({"rows": [asdict(r) for r in moe_rows], "ours_tok_s": ours, "forward_tok_s": forward, "disk_bytes_s": disk}, indent=2)
            )
        return moe_rows
    try:
        disk = disk_write_bandwidth(scratch_root, int(disk_gb * 1e9))
        print(f"disk: {disk / 1e9:.2f} GB/s sustained write (fsync) at {scratch_root}", flush=True)
        if args.shapes:
            shapes = [s for s in shapes if any(s.name.startswith(prefix) for prefix in args.shapes)]
        rows = [measure(s, device, scratch_root, disk, args.num_shards, args.profile) for s in shapes]
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)
    print_table(rows, name)
    print(f"total {time.perf_counter() - began:.0f} s")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return rows


if __name__ == "__main__":
    main()
