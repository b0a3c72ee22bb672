"""Online drafter training against shard training, side by side, in one run.

    python benchmarks/online_training.py --out results/            # CPU: SmolLM2's shape; GPU: SmolLM2's and Llama-3.1-8B's
    python benchmarks/online_training.py --out r/ --shapes smollm2-135m-instruct --tokens 2000000
    python benchmarks/online_training.py --out r/ --smoke          # tiny sizes: checks the script end to end

For each target shape (random weights built from the preset's shapes on the device: bf16 on a
GPU, fp32 on a CPU, as the trainer's online source loads a target; nothing is downloaded) it
writes a synthetic corpus, extracts its shards to local disk as `hidden_state_shards` does
(`extract_all`), and times, over the same planned steps (length-aware micro-batches of
`--micro-batch-tokens`, the trainer's `BatchPlanner`) and from the same initial drafter, the
trainer's optimiser step (`train.optimizer_step`, bf16 autocast) fed by:

    drafter   batches already on the device: the drafter's step alone (its cost d per token)
    forward   no training: the online source's forward alone (the target's cost f per token)
    shards    `ShardDataset.stream`: memory-mapped reads, collation and copies two steps ahead
    online    `TargetStates.stream`: the target's forward of each micro-batch in the step
    overlap   (CUDA) the same, the forward on a CUDA stream of its own one step ahead

and prints tokens/s, the ratios online/shards, and the limit: shards x d / (d + f), the rate
of the shard path if every token also paid the target's forward. Goal: online >= 0.9 x limit.
(Overlap can pass the limit, which assumes the two costs add.)

The crossover: shards cost one extraction (x per token, writes included) and then each epoch
its shard rate; online costs each epoch its online rate. Over E epochs shards take x + E/shards
per token and online E/online, so online pays while E < x / (1/online - 1/shards): the table
gives both totals for 1, 2, 4 and 8 epochs and that crossover.

Imports only the project's pure modules (no Dagster, no serving engine): it runs where torch
and transformers are, e.g. a GPU host with neither Dagster nor vLLM installed. It writes
`online_training.md` and `online_training.json` into `--out`.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
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

from eagle_assets.drafter.config import DrafterConfig  # noqa: E402
from eagle_assets.drafter.data import BatchingSpec, BatchPlanner, SamplerState, ShardDataset, rank_micro_batches  # noqa: E402
from eagle_assets.drafter.model import Eagle3Drafter  # noqa: E402
from eagle_assets.drafter.parallelize import TrainObjective  # noqa: E402
from eagle_assets.drafter.sources import CorpusSamples, TargetStates  # noqa: E402
from eagle_assets.drafter.target_head import draft_head, outside_head  # noqa: E402
from eagle_assets.drafter.train import build_optimizer, optimizer_step  # noqa: E402
from eagle_assets.formats import hidden_state_bytes_per_token, stable_id  # noqa: E402
from eagle_assets.hidden_states.extract import ExtractSettings, extract_all  # noqa: E402
from eagle_assets.targets import TargetPreset, default_aux_layer_ids, get_preset  # noqa: E402


@dataclass(frozen=True)
class Sizes:
    tokens: int
    """Corpus tokens (the shards hold them all)."""
    min_len: int
    max_len: int
    micro_batch_tokens: int
    steps: int
    """Timed optimiser steps per path."""
    warmup: int


CPU_SIZES = Sizes(tokens=24_000, min_len=64, max_len=512, micro_batch_tokens=2048, steps=6, warmup=1)
GPU_SIZES = {
    "smollm2-135m-instruct": Sizes(tokens=1_000_000, min_len=256, max_len=2048, micro_batch_tokens=16384, steps=30, warmup=5),
    "llama-3.1-8b-instruct": Sizes(tokens=240_000, min_len=256, max_len=2048, micro_batch_tokens=8192, steps=20, warmup=4),
}
SMOKE_SIZES = Sizes(tokens=3000, min_len=32, max_len=128, micro_batch_tokens=512, steps=3, warmup=1)


def hf_config(p: TargetPreset) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": p.hidden_size,
        "num_hidden_layers": p.num_layers,
        "vocab_size": p.vocab_size,
        "num_attention_heads": p.num_attention_heads,
        "num_key_value_heads": p.num_key_value_heads,
        "intermediate_size": p.intermediate_size,
        "rope_theta": p.rope_theta,
        "max_position_embeddings": p.max_position_embeddings,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }


def smoke_preset() -> TargetPreset:
    from dataclasses import replace

    p = get_preset("smollm2-135m-instruct")
    return replace(
        p,
        name="smoke",
        num_layers=8,
        hidden_size=64,
        vocab_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        draft_vocab_size=128,
    )


def build_target(p: TargetPreset, device: torch.device):
    from transformers import LlamaConfig, LlamaForCausalLM

    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    config = LlamaConfig(**{k: v for k, v in hf_config(p).items() if k not in ("architectures", "model_type")})
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype)
    return model.eval().requires_grad_(False)


def write_corpus(folder: Path, vocab: int, sizes: Sizes, seed: int = 0) -> int:
    """Random ids in the corpus schema (the columns training reads); returns the token count."""
    rng = np.random.default_rng(seed)
    rows, total = [], 0
    while total < sizes.tokens:
        n = int(rng.integers(sizes.min_len, sizes.max_len + 1))
        mask = np.zeros(n, np.uint8)
        mask[n // 4 :] = 1
        rows.append((stable_id("online-bench", len(rows)), rng.integers(0, vocab, n, dtype=np.int32), mask))
        total += n
    table = pa.table(
        {
            "sample_id": [r[0] for r in rows],
            "input_ids": pa.array([r[1] for r in rows], type=pa.list_(pa.int32())),
            "loss_mask": pa.array([r[2] for r in rows], type=pa.list_(pa.uint8())),
            "num_tokens": pa.array([len(r[1]) for r in rows], type=pa.int32()),
            "target": ["synthetic"] * len(rows),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-00000.parquet")
    (folder / "manifest.json").write_text(json.dumps({"shards": ["part-00000.parquet"]}))
    return total


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainable:
    """A fresh drafter (seeded), its optimiser and the teacher heads: what one timed path trains."""

    def __init__(self, p: TargetPreset, model, aux: tuple[int, ...], device: torch.device, embedding: torch.Tensor):
        config = DrafterConfig.from_target_config(hf_config(p), aux_layer_ids=aux, draft_vocab_size=p.draft_vocab_size)
        d2t = torch.zeros(p.draft_vocab_size, dtype=torch.long)  # the lowest ids: target id = draft id
        t2d = torch.zeros(p.vocab_size, dtype=torch.bool)
        t2d[: p.draft_vocab_size] = True
        torch.manual_seed(0)
        drafter = Eagle3Drafter(config)
        drafter.load_target_embedding(embedding)
        drafter.set_vocab_mapping(d2t, t2d)
        drafter.to(device)
        self.bf16 = True
        if self.bf16:
            drafter.embed_tokens.to(torch.bfloat16)
        lm_head = model.lm_head.weight.detach()
        head_dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.target_head = draft_head(lm_head, d2t).to(device, head_dtype)
        self.outside_head = outside_head(lm_head, t2d).to(device, head_dtype)
        self.model = TrainObjective(drafter, p.ttt_steps)
        self.optimizer = build_optimizer(self.model, 1e-4, (0.9, 0.95), 0.0, fused=device.type == "cuda")
        self.ttt_steps, self.device = p.ttt_steps, device

    def step(self, batches: list[dict]) -> None:
        optimizer_step(
            self.model,
            self.optimizer,
            None,
            batches,
            self.target_head,
            self.outside_head,
            ttt_steps=self.ttt_steps,
            world_size=1,
            grad_clip=0.5,
            use_bf16=self.bf16,
            device=self.device,
        )


def timed(stream, trainable: Trainable | None, sizes: Sizes, device: torch.device, consume=None) -> float:
    """Tokens/s over the stream's steps after the warm-up ones (each step trained, or `consume`d)."""
    tokens, started = 0, None
    try:
        for i, (_, batches, n) in enumerate(stream):
            if i == sizes.warmup:
                sync(device)
                started = time.perf_counter()
            if trainable is not None:
                trainable.step(batches)
            else:
                consume(batches)
            if started is not None:
                tokens += n
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
    sync(device)
    return tokens / (time.perf_counter() - started)


