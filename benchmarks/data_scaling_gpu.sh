#!/usr/bin/env bash
# How MT-Bench AL grows with training data, and how far two seeds of one recipe lie apart. One
# GPU, no Dagster or vLLM:
#
#   bash benchmarks/data_scaling_gpu.sh ROOT OUT
#   SOURCES=sharegpt bash benchmarks/data_scaling_gpu.sh ROOT OUT    # one source: real prompts alone
#
# The `smollm2-quality` corpus (ShareGPT's conversations and the preset's 16,000 Magpie prompts,
# each made as the preset makes it; SOURCES picks them) is cut into 8 shards per source; samples
# go to shards by a hash of their id, so the first n shards of each are a random n/8 of its
# samples. Five drafters train side by side with the preset's other settings:
#   f0.125, f0.25, f0.5, f1   8 epochs on 1/8, 1/4, 1/2 and all of the corpora (seed 0)
#   f1-seed1                  all of it, 8 epochs, seed 1 (the spread of one recipe)
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
read -r -a SOURCES <<<"${SOURCES:-sharegpt magpie}"
FIRST=${SOURCES[0]}
OTHERS=""
for source in "${SOURCES[@]:1}"; do OTHERS+="$ROOT/$source,"; done

"${Q[@]}" --data "$ROOT/$FIRST" --stages target
# Each source's share of the preset's 32,000 prompts: all of ShareGPT's (it holds fewer) and 16,000
# Magpie ones. Asked of one source alone, the script would write all 32,000 from it.
declare -A NUM_PROMPTS=([sharegpt]=32000 [magpie]=16000)
for source in "${SOURCES[@]}"; do
  "${Q[@]}" --data "$ROOT/$source" --stages corpus,shards --prompt-source "$source" --num-prompts "${NUM_PROMPTS[$source]}" \
    "${GEN[@]}" >"$ROOT/corpus-$source.log" 2>&1 &
done
wait

variant() {  # NAME ARGS...: train on every source's corpus and measure, logging to ROOT/NAME.log
  local name=$1
  shift
  "${Q[@]}" --data "$ROOT/$FIRST" ${OTHERS:+--also-train-on "$OTHERS"} --stages train,offline --drafter-dir "$name" \
    --offline-workers 2 "$@" >"$ROOT/$name.log" 2>&1
}
variant f0.125 --epochs 8 --shard-fraction 0.125 &
variant f0.25 --epochs 8 --shard-fraction 0.25 &
variant f0.5 --epochs 8 --shard-fraction 0.5 &
variant f1 --epochs 8 &
variant f1-seed1 --epochs 8 --seed 1 &
wait

python3 benchmarks/data_scaling_summary.py "$ROOT/$FIRST" "$OUT"
