"""A fine-tuned drafter against its parent, on the same held-out samples, with their sampling error.

Both drafters' chain drafting is replayed along the same held-out answers
(`ttt.replay_drafting_per_sequence`): per sample, the rounds and the rounds whose first 1..K
drafts were accepted. AL = 1 + (accepted drafts) / (rounds), summed over the samples. An AL
measured on a few samples moves by several hundredths when one sample changes, so the difference
is judged against its own sampling error: the samples are drawn again with replacement, the same
draw for both drafters (a paired bootstrap), and the 95% interval of the difference read off.

    comparison = compare_with_parent(parent_counts, finetuned_counts)   # (n, K+1) arrays each
    comparison.kept      # "fine-tune" or "parent": whichever measured higher
    comparison.verdict   # "better", "within_noise" or "worse"

"worse" means clearly worse: the whole interval lies below zero, on at least MIN_SAMPLES_FOR_WORSE
samples (a handful of samples can all lean one way by chance). Pure code: numpy only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

BOOTSTRAP_DRAWS = 2000
CONFIDENCE = 0.95
MIN_SAMPLES_FOR_WORSE = 8
"""Fewer held-out samples than this never make a verdict of "worse": the parent is kept where it
measured higher, and the run goes on."""
AL_ROUNDING = 1e-6
"""ALs closer than this are equal (sums of the same counts in another order)."""


def acceptance_length(counts: np.ndarray) -> float:
    """AL of (n, K+1) per-sample counts [rounds, rounds accepting 1..K drafts]: 1 + accepted / rounds."""
    counts = np.asarray(counts, dtype=np.float64)
    rounds = counts[:, 0].sum()
    return 1.0 + (counts[:, 1:].sum() / rounds if rounds else 0.0)


@dataclass(frozen=True)
class ParentComparison:
    """The fine-tune against its parent on the same held-out samples."""

    parent_al: float
    finetuned_al: float
    difference: float
    """finetuned_al - parent_al."""
    low: float
    high: float
    """The 95% interval of the difference (paired bootstrap over the samples)."""
    samples: int
    verdict: str
    """"better" (measured at least as high), "within_noise" (lower, but the interval reaches zero,
    or too few samples to say) or "worse" (the whole interval below zero)."""

    @property
    def kept(self) -> str:
        """The drafter the run ships: the fine-tune unless the parent measured higher."""
        return "fine-tune" if self.verdict == "better" else "parent"

    def sentence(self) -> str:
        numbers = (
            f"fine-tune AL {self.finetuned_al:.3f} against the parent's {self.parent_al:.3f} ({self.difference:+.3f}; 95% interval "
            f"{self.low:+.3f} to {self.high:+.3f} over {self.samples} held-out samples)"
        )
        if self.verdict == "better":
            return f"kept the fine-tune: {numbers}"
        if self.verdict == "worse":
            return (
                f"the fine-tune is clearly worse than its parent: {numbers}. The parent was kept in the exports. A fine-tune "
                "that loses acceptance on its own corpus points at the data (another target, layers or tokenizer than the "
                "parent's) or at too high a learning rate"
            )
        few = f"; {self.samples} samples are too few to call it worse" if self.samples < MIN_SAMPLES_FOR_WORSE else ", within noise"
        return f"kept the parent, which measured higher: {numbers}{few}"

    def to_dict(self) -> dict:
        return {**asdict(self), "kept": self.kept, "sentence": self.sentence()}


def compare_with_parent(parent: np.ndarray, finetuned: np.ndarray, draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> ParentComparison:
    """Compare per-sample counts of the same held-out samples, in the same order: (n, K+1) each."""
    parent, finetuned = np.asarray(parent, dtype=np.float64), np.asarray(finetuned, dtype=np.float64)
    if parent.shape != finetuned.shape or parent.ndim != 2:
        raise ValueError(
            f"per-sample counts of shapes {parent.shape} and {finetuned.shape}: the comparison needs both drafters' counts on "
            "the same held-out samples, in the same order"
        )
    drafted = parent[:, 0] + finetuned[:, 0] > 0  # a sample with no round (no answer to draft along) says nothing
    parent, finetuned = parent[drafted], finetuned[drafted]
    if not len(parent):
        raise ValueError("no held-out sample has a drafting round: nothing to compare the two drafters on")
    n = parent.shape[0]
    parent_al, finetuned_al = acceptance_length(parent), acceptance_length(finetuned)
    difference = finetuned_al - parent_al
    picks = np.random.default_rng(seed).integers(0, n, size=(draws, n))  # (draws, n): the same draw for both

    def resampled_al(counts: np.ndarray) -> np.ndarray:
        rounds = counts[:, 0][picks].sum(axis=1)
        accepted = counts[:, 1:].sum(axis=1)[picks].sum(axis=1)
        return 1.0 + np.divide(accepted, rounds, out=np.zeros_like(accepted), where=rounds > 0)

    tail = (1.0 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(resampled_al(finetuned) - resampled_al(parent), [tail, 100 - tail])
    if difference >= -AL_ROUNDING:
        verdict = "better"
    elif high < 0 and n >= MIN_SAMPLES_FOR_WORSE:
        verdict = "worse"
    else:
        verdict = "within_noise"
    return ParentComparison(parent_al, finetuned_al, difference, float(low), float(high), n, verdict)