@dataclass
class Result:
    shape: str
    device: str
    tokens: int
    shard_bytes: int
    extract_tok_s: float
    drafter_tok_s: float
    forward_tok_s: float
    shards_tok_s: float
    online_tok_s: float
    overlap_tok_s: float | None

    @property
    def limit(self) -> float:
        d, f = 1 / self.drafter_tok_s, 1 / self.forward_tok_s
        return self.shards_tok_s * d / (d + f)

    @property
    def best_online(self) -> float:
        return max(self.online_tok_s, self.overlap_tok_s or 0.0)

    def epochs_seconds_per_token(self, epochs: int) -> tuple[float, float]:
        """(shards, online) seconds per corpus token over `epochs` epochs, extraction included."""
        return 1 / self.extract_tok_s + epochs / self.shards_tok_s, epochs / self.best_online

    @property
    def crossover_epochs(self) -> float:
        extra = 1 / self.best_online - 1 / self.shards_tok_s
        return float("inf") if extra <= 0 else (1 / self.extract_tok_s) / extra


def measure(p: TargetPreset, sizes: Sizes, device: torch.device, scratch: Path, rounds: int = 3, log=print) -> Result:
    work = Path(tempfile.mkdtemp(prefix=f"online-{p.name}-", dir=scratch))
    try:
        total = write_corpus(work / "corpus", p.vocab_size, sizes)
        model = build_target(p, device)
        aux = default_aux_layer_ids(p.num_layers)
        settings = ExtractSettings(aux_layer_ids=aux, num_shards=4, batch_tokens=max(sizes.micro_batch_tokens, sizes.max_len), progress=False)
        sync(device)
        t0 = time.perf_counter()
        extract_all(model, str(work / "corpus"), work / "shards", settings, target_fingerprint="synthetic")
        sync(device)
        extract_tok_s = total / (time.perf_counter() - t0)
        log(f"{p.name}: {total:,} tokens extracted at {extract_tok_s:,.0f} tokens/s")

        shards = ShardDataset([work / "shards"])
        corpus = CorpusSamples(str(work / "corpus"), 4, None, p.vocab_size, "synthetic")
        assert [s.sample_id for s in corpus.samples] == [s.sample_id for s in shards.samples]
        positions = list(range(len(shards)))
        spec = BatchingSpec(micro_batch_tokens=sizes.micro_batch_tokens, batches_per_step=1)
        planner = BatchPlanner(shards.lengths(positions), positions, spec, seed=0)
        needed = sizes.warmup + sizes.steps

        def plan():
            steps = planner.iterate(SamplerState(), epochs=1_000_000)
            for i, (here, step) in enumerate(steps):
                if i == needed:
                    return
                yield SamplerState(here.epoch, here.step + 1), rank_micro_batches(step, 0, 1), sum(shards.lengths(step[0]))

        dtype = torch.bfloat16
        embedding = model.model.embed_tokens.weight.detach().float().cpu()  # (V, H): each fresh drafter copies it
        # The drafter's step alone: every batch on the device before the clock starts.
        ready = [(s, [{k: v.to(device) for k, v in shards.collate(b, dtype).items()} for b in mine], n) for s, mine, n in plan()]
        online = TargetStates(model, corpus, aux, overlap=False)
        overlapped = TargetStates(model, corpus, aux, overlap=True) if device.type == "cuda" else None

        def forward_only(mine):
            for b in mine:
                online._rows(b)

        paths = {
            "drafter": lambda: timed(iter(ready), Trainable(p, model, aux, device, embedding), sizes, device),
            "forward": lambda: timed(plan(), None, sizes, device, consume=forward_only),
            "shards": lambda: timed(shards.stream(plan(), dtype, device), Trainable(p, model, aux, device, embedding), sizes, device),
            "online": lambda: timed(online.stream(plan(), dtype, device), Trainable(p, model, aux, device, embedding), sizes, device),
        }
        if overlapped is not None:
            paths["overlap"] = lambda: timed(overlapped.stream(plan(), dtype, device), Trainable(p, model, aux, device, embedding), sizes, device)
        # In rounds, the order rotating: a slow spell of a shared host slows every path alike; the median is kept.
        names, measured = list(paths), {name: [] for name in paths}
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                gc.collect()
                measured[name].append(paths[name]())
            log(f"{p.name}: round {r + 1}: " + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in measured.items()) + " tokens/s")
        rates = {name: float(np.median(v)) for name, v in measured.items()}
        online.close()
        if overlapped is not None:
            overlapped.close()
        ready.clear()
        return Result(
            shape=p.name,
            device=device_name(device),
            tokens=total,
            shard_bytes=total * hidden_state_bytes_per_token(len(aux), p.hidden_size),
            extract_tok_s=extract_tok_s,
            drafter_tok_s=rates["drafter"],
            forward_tok_s=rates["forward"],
            shards_tok_s=rates["shards"],
            online_tok_s=rates["online"],
            overlap_tok_s=rates.get("overlap"),
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")]
        flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "")
        model = (
            (names[0] if names else model) + (", AVX-512 BF16" if "avx512_bf16" in flags else "") + (", AMX" if "amx_tile" in flags else ", no AMX")
        )
    return f"{model}; {torch.get_num_threads()} threads"


