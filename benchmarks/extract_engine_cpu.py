"""Hidden-state extraction on CPU: the serving engine next to Hugging Face, side by side, in one run.

    python benchmarks/extract_engine_cpu.py                                  # SmolLM2 and the DeepSeek-V3 stand-in
    python benchmarks/extract_engine_cpu.py --targets tiny-deepseek-v3 --tokens 40000

For each target it writes one synthetic corpus (random token ids in the corpus schema, lengths
uniform in [128, 512]) and extracts the same shards twice, through the pipeline's own code:

    hf       `extract_shard` over the target loaded here in fp32 (the hidden_state_shards asset's
             CPU path), the machine's cores to itself
    engine   `extract_shard` through `EngineExtractor`: a vLLM CPU server launched with the
             extraction config (`extract_hidden_states` + our CPU connector) serves the states,
             the client derives the normed final state; the server is started before timing
    ratio    engine / hf tokens per second

Hugging Face runs first and is freed before the server starts, so the two never share the cores.
Shard 0 of each side is a warm-up (first-call allocations, the engine's first batches); the
figures are shard 1's. Needs the project's venv and the vLLM engine venv (`make setup`).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from eagle_assets.engines.serving import launch_vllm  # noqa: E402
from eagle_assets.engines.vllm_launch import extraction_config, hidden_states_transfer  # noqa: E402
from eagle_assets.formats import stable_id  # noqa: E402
from eagle_assets.hidden_states.engine_extract import EngineExtractor, EngineStateClient, final_norm_of  # noqa: E402
from eagle_assets.hidden_states.extract import ExtractSettings, extract_shard  # noqa: E402
from eagle_assets.targets.embedded import resolve_target  # noqa: E402

SHARDS = 2  # shard 0 warms up, shard 1 is measured


def write_corpus(folder: Path, vocab_size: int, tokens: int, seed: int = 0) -> int:
    """Random ids in the corpus schema, one Parquet file and its manifest; returns the token count."""
    rng = np.random.default_rng(seed)
    ids, masks, total = [], [], 0
    while total < tokens:
        n = int(rng.integers(128, 513))
        ids.append(rng.integers(0, vocab_size, n, dtype=np.int32))
        mask = np.zeros(n, np.uint8)
        mask[n // 3 :] = 1
        masks.append(mask)
        total += n
    table = pa.table(
        {
            "sample_id": [stable_id("extract-bench", i) for i in range(len(ids))],
            "input_ids": pa.array(ids, type=pa.list_(pa.int32())),
            "loss_mask": pa.array(masks, type=pa.list_(pa.uint8())),
            "num_tokens": pa.array([len(x) for x in ids], type=pa.int32()),
            "target": ["synthetic"] * len(ids),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-00000.parquet")
    (folder / "manifest.json").write_text(json.dumps({"shards": ["part-00000.parquet"]}))
    return total


def measure(target: str, tokens: int, scratch: Path, concurrency: int) -> dict:
    from transformers import AutoModelForCausalLM

    preset, folder = resolve_target(target, log=lambda m: None)
    aux = preset.default_aux_layer_ids
    layers, hidden, vocab = preset.num_layers, preset.hidden_size, preset.vocab_size
    corpus = scratch / target / "corpus"
    total = write_corpus(corpus, vocab, tokens)
    settings = ExtractSettings(aux_layer_ids=tuple(aux), num_shards=SHARDS, batch_tokens=4096, progress=False)
    row = {"target": target, "corpus_tokens": total, "aux_layer_ids": list(aux), "threads": torch.get_num_threads()}

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    for shard in range(SHARDS):
        hf = extract_shard(model, str(corpus), scratch / target / "hf", shard, settings, target_fingerprint="synthetic")
    row["hf_tokens"], row["hf_tok_s"] = sum(hf.manifest.token_counts), hf.tokens_per_s
    del model
    gc.collect()

    ids = (*aux, layers)
    spool = scratch / target / "spool"
    spool.mkdir(parents=True)
    started = time.perf_counter()
    with launch_vllm(target, speculative=extraction_config(ids), kv_transfer=hidden_states_transfer(spool), log=lambda m: None) as server:
        row["engine_start_s"] = time.perf_counter() - started
        client = EngineStateClient(server.base_url, server.model, ids, concurrency=concurrency)
        with EngineExtractor(client, settings, layers, hidden, vocab, final_norm_of(folder), model_dtype="float32") as engine:
            for shard in range(SHARDS):
                got = extract_shard(engine, str(corpus), scratch / target / "engine", shard, settings, target_fingerprint="synthetic")
    row["engine_tokens"], row["engine_tok_s"] = sum(got.manifest.token_counts), got.tokens_per_s
    row["ratio"] = row["engine_tok_s"] / row["hf_tok_s"]
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", nargs="+", default=["smollm2-135m-instruct", "tiny-deepseek-v3"])
    ap.add_argument("--tokens", type=int, default=24000, help="corpus tokens per target (about half per shard)")
    ap.add_argument("--concurrency", type=int, default=16, help="samples in flight at the engine (the asset's engine_concurrency)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows as JSON here")
    args = ap.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="extract-engine-cpu-") as tmp:
        for target in args.targets:
            rows.append(measure(target, args.tokens, Path(tmp), args.concurrency))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'target':24} {'tokens':>7} {'hf tok/s':>9} {'engine tok/s':>13} {'engine/hf':>10} {'engine start':>13}")
    for r in rows:
        print(
            f"{r['target']:24} {r['engine_tokens']:7d} {r['hf_tok_s']:9.0f} {r['engine_tok_s']:13.0f} {r['ratio']:9.2f}x {r['engine_start_s']:12.0f}s"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return rows


if __name__ == "__main__":
    main()
