"""Which K to serve at which load, from the K the benchmark served the drafter at.

The sweep serves the drafter at K (and at each `also_k`) on the same prompts at every
concurrency; `speedups_by_k` gathers those speedups, and `schedule_from_speedups`
(`engines/k_schedule.py`) turns the fastest K per level into a schedule vLLM serves by batch
size. `k_schedule_lines` says it in the report, with the config to deploy and the command that
serves it beside the rest to confirm it; `k_schedule_summary` in one line of the console summary.

With `confirm_schedule`, the benchmark serves the recommended schedule after the sweep, beside
no speculation and the fixed K it uses (`confirmation_configs`), and `confirm` says per level
whether it served as fast as the fastest of them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from eagle_assets.bench.checks import BASELINE, BASELINE_END, speedups
from eagle_assets.bench.served import ServedRun
from eagle_assets.engines.k_schedule import KSchedule, schedule_from_speedups
from eagle_assets.engines.vllm_launch import speculative_config


def _speculative(run: ServedRun) -> dict:
    return (run.config or {}).get("speculative") or {}


def run_schedule(run: ServedRun) -> KSchedule | None:
    """The K schedule a run was served with; None for one K, or no speculation."""
    return KSchedule.of_config(_speculative(run))


def fixed_k(run: ServedRun) -> int | None:
    """The K of an EAGLE-3 run served at one K for every batch (None for the others)."""
    spec = _speculative(run)
    if spec.get("method") != "eagle3" or run_schedule(run) is not None:
        return None
    return int(spec["num_speculative_tokens"])


def speedups_by_k(runs: Sequence[ServedRun], speedups: Mapping[str, Mapping[int, float]]) -> dict[int, dict[int, float]]:
    """K -> concurrency -> speedup of the drafter's runs at one fixed K each."""
    return {k: dict(speedups[run.label]) for run in runs if (k := fixed_k(run)) is not None and run.label in speedups}


def k_schedule_summary(runs: Sequence[ServedRun], speedups: Mapping[str, Mapping[int, float]]) -> str | None:
    """The console summary's line on what to serve at each load (None when the drafter served at no fixed K)."""
    by_k = speedups_by_k(runs, speedups)
    if not by_k:
        return None
    schedule = schedule_from_speedups(by_k)
    if schedule is None:
        advice = "none (no K beat no speculation): serve without the drafter"
    elif len(schedule.ranges) == 1:
        advice = f"K={schedule.max_k} at every load measured (no schedule needed)"
    else:
        advice = f"{schedule.text()} ({schedule.describe()}; serve with --k-schedule {schedule.text()})"
    return f"K by batch size, fastest per load: {advice}"


def k_schedule_lines(drafter: str, runs: Sequence[ServedRun], speedups: Mapping[str, Mapping[int, float]], confirmed: bool = False) -> list[str]:
    """The report's lines on what to serve at each load (none when the drafter served at no fixed K);
    `confirmed`: the benchmark served the recommendation after the sweep, so no command to confirm it."""
    by_k = speedups_by_k(runs, speedups)
    if not by_k:
        return []
    measured = ", ".join(f"K={k}" for k in sorted(by_k))
    schedule = schedule_from_speedups(by_k)
    if schedule is None:
        return [f"No K measured ({measured}) served faster than no speculation at any concurrency: serve without the drafter."]
    if len(schedule.ranges) == 1:
        among = f" of {measured}" if len(by_k) > 1 else ""
        return [
            f"K={schedule.max_k} served fastest{among} at every concurrency measured, above no speculation: serve "
            f"it at every batch size (`-k {schedule.max_k}`), no schedule needed."
        ]
    config = speculative_config(drafter, schedule.max_k, schedule)
    lines = [
        f"The fastest of {measured} at each concurrency, as vLLM's K by batch size: `{schedule.text()}` "
        f"({schedule.describe()}). A level at concurrency c covers the batch sizes above the level below it, up "
        "to c; K 0 still runs the drafter's first forward (it keeps its KV cache in step), so it costs a little "
        "more than no drafter.",
        f"vLLM: `--speculative-config '{json.dumps(config)}'`",
    ]
    if not any(run_schedule(run) for run in runs) and not confirmed:
        lines.append(
            f"Serve it beside the others to confirm it: `eagle-assets bench --drafter {drafter} --k-schedule "
            f"{schedule.text()}` (its run is `eagle3 k={schedule.text()}`), or have the benchmark serve it after "
            "the sweep: `--confirm-schedule` (`confirm_schedule: true`)."
        )
    return lines


SCHEDULE_MARGIN = 0.05
"""A schedule is confirmed at a level where it serves at least (1 - this) x the tokens/s of the
fastest of no speculation and the fixed K it uses, served beside it on the same prompts."""


def recommended_schedule(runs: Sequence[ServedRun]) -> KSchedule | None:
    """The schedule the drafter's fixed-K runs recommend (None: no K beat no speculation)."""
    return schedule_from_speedups(speedups_by_k(runs, speedups(runs)))


