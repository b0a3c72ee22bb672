"""Where offline drafts fail: acceptance per prompt category, and inside the target's answer
against after its end-of-answer token.

The served benchmark ignores EOS so that every request emits exactly `output_len` tokens. An
answer shorter than that runs on past its end-of-answer token into text that no training
answer contains (the corpus stops at EOS), where drafts fare worse; the split shows how much of
a low AL is that artefact of the benchmark and how much is the drafter on real answers.

    slices = offline_slices(results, mt_bench_categories(8), k=3)

Pure code: reference-decoder results in, `AcceptanceNumbers` out (their `source` names the slice).
"""

from __future__ import annotations

from collections.abc import Sequence

from eagle_assets.bench.parity import AcceptanceNumbers

WITHIN_ANSWER = "within the answer"
AFTER_ANSWER = "after the end of the answer"
CATEGORY_PREFIX = "category "


def offline_slices(results: Sequence[object], categories: Sequence[str] | None, k: int) -> tuple[AcceptanceNumbers, ...]:
    """Pooled acceptance per category (in first-seen order), then within / after the answer.

    Each result needs `accepted_per_step`, `tokens`, `answer_end` (index of the first EOS, or
    None) and `steps_split_at` (the reference decoder's `Result` has them). The within/after
    pair is left out when no answer ended before the output length."""
    if categories is not None and len(categories) != len(results):
        raise ValueError(f"{len(categories)} categories for {len(results)} results: give one per prompt, in order")
    by_category: dict[str, list[int]] = {}
    for result, category in zip(results, categories or ()):
        by_category.setdefault(category, []).extend(result.accepted_per_step)
    slices = [AcceptanceNumbers.from_steps(steps, k, CATEGORY_PREFIX + c) for c, steps in by_category.items()]
    if any(r.answer_end is not None for r in results):
        within, after = [], []
        for r in results:
            before, past = r.steps_split_at(len(r.tokens) if r.answer_end is None else r.answer_end)
            within += before
            after += past
        slices += [AcceptanceNumbers.from_steps(within, k, WITHIN_ANSWER), AcceptanceNumbers.from_steps(after, k, AFTER_ANSWER)]
    return tuple(slices)


def answers_ending_early(results: Sequence[object]) -> int:
    """How many generations ran past the target's end-of-answer token."""
    return sum(r.answer_end is not None for r in results)
