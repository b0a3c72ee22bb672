"""Offline acceptance per category and within / after the target's answer."""

from __future__ import annotations

import math

import pytest

from eagle_assets.bench.breakdown import AFTER_ANSWER, WITHIN_ANSWER, answers_ending_early, offline_slices
from eagle_assets.bench.reference_decoder import Result


def _result(accepted: list[int], answer_end: int | None, k: int = 3) -> Result:
    # Step i emits accepted[i] + 1 tokens; the prefill emitted the first one.
    tokens = [0] * (1 + sum(a + 1 for a in accepted))
    return Result(tokens=tokens, accepted_per_step=accepted, k=k, answer_end=answer_end)


def test_slices_by_category_and_by_answer_end():
    # Steps of `a` draft from output indices 1, 5, 9, 10: with the answer ending at index 5, the
    # first two steps are within it and the last two after it.
    a = _result([3, 3, 0, 1], answer_end=5)
    b = _result([2, 2], answer_end=None)  # filled the output: all within
    c = _result([0, 0, 0], answer_end=None)
    slices = {x.source: x for x in offline_slices([a, b, c], ["writing", "math", "writing"], k=3)}

    assert list(slices) == ["category writing", "category math", WITHIN_ANSWER, AFTER_ANSWER]
    writing = slices["category writing"]
    assert writing.num_drafts == 7 and writing.al == pytest.approx(1 + 7 / 7)
    assert writing.per_position_acceptance == pytest.approx((3 / 7, 2 / 7, 2 / 7))
    assert slices["category math"].al == 3.0
    within, after = slices[WITHIN_ANSWER], slices[AFTER_ANSWER]
    assert within.num_drafts == 7 and within.al == pytest.approx(1 + 10 / 7)
    assert after.num_drafts == 2 and after.al == 1.5 and after.per_position_acceptance == (0.5, 0.0, 0.0)
    assert answers_ending_early([a, b, c]) == 1


def test_no_answer_ending_early_gives_no_split():
    slices = offline_slices([_result([1, 2], None)], None, k=3)
    assert slices == ()
    with pytest.raises(ValueError, match="one per prompt"):
        offline_slices([_result([1], None)], ["a", "b"], k=3)


def test_an_empty_slice_is_nan_not_zero():
    # The answer ends at the very last token: nothing is drafted after it.
    r = _result([1, 1], answer_end=4)
    after = {x.source: x for x in offline_slices([r], ["coding"], k=2)}[AFTER_ANSWER]
    assert after.num_drafts == 0 and math.isnan(after.al)
