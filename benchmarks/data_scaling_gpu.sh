#!/usr/bin/env bash
# How MT-Bench AL grows with training data, and how far two seeds of one recipe lie apart. One
# GPU, no Dagster or vLLM:
#
#   bash benchmarks/data_scaling_gpu.sh ROOT OUT
#
# The `smollm2-quality` corpus (ShareGPT's conversations and the preset's 16,000 Magpie prompts,
# each made as the preset makes it) is cut into 8 shards per source; samples go to shards by a
# hash of their id, so the first n shards of each are a random n/8 of its samples. Six drafters
# train side by side with the preset's other settings:
#   f0.125, f0.25, f0.5, f1   8 epochs on 1/8, 1/4, 1/2 and all of both corpora (seed 0)
#   f1-seed1                  all of both, 8 epochs, seed 1 (the spread of one recipe)
#   f0.5-e16                  half the data for the full run's steps (data against steps)
# Each is measured by the offline reference decoder on all 80 MT-Bench first turns (128 tokens,
# K=3). The summary fits AL against log2 of the data and says how many doublings the fit asks for
# a given AL. Every stage resumes, so the script can be run again after a cut; OUT receives the
# figures in one JSON.
set -euo pipefail
ROOT=${1:?ROOT: where the corpora and drafters go}
OUT=${2:?OUT: where the figures go}
mkdir -p "$ROOT" "$OUT"
Q=(python3 benchmarks/quality_drafter.py)
GEN=(--max-batch 1024 --max-len 1024 --gen-dtype bfloat16 --corpus-budget-s 420 --num-shards 8)

"${Q[@]}" --data "$ROOT/sharegpt" --stages target
"${Q[@]}" --data "$ROOT/sharegpt" --stages corpus,shards --prompt-source sharegpt "${GEN[@]}" >"$ROOT/corpus-sharegpt.log" 2>&1 &
"${Q[@]}" --data "$ROOT/magpie" --stages corpus,shards --prompt-source magpie "${GEN[@]}" >"$ROOT/corpus-magpie.log" 2>&1 &
wait

variant() {  # NAME ARGS...: train on both corpora and measure, logging to ROOT/NAME.log
  local name=$1
  shift
  "${Q[@]}" --data "$ROOT/sharegpt" --also-train-on "$ROOT/magpie" --stages train,offline --drafter-dir "$name" \
    --offline-workers 2 "$@" >"$ROOT/$name.log" 2>&1
}
variant f0.125 --epochs 8 --shard-fraction 0.125 &
variant f0.25 --epochs 8 --shard-fraction 0.25 &
variant f0.5 --epochs 8 --shard-fraction 0.5 &
variant f1 --epochs 8 &
variant f1-seed1 --epochs 8 --seed 1 &
variant f0.5-e16 --epochs 16 --shard-fraction 0.5 &
wait

python3 benchmarks/data_scaling_summary.py "$ROOT" "$OUT"
