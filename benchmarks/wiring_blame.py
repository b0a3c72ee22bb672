"""A drafter served with one wrong aux layer id: do the numbers alone blame the wiring?

    python benchmarks/wiring_blame.py --target tiny-kimi-k2.5 --drafter data/tiny-kimi-k2.5/drafter/drafter-vllm

Copies the export, moves its last aux layer id one layer up (`--shift all`: every id, the
off-by-one of a converter that numbers layers another way), and runs the benchmark as the graph does: the offline reference
replayed over the engine's states at the layers the drafter was trained on (an extraction
server; the target never loads here), served acceptance from the engine serving the wrong
export, and the same with the right export beside it. It prints, side by side, served and
offline AL for both exports and the parity verdict twice: from the numbers alone (no drafter
config given to the judge) and with the drafter's config as evidence. Needs the project's venv,
the vLLM engine venv and the target (`eagle-assets target pull`).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from eagle_assets.bench.benchmark import run_benchmark  # noqa: E402
from eagle_assets.bench.parity import judge_parity  # noqa: E402
from eagle_assets.bench.settings import BenchmarkSettings  # noqa: E402
from eagle_assets.engines.serving import launch_vllm  # noqa: E402
from eagle_assets.engines.vllm_launch import extraction_config, hidden_states_transfer  # noqa: E402
from eagle_assets.targets.embedded import resolve_target  # noqa: E402


def shifted_copy(export: Path, out: Path, shift: str = "last") -> tuple[list[int], list[int]]:
    """The export at `out` with its last aux id (`shift` "last") or every one ("all") one
    higher; returns (right ids, wrong ids)."""
    shutil.copytree(export, out)
    cfg = json.loads((out / "config.json").read_text())
    right = list(cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    wrong = [*right[:-1], right[-1] + 1] if shift == "last" else [i + 1 for i in right]
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = wrong
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return right, wrong


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True, help="target preset or folder")
    ap.add_argument("--drafter", type=Path, required=True, help="the vLLM export as trained (its config's ids are the trained ones)")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("-k", type=int, default=3)
    ap.add_argument("--shift", choices=("last", "all"), default="last", help="move the last aux id one layer up, or every one")
    args = ap.parse_args(argv)
    preset, folder = resolve_target(args.target, log=lambda m: None)
    settings = BenchmarkSettings(
        num_prompts=args.num_prompts,
        output_len=args.output_len,
        concurrencies=(1,),
        k=args.k,
        ngram=False,
        interleave_rounds=0,
        baseline_again=False,
        offline_reference="engine",
        greedy_check=False,
    )
    with tempfile.TemporaryDirectory(prefix="wiring-blame-") as tmp:
        tmp = Path(tmp)
        right_ids, wrong_ids = shifted_copy(args.drafter, tmp / "wrong-export", args.shift)

        def serve(spec, replica: int = 0):
            return launch_vllm(args.target, speculative=spec, log=lambda m: None)

        def extraction_server(layer_ids):
            spool = tmp / f"spool-{len(list(tmp.glob('spool-*')))}"
            spool.mkdir()
            return launch_vllm(
                args.target, speculative=extraction_config(tuple(layer_ids)), kv_transfer=hidden_states_transfer(spool), log=lambda m: None
            )

        rows = []
        for label, served_dir in (("right ids " + str(right_ids), args.drafter), ("wrong ids " + str(wrong_ids), tmp / "wrong-export")):
            report, _ = run_benchmark(
                settings,
                preset.name,
                folder,
                args.drafter,
                serve,
                tmp / f"report-{len(rows)}",
                trained_aux_layer_ids=right_ids,
                target_num_layers=preset.num_layers,
                served_drafter_dir=served_dir,
                extraction_server=extraction_server,
                trust_remote_code=preset.trust_remote_code,
                log=print,
            )
            numbers_only = judge_parity(report.offline, report.served)
            rows.append((label, report, numbers_only))
    print(f"\n{args.num_prompts} MT-Bench prompts, {args.output_len} tokens, K={args.k}, concurrency 1, target {preset.name}")
    print(f"{'served export':22} {'offline AL':>10} {'served AL':>10} {'served/offline':>15}  {'verdict (numbers only)':24} verdict (with config)")
    for label, report, numbers_only in rows:
        ratio = report.served.al / report.offline.al
        print(f"{label:22} {report.offline.al:10.3f} {report.served.al:10.3f} {ratio:14.2f}x  {numbers_only.verdict:24} {report.parity.verdict}")
    for label, report, numbers_only in rows:
        print(
            f"\n{label}: served p_k {[round(p, 3) for p in report.served.per_position_acceptance]}, offline p_k "
            f"{[round(p, 3) for p in report.offline.per_position_acceptance]}\n  numbers only: {numbers_only.sentence}"
        )


if __name__ == "__main__":
    main()
