"""Served sweeps of several configurations at once, interleaved in rounds.

Served one after another, configurations meet the host at different times: on a shared VM
whose speed drifts within minutes, that skews every speedup by as much (the
baseline served again at the end, `BASELINE_END`, only measures the drift). Here every
configuration has its own server, all up together, and each concurrency level is split into
rounds of the same prompts:

    round 1: baseline, eagle3, ngram      (prompts 0, 5, 10, ...)
    round 2: eagle3, ngram, baseline      (prompts 1, 6, 11, ...)
    round 3: ngram, baseline, eagle3      (prompts 2, 7, 12, ...) ...

A slow spell then hits every configuration's share of the work alike, and the order rotates so
none is always served first (after an idle spell) or last. A round takes every n-th prompt, so
each holds a like share of every kind of prompt (MT-Bench's come category by category, and
n-gram's speedup, for one, differs widely between categories): the rounds then
differ by the host's speed, not by their content. A configuration's level adds up its
rounds' requests and wall times, so its tokens/s is still output tokens / time serving them;
each round's tokens/s is kept as well, so the report can show how far the speedup moved from
round to round (`bench/checks.py: round_speedups`).

Only one server works at a time: the others sit idle, holding their memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eagle_assets.bench.served import (
    RequestResult,
    ServedRun,
    SweepSettings,
    as_messages,
    level_result,
    refuse_too_few_prompts,
    send_prompts,
    settled_counters,
    spec_between,
    warm_up,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServedTarget:
    """One configuration's server, as the sweep addresses it."""

    label: str
    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    config: Mapping = field(default_factory=dict)


def round_prompts(num_prompts: int, concurrency: int, rounds: int) -> list[range]:
    """The prompts of each round at one level: every `rounds`-th, from a different start in
    each round; fewer rounds when one would hold fewer prompts than `concurrency` keeps in flight."""
    refuse_too_few_prompts(num_prompts, (concurrency,), f"{num_prompts} prompts")
    n = max(1, min(rounds, num_prompts // concurrency))
    return [range(r, num_prompts, n) for r in range(n)]


def round_order(num_configs: int, round_index: int) -> list[int]:
    """Which configuration each round serves first, second, ...: rotated by one per round."""
    return [(round_index + i) % num_configs for i in range(num_configs)]


def run_interleaved(
    targets: Sequence[ServedTarget],
    prompts: Sequence[str | Sequence[Mapping]],
    settings: SweepSettings,
    rounds: int,
    progress: Callable[[str], None] | None = None,
) -> list[ServedRun]:
    """One `ServedRun` per target, in the order given, each level served in `rounds` rounds
    interleaved with the other targets'; `progress` gets a line per round (default: the log)."""
    progress = progress or log.info
    if rounds < 1:
        raise ValueError(f"rounds={rounds}: serve in at least one round")
    if len({t.label for t in targets}) != len(targets):
        raise ValueError(f"labels {[t.label for t in targets]} repeat: give each configuration its own")
    msgs = [as_messages(p) for p in prompts]
    if not msgs:
        raise ValueError("no prompts to send: give at least one")
    refuse_too_few_prompts(len(msgs), settings.concurrencies, f"{len(msgs)} prompts")  # before any warm-up request
    started = time.time()
    for t in targets:
        warm_up(t.base_url, t.model, msgs, settings, t.api_key)
    levels: dict[str, list] = {t.label: [] for t in targets}
    for c in settings.concurrencies:
        plan = round_prompts(len(msgs), c, rounds)
        before = [settled_counters(t.base_url, t.api_key, t.model, settings) for t in targets]
        served: list[list[RequestResult]] = [[] for _ in targets]
        walls: list[list[float]] = [[] for _ in targets]
        for r, chosen in enumerate(plan):
            for i in round_order(len(targets), r):
                t = targets[i]
                results, wall = send_prompts(t.base_url, t.model, [msgs[j] for j in chosen], c, settings, t.api_key, chosen)
                served[i] += results
                walls[i].append(wall)
            rates = ", ".join(f"{t.label} {len(chosen) * settings.output_len / w[-1]:.1f}" for t, w in zip(targets, walls))
            progress(f"concurrency {c}, round {r + 1}/{len(plan)} ({len(chosen)} prompts): {rates} tok/s")
        for i, t in enumerate(targets):
            after = settled_counters(t.base_url, t.api_key, t.model, settings)
            per_round = [len(chosen) * settings.output_len / w for chosen, w in zip(plan, walls[i])]
            spec = spec_between(before[i], after, served[i], settings)
            levels[t.label].append(level_result(c, sorted(served[i], key=lambda x: x.prompt_index), sum(walls[i]), settings, spec, per_round))
    return [
        ServedRun(label=t.label, engine=settings.engine, model=t.model, base_url=t.base_url, output_len=settings.output_len,
                  num_prompts=len(msgs), levels=tuple(levels[t.label]), started_at=started, config=dict(t.config))  # fmt: skip
        for t in targets
    ]
