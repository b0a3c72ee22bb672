"""The fine-tune against its parent: a paired comparison that keeps the better and fails only on a
drafter clearly worse than its parent, beyond the sampling error of its held-out samples."""

import numpy as np
import pytest

from eagle_assets.drafter.parent_gate import MIN_SAMPLES_FOR_WORSE, acceptance_length, compare_with_parent


def counts(rows: list[list[int]]) -> np.ndarray:
    """Per-sample replay counts [rounds, rounds accepting 1..K drafts]."""
    return np.asarray(rows, dtype=float)


# Four held-out samples at K=3 whose parent AL is 2.280 (32 accepted drafts over 25 rounds), and a
# fine-tune that accepts one draft fewer on one of them: 2.240.
PARENT_4 = counts([[6, 4, 2, 1], [7, 4, 3, 1], [6, 4, 2, 2], [6, 5, 3, 1]])
FINETUNE_4 = counts([[6, 4, 2, 1], [7, 4, 2, 1], [6, 4, 2, 2], [6, 5, 3, 1]])


def test_acceptance_length_pools_rounds_over_samples():
    assert acceptance_length(PARENT_4) == pytest.approx(2.28)
    assert acceptance_length(counts([[0, 0, 0, 0]])) == 1.0


def test_equal_counts_keep_the_fine_tune():
    c = compare_with_parent(PARENT_4, PARENT_4.copy())
    assert (c.verdict, c.kept, c.difference, c.low, c.high) == ("better", "fine-tune", 0.0, 0.0, 0.0)
    assert c.sentence().startswith("kept the fine-tune: fine-tune AL 2.280 against the parent's 2.280 (+0.000")


def test_a_fine_tune_slightly_worse_within_noise_keeps_the_parent_and_passes():
    c = compare_with_parent(PARENT_4, FINETUNE_4)
    assert c.verdict == "within_noise" and c.kept == "parent"
    assert c.difference == pytest.approx(-1 / 25) and c.low < c.difference <= c.high <= 0.0
    assert "kept the parent, which measured higher" in c.sentence() and "4 samples are too few to call it worse" in c.sentence()

    # Many samples, half a little better and half a little worse: lower on the whole, yet the
    # interval reaches above zero.
    parent = counts([[10, 8, 5, 3]] * 40)
    finetune = parent.copy()
    finetune[:, 1] += [-1] * 22 + [1] * 18
    c = compare_with_parent(parent, finetune)
    assert c.difference < 0 < c.high and c.verdict == "within_noise" and "within noise" in c.sentence()


def test_a_fine_tune_clearly_worse_fails_on_enough_samples_only():
    parent = counts([[10, 8, 5, 3]] * MIN_SAMPLES_FOR_WORSE)
    worse = counts([[10, 6, 3, 1]] * MIN_SAMPLES_FOR_WORSE)
    c = compare_with_parent(parent, worse)
    assert (c.verdict, c.kept) == ("worse", "parent") and c.high < 0
    assert "clearly worse than its parent" in c.sentence() and "The parent was kept in the exports" in c.sentence()
    # the same loss on fewer samples: lower, but too few to call it worse
    few = compare_with_parent(parent[:-1], worse[:-1])
    assert (few.verdict, few.kept) == ("within_noise", "parent")


def test_samples_without_a_round_are_left_out_and_bad_shapes_refused():
    with_empty = compare_with_parent(np.vstack([PARENT_4, np.zeros((3, 4))]), np.vstack([FINETUNE_4, np.zeros((3, 4))]))
    assert with_empty.samples == 4 and with_empty.difference == compare_with_parent(PARENT_4, FINETUNE_4).difference
    with pytest.raises(ValueError, match="same held-out samples, in the same order"):
        compare_with_parent(PARENT_4, FINETUNE_4[:3])
    with pytest.raises(ValueError, match="no held-out sample has a drafting round"):
        compare_with_parent(np.zeros((2, 4)), np.zeros((2, 4)))
