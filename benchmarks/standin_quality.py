"""How varied and how peaked the stand-ins' greedy answers are: built stand-in, SmolLM2, random weights.

    python benchmarks/standin_quality.py            # the pulled stand-in (built first if absent)
    python benchmarks/standin_quality.py --fresh    # also times a fresh build into a temporary folder

The stand-ins (eagle_assets/targets/standins.py) are distilled from SmolLM2 so that their greedy answers
do not collapse into repetition and their logits are peaked: engines compared token for token
then agree unless one of them is wrong. This prints, side by side for SmolLM2 (the teacher), the
stand-in (tiny-deepseek-v3 as stored: bf16 weights, run in fp32) and the same architecture with
its random initial weights (seeded, stored the same way): the distinct-token share of greedy
answers to held-out prompts (topics no build trains on, under the corpus openings; not
MT-Bench), and the gap between the two largest logits along those answers (median, 10th
percentile, share under 1e-3).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from eagle_assets.targets import EMBEDDED_TARGET
from eagle_assets.targets.embedded import pull
from eagle_assets.targets.standins import (
    BUILD_RECORD,
    DEEPSEEK_STANDIN,
    build,
    chat_prompt_ids,
    distinct_share,
    greedy_answers,
    held_out_prompts,
    new_language_model,
    top2_margins,
)


def measure(model, prompts_ids: list[list[int]], answer_tokens: int, pad_id: int) -> dict:
    answers = greedy_answers(model, prompts_ids, answer_tokens, batch_size=len(prompts_ids), pad_id=pad_id)
    gaps = top2_margins(model, prompts_ids, answers)
    return {
        "distinct_share": distinct_share(answers),
        "answer_tokens": sum(map(len, answers)) / len(answers),
        "margin_median": gaps.median().item(),
        "margin_p10": gaps.quantile(0.1).item(),
        "margin_under_1e-3": (gaps < 1e-3).float().mean().item(),
        "first_answer": answers[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--fresh", action="store_true", help="time a fresh build (into a temporary folder) and measure it")
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--answer-tokens", type=int, default=64)
    a = parser.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    teacher_dir = pull(EMBEDDED_TARGET, log=lambda m: None)
    with tempfile.TemporaryDirectory() as tmp:
        if a.fresh:
            started = time.perf_counter()
            standin_dir = build(teacher_dir, Path(tmp))[DEEPSEEK_STANDIN]
            print(f"fresh build: {time.perf_counter() - started:.0f} s wall on {os.cpu_count()} CPUs", flush=True)
        else:
            standin_dir = pull(DEEPSEEK_STANDIN)
        record = json.loads((standin_dir / BUILD_RECORD).read_text())
        # The teacher answers in its own chat layout; the stand-in (and its random-weight twin) in
        # Kimi's, with the vocabulary they share.
        teacher_tokenizer, tokenizer = AutoTokenizer.from_pretrained(teacher_dir), AutoTokenizer.from_pretrained(standin_dir)
        prompts = held_out_prompts(a.num_prompts)
        teacher_ids, prompts_ids = [chat_prompt_ids(teacher_tokenizer, p) for p in prompts], [chat_prompt_ids(tokenizer, p) for p in prompts]
        random_model = new_language_model(record["settings"]["seed"]).to(torch.bfloat16).float().eval()
        teacher = AutoModelForCausalLM.from_pretrained(teacher_dir, dtype=torch.float32).eval()
        results = {"SmolLM2 (teacher)": measure(teacher, teacher_ids, a.answer_tokens, teacher_tokenizer.pad_token_id)}
        for name, model in (
            ("stand-in", AutoModelForCausalLM.from_pretrained(standin_dir, dtype=torch.float32).eval()),
            ("random weights", random_model),
        ):
            results[name] = measure(model, prompts_ids, a.answer_tokens, tokenizer.pad_token_id)

    print(f"build record: {json.dumps({k: record[k] for k in ('seconds', 'answer_tokens', 'first_loss', 'last_loss', 'bf16_autocast')})}")
    print(f"{a.num_prompts} held-out prompts, greedy, {a.answer_tokens} tokens at most, fp32\n")
    print(f"| {'model':18} | distinct share | tokens/answer | top-2 margin median | p10 | share < 1e-3 |")
    print(f"|{'-' * 20}|----------------|---------------|---------------------|-----|--------------|")
    for name, r in results.items():
        print(
            f"| {name:18} | {r['distinct_share']:14.3f} | {r['answer_tokens']:13.1f} | {r['margin_median']:19.3f} "
            f"| {r['margin_p10']:.3f} | {r['margin_under_1e-3']:12.3f} |"
        )
    print()
    for name, r in results.items():
        decoder = teacher_tokenizer if name.startswith("SmolLM2") else tokenizer
        print(f"{name}, first answer: {decoder.decode(r['first_answer'])[:200]!r}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
