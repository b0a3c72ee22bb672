#!/usr/bin/env bash
# Which prompts make the better SmolLM2 drafter for MT-Bench: ShareGPT's human turns, Magpie
# prompts the target writes, or both together. One GPU, no Dagster or vLLM:
#
#   bash benchmarks/prompt_sources_gpu.sh ROOT OUT
#
# Two corpora, each made as `smollm2-quality` makes its own (ShareGPT: every conversation of the
# packaged file that opens with a human turn; Magpie: the preset's 16,000 prompts, its share of
# 32,000, named here since one source alone would take all 32,000), generated side by side.
# Then four drafters trained side by side with the preset's other settings:
#   sharegpt  8 epochs on ShareGPT alone
#   magpie    8 epochs on Magpie alone
#   both-4    4 epochs on both (about the same steps as either alone)
#   both-8    8 epochs on both (more data, twice the steps)
# Each is measured by the offline reference decoder on all 80 MT-Bench first turns (128 tokens,
# K=3), by category and within vs past the target's own end of answer. Every stage resumes, so
# the script can be run again after a cut. OUT receives every variant's figures in one JSON and
# the vLLM export of the drafter with the best MT-Bench AL.
set -euo pipefail
ROOT=${1:?ROOT: where the corpora and drafters go}
OUT=${2:?OUT: where the figures and the best export go}
mkdir -p "$ROOT" "$OUT"
Q=(python3 benchmarks/quality_drafter.py)
GEN=(--max-batch 1024 --max-len 1024 --gen-dtype bfloat16 --corpus-budget-s 420)

"${Q[@]}" --data "$ROOT/sharegpt" --stages target
"${Q[@]}" --data "$ROOT/sharegpt" --stages corpus,shards --prompt-source sharegpt "${GEN[@]}" >"$ROOT/corpus-sharegpt.log" 2>&1 &
"${Q[@]}" --data "$ROOT/magpie" --stages corpus,shards --prompt-source magpie --num-prompts 16000 "${GEN[@]}" >"$ROOT/corpus-magpie.log" 2>&1 &
wait

variant() {  # NAME DATA ARGS...: train and measure one drafter, logging to ROOT/NAME.log
  local name=$1 data=$2
  shift 2
  "${Q[@]}" --data "$data" --stages train,offline --drafter-dir "$name" --offline-workers 2 "$@" >"$ROOT/$name.log" 2>&1
}
variant sharegpt "$ROOT/sharegpt" --epochs 8 &
variant magpie "$ROOT/magpie" --epochs 8 &
variant both-4 "$ROOT/sharegpt" --epochs 4 --also-train-on "$ROOT/magpie" &
variant both-8 "$ROOT/sharegpt" --epochs 8 --also-train-on "$ROOT/magpie" &
wait

python3 - "$ROOT" "$OUT" <<'EOF'
import json, shutil, sys
from pathlib import Path
sys.path.insert(0, "benchmarks")
from quality_drafter import copy_in_parts

root, out = Path(sys.argv[1]), Path(sys.argv[2])
variants = {"sharegpt": root / "sharegpt", "magpie": root / "magpie", "both-4": root / "sharegpt", "both-8": root / "sharegpt"}
figures = {"corpus": {c: json.loads((root / c / "quality_figures.json").read_text()) for c in ("sharegpt", "magpie")}}
for name, data in variants.items():
    figures[name] = json.loads((data / name / "quality_figures.json").read_text())
    train, offline = figures[name]["train"], figures[name]["offline"]
    print(f"{name:9s} MT-Bench AL {offline['al']:.3f}  p_k {' / '.join(f'{p:.2f}' for p in offline['per_position_acceptance'])}"
          f"  validation AL {train.get('val_al', float('nan')):.3f}  steps {train.get('steps')}  train s {train.get('stage_seconds', 0):.0f}")
(out / "prompt_sources.json").write_text(json.dumps(figures, indent=1, default=str))
best = max(variants, key=lambda n: figures[n]["offline"]["al"])
print(f"best on MT-Bench: {best}")
copy_in_parts(variants[best] / best / "drafter-vllm", out / f"drafter-vllm-{best}")
shutil.copy(variants[best] / best / "summary.json", out / f"drafter-vllm-{best}")
EOF
