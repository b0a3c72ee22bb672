"""Which K to serve at which load, from the K the benchmark served the drafter at.

The sweep serves the drafter at K (and at each `also_k`) on the same prompts at every
concurrency; `speedups_by_k` gathers those speedups, and `schedule_from_speedups`
(`engines/k_schedule.py`) turns the fastest K per level into a schedule vLLM serves by batch
size. `k_schedule_lines` says it in the report, with the config to deploy and the command that
serves it beside the rest to confirm it; `k_schedule_summary` in one line of the console summary.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

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


def k_schedule_lines(drafter: str, runs: Sequence[ServedRun], speedups: Mapping[str, Mapping[int, float]]) -> list[str]:
    """The report's lines on what to serve at each load (none when the drafter served at no fixed K)."""
    by_k = speedups_by_k(runs, speedups)
    if not by_k:
        return []
    measured = ", ".join(f"K={k}" for k in sorted(by_k))
    schedule = schedule_from_speedups(by_k)
    if schedule is None:
        return [f"No K measured ({measured}) served faster than no speculation at any concurrency: serve without the drafter."]
    if len(schedule.ranges) == 1:
        among = f" of {measured}" if len(by_k) > 1 else ""
        return [f"K={schedule.max_k} served fastest{among} at every concurrency measured, above no speculation: serve "
                f"it at every batch size (`-k {schedule.max_k}`), no schedule needed."]  # fmt: skip
    config = speculative_config(drafter, schedule.max_k, schedule)
    lines = [f"The fastest of {measured} at each concurrency, as vLLM's K by batch size: `{schedule.text()}` "
             f"({schedule.describe()}). A level at concurrency c covers the batch sizes above the level below it, up "
             "to c; K 0 still runs the drafter's first forward (it keeps its KV cache in step), so it costs a little "
             "more than no drafter.",
             f"vLLM: `--speculative-config '{json.dumps(config)}'`"]  # fmt: skip
    if not any(run_schedule(run) for run in runs):
        lines.append(f"Serve it beside the others to confirm it: `eagle-assets bench --drafter {drafter} --k-schedule "
                     f"{schedule.text()}` (its run is `eagle3 k={schedule.text()}`).")  # fmt: skip
    return lines
