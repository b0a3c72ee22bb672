"""Pass/fail checks on benchmark results, as pure functions (asset checks wrap them).

    speedup_check(runs)              eagle3 tokens/s over baseline at concurrency 1 is above 1
    host_drift(runs)                 the last baseline's tokens/s over the first's, per concurrency
    round_speedups(runs)             each round's speedup, when the runs were served interleaved
    against(runs, "eagle3", NGRAM)   one run's tokens/s over another's (our drafter against n-gram;
                                     the A/A control against the baseline: the run's noise floor)
    parity_check(verdict)            served acceptance within tolerance of the offline reference
    parent_al_check(al, parent_al)   a warm-started drafter's AL is at least its parent's

Speedup = output tokens/s with speculation / without, same prompts, same engine, same run
(docs/design.md, "Metrics"): the two `ServedRun`s must share prompts, output length and model.
A run serves its configurations one after another, so a host whose speed drifts (a shared VM)
skews every ratio; serving no speculation again at the end (`BASELINE_END`) measures that drift,
and the speedups then compare with the mean of both baselines. Served interleaved in rounds
(`bench/interleaved.py`), the drift hits every configuration alike, and the spread of the
speedup from round to round says how far the ratio of a single run could move.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

from eagle_assets.bench.metrics import SpecStats
from eagle_assets.bench.parity import Verdict
from eagle_assets.bench.served import ServedRun

BASELINE = "baseline"
BASELINE_END = "baseline (end)"
"""No speculation, served again after every other configuration of the run."""
BASELINES = (BASELINE, BASELINE_END)
CONTROL = "baseline (control)"
"""No speculation from a second server of its own, served interleaved with the rest: an A/A
control, whose tokens/s over the baseline's is how far two identical servers read apart."""
NGRAM = "ngram"
"""vLLM's n-gram speculation: what a user serves without training a drafter."""


@dataclass(frozen=True)
class CheckResult:
    """One named pass/fail check with the numbers it looked at."""

    name: str
    passed: bool
    description: str
    """A sentence saying what was compared and what came out."""
    metadata: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "CheckResult":
        return cls(**d)


def _comparable(a: ServedRun, b: ServedRun) -> None:
    if (a.model, a.output_len, a.num_prompts) != (b.model, b.output_len, b.num_prompts):
        raise ValueError(
            f"runs {a.label!r} and {b.label!r} did not measure the same work (model, output_len, "
            f"prompts: {(a.model, a.output_len, a.num_prompts)} vs {(b.model, b.output_len, b.num_prompts)}); "
            "a speedup needs the same prompts and lengths on the same engine"
        )


def baseline_tokens_per_s(runs: Sequence[ServedRun], baseline: str = BASELINE) -> dict[int, float]:
    """Tokens/s without speculation per concurrency: `baseline`'s, or with `BASELINE_END` also
    served, the mean of the two, so the runs served between them compare with the host's speed
    over the whole run rather than at its start."""
    bases = [r for r in runs if r.label in (baseline, BASELINE_END)]
    if not any(r.label == baseline for r in bases):
        return {}
    for other in bases[1:]:
        _comparable(bases[0], other)
    out = {}
    for c in sorted({lv.concurrency for r in bases for lv in r.levels}):
        measured = [lv.tokens_per_s for r in bases if (lv := r.level(c)) is not None and lv.tokens_per_s > 0]
        if measured:
            out[c] = sum(measured) / len(measured)
    return out


def host_drift(runs: Sequence[ServedRun], baseline: str = BASELINE) -> dict[int, float]:
    """Per concurrency, `BASELINE_END`'s tokens/s over `baseline`'s: 1.0 on a steady host; the
    further from it, the less the ratios between this run's configurations can be trusted."""
    first = next((r for r in runs if r.label == baseline), None)
    last = next((r for r in runs if r.label == BASELINE_END), None)
    if first is None or last is None:
        return {}
    _comparable(first, last)
    return {
        lv.concurrency: lv.tokens_per_s / b.tokens_per_s
        for lv in last.levels
        if (b := first.level(lv.concurrency)) is not None and b.tokens_per_s > 0
    }


def round_speedups(runs: Sequence[ServedRun], baseline: str = BASELINE) -> dict[str, dict[int, tuple[float, ...]]]:
    """Per speculative run and concurrency, its tokens/s over `baseline`'s in each round the two
    were served interleaved in (the same prompts, one after the other); empty for runs served in
    one go."""
    base = next((r for r in runs if r.label == baseline), None)
    if base is None:
        return {}
    out: dict[str, dict[int, tuple[float, ...]]] = {}
    for run in runs:
        if run.label in BASELINES:
            continue
        _comparable(base, run)
        for lv in run.levels:
            b = base.level(lv.concurrency)
            if b is None or not lv.round_tokens_per_s or len(b.round_tokens_per_s) != len(lv.round_tokens_per_s):
                continue
            if min(b.round_tokens_per_s) > 0:
                out.setdefault(run.label, {})[lv.concurrency] = tuple(x / y for x, y in zip(lv.round_tokens_per_s, b.round_tokens_per_s))
    return out


