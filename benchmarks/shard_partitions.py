"""Hidden-state shards as one unpartitioned asset against the partitions they were, side by side, in one run.

    python benchmarks/shard_partitions.py                      # SmolLM2, 4 shards, ~16k tokens
    python benchmarks/shard_partitions.py --tokens 8000 --json out.json

Both layouts run as Dagster materialisations in processes of their own, as run workers do (each
imports the code location, loads the target with Hugging Face in fp32: the asset's CPU path,
and writes the shards through the pipeline's own code), over one synthetic corpus of random ids
(lengths 128-512) in the corpus schema:

    unpartitioned   the product's `hidden_state_shards`: one run extracts every shard that is not
                    finished, the target loaded once
    partitions      the asset as it was (one partition per shard, each run loading the target and
                    rebuilding its shard whole; reproduced here from its last version), its four
                    runs side by side as the project's run queue launched them (four at a time):
                    `side by side` with torch's default threads in each, `side by side, split`
                    with the cores divided among them, and `one at a time` for reference

Throughput is corpus tokens over the wall time from the first process's start to the last one's
end. Resume: each layout is killed (SIGKILL, every process) at half its uninterrupted time, and
rerun as Dagster reruns it (the one asset again; the partitions whose runs failed); the table
says how many shards the kill left finished, how many the rerun extracted, and what the kill cost
(killed time plus rerun time, over the uninterrupted time). Needs the project's venv and the
embedded target (`make setup`).
"""

# No `from __future__ import annotations`: Dagster resolves the partitioned asset's types from real annotations.

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

NUM_SHARDS = 4
LAYOUTS = ("unpartitioned", "side by side", "side by side, split", "one at a time")


# -- the worker: one run's process --------------------------------------------------------------


def partitioned_asset():
    """`hidden_state_shards` as a partitioned asset, as it was before it became one asset (its
    Hugging Face path): the run of partition i loads the target and rebuilds shard i whole."""
    import dagster as dg
    import torch

    from eagle_assets.corpus.target import target_fingerprint
    from eagle_assets.defs.common import GROUP, check_result, hash_files, metadata, target_of
    from eagle_assets.defs.hidden_states import NUM_SHARDS as SHARDS
    from eagle_assets.defs.hidden_states import ShardSettings, extraction_settings
    from eagle_assets.formats import SHARD_MANIFEST_FILE, SHARD_STATES_FILE, shard_name
    from eagle_assets.hidden_states.corpus_io import corpus_token_counts
    from eagle_assets.hidden_states.extract import extract_shard, load_target
    from eagle_assets.hidden_states.reader import ShardReader
    from eagle_assets.resources.inference_server import InferenceServerResource
    from eagle_assets.resources.storage import StorageResource

    partitions = dg.StaticPartitionsDefinition([f"{i:05d}" for i in range(SHARDS)])

    @dg.asset(
        name="hidden_state_shards",
        group_name=GROUP,
        partitions_def=partitions,
        check_specs=[dg.AssetCheckSpec("matches_corpus", asset="hidden_state_shards", blocking=True)],
    )
    def hidden_state_shards(
        context: dg.AssetExecutionContext, config: ShardSettings, inference_server: InferenceServerResource, storage: StorageResource
    ):
        preset, path = target_of(inference_server)
        index = int(context.partition_key)
        storage.fetch(storage.corpus(preset.name), log=context.log.info)
        settings = extraction_settings(config, preset)
        corpus = str(storage.corpus(preset.name))
        out = storage.hidden_states(preset.name)
        model, tokenizer = load_target(path, device="cpu", dtype=torch.float32)
        result = extract_shard(model, corpus, out, index, settings, tokenizer=tokenizer, target_fingerprint=target_fingerprint(path))
        shard_dir = out / shard_name(index)
        storage.publish(shard_dir, log=context.log.info)
        yield dg.MaterializeResult(
            metadata=metadata({"tokens": sum(result.manifest.token_counts), "tokens_per_s": round(result.tokens_per_s, 1)}),
            data_version=dg.DataVersion(hash_files([shard_dir / SHARD_MANIFEST_FILE, shard_dir / SHARD_STATES_FILE])),
        )
        reader = ShardReader(shard_dir)
        expected = corpus_token_counts(corpus, SHARDS).get(index, {})
        yield check_result(dict(zip(reader.sample_ids, reader.manifest.token_counts)) == expected, {}, check_name="matches_corpus")

    return hidden_state_shards