def fixed_k_label(k: int, main_k: int) -> str:
    """A fixed-K run's label, as the sweep names it: `eagle3` at the benchmark's K, else `eagle3 k=N`."""
    return "eagle3" if k == main_k else f"eagle3 k={k}"


def schedule_label(schedule: KSchedule) -> str:
    """A run by batch size's label, as the sweep names it: `eagle3 k=1:3,2-:0`."""
    return f"eagle3 k={schedule.text()}"


def confirmation_configs(schedule: KSchedule, main_k: int, drafter: str | Path, baseline_again: bool) -> list[tuple[str, dict | None]]:
    """(label, speculative config) of the runs that confirm `schedule`: no speculation, each K
    above 0 it drafts at, the schedule itself, and no speculation again where the runs are served
    one after another and `baseline_again` (the host's drift)."""
    configs: list[tuple[str, dict | None]] = [(BASELINE, None)]
    configs += [(fixed_k_label(k, main_k), speculative_config(drafter, k)) for k in sorted({k for _, _, k in schedule.ranges if k})]
    configs.append((schedule_label(schedule), speculative_config(drafter, schedule.max_k, schedule)))
    if baseline_again:
        configs.append((BASELINE_END, None))
    return configs


@dataclass(frozen=True)
class LevelConfirmation:
    """One concurrency level of a schedule's confirmation."""

    concurrency: int
    k: int
    """The K the schedule drafts at a batch of this many requests."""
    speedup: float
    """The schedule's tokens/s over no speculation's, in the confirming runs."""
    fastest: str
    """The fastest of no speculation and the fixed K served beside it ("no speculation", "eagle3", ...)."""
    fastest_speedup: float

    @property
    def confirmed(self) -> bool:
        return self.speedup >= self.fastest_speedup * (1 - SCHEDULE_MARGIN)

    def describe(self) -> str:
        return (
            f"concurrency {self.concurrency}: K {self.k}, {self.speedup:.2f}x against {self.fastest}'s "
            f"{self.fastest_speedup:.2f}x ({'confirmed' if self.confirmed else 'NOT confirmed'})"
        )


@dataclass(frozen=True)
class ScheduleConfirmation:
    """A schedule served to confirm it, and how it served at each level."""

    schedule: KSchedule
    levels: tuple[LevelConfirmation, ...]

    @property
    def confirmed(self) -> bool:
        """Within `SCHEDULE_MARGIN` of the fastest at every level."""
        return all(lv.confirmed for lv in self.levels)


def confirm(runs: Sequence[ServedRun]) -> ScheduleConfirmation | None:
    """The schedule served in `runs` (the confirming runs) and, per level, how it served against
    the fastest of no speculation and the fixed K beside it; None when no run served a schedule."""
    schedule_run = next((r for r in runs if run_schedule(r) is not None), None)
    if schedule_run is None:
        return None
    schedule = run_schedule(schedule_run)
    by_label = speedups(runs)
    levels = []
    for c, speedup in sorted(by_label.get(schedule_run.label, {}).items()):
        rivals = [(1.0, "no speculation")] + [(s[c], r.label) for r in runs if fixed_k(r) is not None and c in (s := by_label.get(r.label, {}))]
        best, name = max(rivals, key=lambda x: x[0])
        levels.append(LevelConfirmation(c, schedule.k_at(c), speedup, name, best))
    return ScheduleConfirmation(schedule, tuple(levels))


def confirmation_lines(runs: Sequence[ServedRun]) -> list[str]:
    """The report's lines on a schedule's confirmation (none when none was served)."""
    confirmation = confirm(runs)
    if confirmation is None:
        return []
    verdict = (
        "confirmed: within {:.0%} of the fastest at every level"
        if confirmation.confirmed
        else "not confirmed: slower than the fastest by more than {:.0%} at some level"
    ).format(SCHEDULE_MARGIN)
    lines = [
        f"`{confirmation.schedule.text()}` served after the sweep, beside no speculation and the fixed K it uses, on the same prompts: {verdict}.",
        *[lv.describe() for lv in confirmation.levels],
    ]
    if any(lv.k == 0 and not lv.confirmed for lv in confirmation.levels):
        lines.append(
            "At K 0 the drafter's first forward still runs over every new token: where that costs more than the "
            "margin, that load is served faster by a server without the drafter than by any schedule."
        )
    return lines


def confirmation_dict(runs: Sequence[ServedRun]) -> dict | None:
    """The confirmation for report.json (None when none was served)."""
    confirmation = confirm(runs)
    if confirmation is None:
        return None
    return {
        "schedule": confirmation.schedule.text(),
        "confirmed": confirmation.confirmed,
        "margin": SCHEDULE_MARGIN,
        "levels": [
            {
                "concurrency": lv.concurrency,
                "k": lv.k,
                "speedup": lv.speedup,
                "fastest": lv.fastest,
                "fastest_speedup": lv.fastest_speedup,
                "confirmed": lv.confirmed,
            }
            for lv in confirmation.levels
        ],
    }