def render(results: list[Result], command: str) -> str:
    lines = [
        "# Online drafter training against shard training",
        "",
        f"- Command: `{command}`",
        f"- Device: {results[0].device if results else '?'}; torch {torch.__version__}",
        "- Drafter step: bf16 autocast; target forward: bf16 on a GPU, fp32 on a CPU.",
        "",
        "| shape | drafter tok/s | forward tok/s | shards tok/s | online tok/s | overlap tok/s | limit tok/s | online / limit | online / shards |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        overlap = f"{r.overlap_tok_s:,.0f}" if r.overlap_tok_s else "-"
        lines.append(
            f"| {r.shape} | {r.drafter_tok_s:,.0f} | {r.forward_tok_s:,.0f} | {r.shards_tok_s:,.0f} | {r.online_tok_s:,.0f} | {overlap} | "
            f"{r.limit:,.0f} | {r.best_online / r.limit:.2f} | {r.best_online / r.shards_tok_s:.2f} |"
        )
    lines += [
        "",
        "limit = shards x d / (d + f), d and f the drafter's and the forward's seconds per token; goal online / limit >= 0.9.",
        "",
        "Where shards pay (seconds per corpus token, extraction included; online: the faster of online and overlap):",
        "",
        "| shape | extraction tok/s | shard GB | E=1 shards / online | E=2 | E=4 | E=8 | online pays below E |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        cells = []
        for e in (1, 2, 4, 8):
            s, o = r.epochs_seconds_per_token(e)
            cells.append(f"{s * 1e3:.3g} / {o * 1e3:.3g} ms")
        lines.append(f"| {r.shape} | {r.extract_tok_s:,.0f} | {r.shard_bytes / 1e9:.2f} | " + " | ".join(cells) + f" | {r.crossover_epochs:.2f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, type=Path, help="folder for online_training.md and .json")
    parser.add_argument("--shapes", nargs="+", default=None, help="target presets (default: GPU both shapes, CPU SmolLM2's)")
    parser.add_argument("--tokens", type=int, default=None, help="corpus tokens per shape")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per path")
    parser.add_argument("--micro-batch-tokens", type=int, default=None)
    parser.add_argument("--scratch", type=Path, default=None, help="where the corpus and shards are written (default: the temp folder)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every path, the order rotating; the median is reported")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes on any device: checks the script end to end")
    args = parser.parse_args(argv)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    shapes = args.shapes or (["llama-3.1-8b-instruct", "smollm2-135m-instruct"] if device.type == "cuda" else ["smollm2-135m-instruct"])
    scratch = args.scratch or Path(tempfile.gettempdir())
    results = []
    for name in ["smoke"] if args.smoke else shapes:
        p = smoke_preset() if args.smoke else get_preset(name)
        sizes = SMOKE_SIZES if args.smoke else (GPU_SIZES.get(name, CPU_SIZES) if device.type == "cuda" else CPU_SIZES)
        changes = {k: v for k, v in (("tokens", args.tokens), ("steps", args.steps), ("micro_batch_tokens", args.micro_batch_tokens)) if v}
        sizes = Sizes(**{**asdict(sizes), **changes})
        results.append(measure(p, sizes, device, scratch, 1 if args.smoke else args.rounds))
    command = "python benchmarks/online_training.py " + " ".join(sys.argv[1:] if argv is None else argv)
    text = render(results, command)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "online_training.md").write_text(text)
    rows = [
        {**asdict(r), "limit_tok_s": r.limit, "online_over_limit": r.best_online / r.limit, "crossover_epochs": r.crossover_epochs} for r in results
    ]
    (args.out / "online_training.json").write_text(json.dumps(rows, indent=2))
    print(text)
    return results


if __name__ == "__main__":
    main()