def work(data: Path, shard: int | None) -> dict:
    """Materialise the unpartitioned asset (`shard` None) or partition `shard` of the old one."""
    import dagster as dg

    import eagle_assets.definitions  # noqa: F401  a run worker loads the whole code location
    from eagle_assets.defs.hidden_states import hidden_state_shards
    from eagle_assets.resources.inference_server import InferenceServerResource
    from eagle_assets.resources.storage import StorageResource
    from eagle_assets.targets import EMBEDDED_TARGET

    asset = hidden_state_shards if shard is None else partitioned_asset()
    resources = {"inference_server": InferenceServerResource(target=EMBEDDED_TARGET), "storage": StorageResource(root=str(data))}
    run_config = {"ops": {"hidden_state_shards": {"config": {"source": "hf", "device": "cpu"}}}}
    with dg.DagsterInstance.ephemeral() as instance:
        result = dg.materialize(
            [asset], resources=resources, run_config=run_config, instance=instance, partition_key=None if shard is None else f"{shard:05d}"
        )
        [event] = result.get_asset_materialization_events()
        meta = {k: v.value for k, v in event.materialization.metadata.items()}
    return {"shards_extracted": meta.get("shards_extracted", 1)}


# -- the driver ---------------------------------------------------------------------------------


def write_corpus(folder: Path, tokens: int, seed: int = 0) -> int:
    """Random ids in the corpus schema for the embedded target (its fingerprint in `target`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from eagle_assets.corpus.target import target_fingerprint
    from eagle_assets.formats import stable_id
    from eagle_assets.targets import EMBEDDED_TARGET
    from eagle_assets.targets.embedded import resolve_target

    preset, path = resolve_target(EMBEDDED_TARGET, log=lambda m: None)
    rng = np.random.default_rng(seed)
    ids, masks, total = [], [], 0
    while total < tokens:
        n = int(rng.integers(128, 513))
        ids.append(rng.integers(0, preset.vocab_size, n, dtype=np.int32))
        mask = np.zeros(n, np.uint8)
        mask[n // 3 :] = 1
        masks.append(mask)
        total += n
    table = pa.table(
        {
            "sample_id": [stable_id("shard-partitions-bench", i) for i in range(len(ids))],
            "input_ids": pa.array(ids, type=pa.list_(pa.int32())),
            "loss_mask": pa.array(masks, type=pa.list_(pa.uint8())),
            "num_tokens": pa.array([len(x) for x in ids], type=pa.int32()),
            "target": [target_fingerprint(path)] * len(ids),
        }
    )
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "part-00000.parquet")
    (folder / "manifest.json").write_text(json.dumps({"shards": ["part-00000.parquet"]}))
    return total


def _spawn(data: Path, shard: int | None, threads: int | None) -> subprocess.Popen:
    env = {**os.environ, "EAGLE_ASSETS_NUM_SHARDS": str(NUM_SHARDS)}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    cmd = [sys.executable, __file__, "--worker", str(data)] + ([] if shard is None else ["--shard", str(shard)])
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _finish(procs: list[subprocess.Popen]) -> list[dict]:
    results = []
    for p in procs:
        out, err = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"worker {p.args[3:]} failed (exit {p.returncode}):\n{err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def run_layout(layout: str, data: Path, shards: list[int], kill_after_s: float | None = None) -> dict:
    """Run `layout` over `shards` (the unpartitioned asset takes every shard it finds unfinished);
    with `kill_after_s`, SIGKILL every process still going then. Returns the wall seconds and the
    shards the runs extracted (none counted for a killed layout)."""
    if layout == "unpartitioned":
        batches = [[(None, None)]]
    elif layout == "one at a time":
        batches = [[(i, None)] for i in shards]
    else:
        threads = max(1, (os.cpu_count() or 1) // len(shards)) if layout == "side by side, split" else None
        batches = [[(i, threads) for i in shards]]
    started = time.perf_counter()
    extracted = 0
    for batch in batches:
        procs = [_spawn(data, shard, threads) for shard, threads in batch]
        if kill_after_s is not None:
            while time.perf_counter() - started < kill_after_s and any(p.poll() is None for p in procs):
                time.sleep(0.2)
            if any(p.poll() is None for p in procs):
                for p in procs:
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGKILL)
                    p.communicate()
                return {"seconds": time.perf_counter() - started, "shards_extracted": 0}
        extracted += sum(r["shards_extracted"] for r in _finish(procs))
    return {"seconds": time.perf_counter() - started, "shards_extracted": extracted}


def finished_shards(data: Path) -> dict[int, int]:
    """{shard: its tokens} for every shard folder that is complete and checks out."""
    from eagle_assets.formats import SHARD_MANIFEST_FILE, shard_name
    from eagle_assets.hidden_states.reader import read_manifest, shard_problem
    from eagle_assets.targets import EMBEDDED_TARGET

    out = data / EMBEDDED_TARGET / "hidden_states"
    done = {}
    for i in range(NUM_SHARDS):
        folder = out / shard_name(i)
        if (folder / SHARD_MANIFEST_FILE).is_file() and shard_problem(folder) is None:
            done[i] = sum(read_manifest(folder).token_counts)
    return done


def measure(tokens: int, scratch: Path) -> dict:
    from eagle_assets.targets import EMBEDDED_TARGET

    corpus = scratch / "corpus"
    total = write_corpus(corpus, tokens)
    rows = {}
    for layout in LAYOUTS:
        row = rows.setdefault(layout, {})
        for phase in ("whole", "resume"):
            data = scratch / f"{layout.replace(' ', '-').replace(',', '')}-{phase}"
            shutil.copytree(corpus, data / EMBEDDED_TARGET / "corpus")
            if phase == "whole":
                whole = run_layout(layout, data, list(range(NUM_SHARDS)))
                assert sorted(finished_shards(data)) == list(range(NUM_SHARDS)) and whole["shards_extracted"] == NUM_SHARDS, layout
                row.update(seconds=whole["seconds"], tokens_per_s=total / whole["seconds"])
                print(f"{layout}: {whole['seconds']:.1f} s, {total / whole['seconds']:.0f} tokens/s", flush=True)
            else:
                kill_at = row["seconds"] / 2
                run_layout(layout, data, list(range(NUM_SHARDS)), kill_after_s=kill_at)
                kept = finished_shards(data)
                todo = [i for i in range(NUM_SHARDS) if i not in kept]
                rerun = run_layout(layout, data, todo)
                done = finished_shards(data)
                assert sorted(done) == list(range(NUM_SHARDS)) and rerun["shards_extracted"] == len(todo), (layout, rerun, todo)
                redone = sum(done[i] for i in todo)
                row.update(
                    kill_at_s=kill_at,
                    kept_at_kill=len(kept),
                    rerun_shards=len(todo),
                    rerun_tokens=redone,
                    rerun_s=rerun["seconds"],
                    kill_cost=(kill_at + rerun["seconds"]) / row["seconds"],
                )
                print(
                    f"{layout}: killed at {kill_at:.1f} s with {len(kept)} shard(s) finished; the rerun extracted "
                    f"{len(todo)} ({redone} tokens) in {rerun['seconds']:.1f} s",
                    flush=True,
                )
            shutil.rmtree(data)
    return {"tokens": total, "shards": NUM_SHARDS, "rows": rows}


def cpu_name() -> str:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "unknown CPU")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    kinds = [f for f in ("avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    return f"{model}, {os.cpu_count()} cores, {' '.join(kinds) or 'no AVX-512'}{'' if 'amx_bf16' in flags else ', no AMX'}"


def table(result: dict) -> str:
    base = result["rows"]["unpartitioned"]
    lines = [
        "| layout | tokens/s | vs unpartitioned | killed at | shards finished then | rerun extracted | rerun s | killed + rerun / whole |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for layout, r in result["rows"].items():
        lines.append(
            f"| {layout} | {r['tokens_per_s']:.0f} | {r['tokens_per_s'] / base['tokens_per_s']:.2f}x | {r['kill_at_s']:.0f} s | "
            f"{r['kept_at_kill']} of {result['shards']} | {r['rerun_shards']} shards, {r['rerun_tokens']:,} tokens | "
            f"{r['rerun_s']:.0f} | {r['kill_cost']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16000, help="corpus tokens (spread over 4 shards by sample id)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--shard", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        print(json.dumps(work(args.worker, args.shard)))
        return
    print(f"CPU: {cpu_name()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="shard-partitions-") as scratch:
        result = measure(args.tokens, Path(scratch))
    result["cpu"] = cpu_name()
    print(f"\n{result['tokens']:,} corpus tokens in {result['shards']} shards, SmolLM2-135M-Instruct in fp32 on {result['cpu']}\n")
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