def against(runs: Sequence[ServedRun], label: str, other: str) -> dict[int, tuple[float, tuple[float, ...]]]:
    """Per concurrency both served, `label`'s tokens/s over `other`'s (the ratio of their
    speedups: same prompts, same run), with the same ratio in each round where they were served
    interleaved (else no rounds). Empty when either is missing."""
    mine, theirs = (next((r for r in runs if r.label == x), None) for x in (label, other))
    if mine is None or theirs is None:
        return {}
    _comparable(mine, theirs)
    out = {}
    for lv in mine.levels:
        o = theirs.level(lv.concurrency)
        if o is None or not o.tokens_per_s > 0:
            continue
        rounds = lv.round_tokens_per_s, o.round_tokens_per_s
        paired = len(rounds[0]) == len(rounds[1]) and all(y > 0 for y in rounds[1])
        out[lv.concurrency] = (lv.tokens_per_s / o.tokens_per_s, tuple(x / y for x, y in zip(*rounds)) if paired else ())
    return out


def speedups(runs: Sequence[ServedRun], baseline: str = BASELINE) -> dict[str, dict[int, float]]:
    """tokens/s of every speculative run over no speculation's (`baseline_tokens_per_s`), per
    concurrency both measured."""
    base = next((r for r in runs if r.label == baseline), None)
    if base is None:
        return {}
    without = baseline_tokens_per_s(runs, baseline)
    out: dict[str, dict[int, float]] = {}
    for run in runs:
        if run.label in (baseline, BASELINE_END):
            continue
        _comparable(base, run)
        out[run.label] = {lv.concurrency: lv.tokens_per_s / without[lv.concurrency] for lv in run.levels if lv.concurrency in without}
    return out


def pooled_spec_stats(run: ServedRun) -> SpecStats | None:
    """The run's spec statistics summed over its concurrency levels (same prompts at each level)."""
    stats = [lv.spec for lv in run.levels if lv.spec is not None]
    if not stats:
        return None
    k = max(len(s.accepted_per_pos) for s in stats)
    per_pos = [sum(s.accepted_per_pos[i] for s in stats if i < len(s.accepted_per_pos)) for i in range(k)]
    return SpecStats(
        drafts=sum(s.drafts for s in stats),
        draft_tokens=sum(s.draft_tokens for s in stats),
        accepted=sum(s.accepted for s in stats),
        accepted_per_pos=tuple(per_pos),
    )


def speedup_check(
    runs: Sequence[ServedRun],
    label: str = "eagle3",
    baseline: str = BASELINE,
    concurrency: int = 1,
    min_speedup: float = 1.0,
) -> CheckResult:
    """Passes when `label`'s tokens/s over `baseline`'s at `concurrency` is above `min_speedup`."""
    name = f"speedup_above_{min_speedup:g}_at_concurrency_{concurrency}"
    ratio = speedups(runs, baseline).get(label, {}).get(concurrency)
    if ratio is None:
        have = sorted({r.label for r in runs})
        return CheckResult(
            name,
            False,
            f"no {label!r} and {baseline!r} measurements at concurrency {concurrency} to compare (runs: {have})",
            {"label": label, "baseline": baseline, "concurrency": concurrency},
        )
    passed = ratio > min_speedup
    return CheckResult(
        name,
        passed,
        f"{label} runs at {ratio:.2f}x the {baseline}'s output tokens/s at concurrency {concurrency} "
        f"({'above' if passed else 'not above'} {min_speedup:g}x)",
        {"speedup": ratio, "label": label, "baseline": baseline, "concurrency": concurrency, "min_speedup": min_speedup},
    )


def parity_check(verdict: Verdict | None) -> CheckResult:
    """Passes when served acceptance is within tolerance of the offline reference."""
    if verdict is None:
        return CheckResult("parity_within_tolerance", False, "no parity verdict: offline or served acceptance is missing")
    ev = verdict.evidence
    return CheckResult(
        "parity_within_tolerance",
        verdict.parity_ok,
        f"{verdict.verdict}: {verdict.sentence}",
        {
            "verdict": verdict.verdict,
            "offline_al": ev.get("offline", {}).get("al"),
            "served_al": ev.get("served", {}).get("al"),
            "al_diff": ev.get("al_diff"),
        },
    )


def greedy_output_check(check) -> CheckResult:
    """Passes when the drafter's served greedy output equals plain greedy, or parts from it only
    at near ties of the target (`bench/greedy_check.py`); a departure anywhere else is a defect."""
    return CheckResult(
        "greedy_output_equal",
        check.verdict != "defect",
        f"{check.verdict}: {check.sentence()}",
        {"verdict": check.verdict, "equal": check.equal, "prompts": check.prompts, "divergences": len(check.divergences)},
    )


def parent_al_check(al: float, parent_al: float | None, slack: float = 0.0) -> CheckResult:
    """Passes when a warm-started drafter's AL is at least its parent's (minus `slack`) on the
    same prompts; passes trivially, and says so, when no parent AL is given (a drafter trained
    from scratch, or a warm start whose parent was not benchmarked on these prompts: the trainer's
    not_worse_than_parent check compares the two on held-out corpus answers either way)."""
    name = "al_not_below_parent"
    if parent_al is None:
        return CheckResult(
            name,
            True,
            "no parent AL on these prompts to compare with (benchmark_report config parent_al)",
            {"al": al if math.isfinite(al) else None},
        )
    if not math.isfinite(al):
        return CheckResult(name, False, "the drafter's AL is not a number (no drafts measured)", {"al": None, "parent_al": parent_al})
    passed = al >= parent_al - slack
    return CheckResult(
        name,
        passed,
        f"AL {al:.3f} vs parent {parent_al:.3f}: {'not below' if passed else 'REGRESSED below'} the parent"
        + (f" (slack {slack:g})" if slack else ""),
        {"al": al, "parent_al": parent_al, "slack": slack},
    )
