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

Each configuration's round is kept on disk as it finishes (`bench/progress.py`), with its own
speculation counters' delta: a level interrupted by a dying server resumes at its next round
on a server started again, and its rounds still add up.

Only one server works at a time: the others sit idle, holding their memory.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from eagle_assets.bench.metrics import SpecStats
from eagle_assets.bench.progress import Measurements
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
    base_url: str | None
    """None for a configuration whose every round an earlier run kept (nothing is sent to it)."""
    model: str | None
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
    kept: Measurements | None = None,
    phase: str = "sweep",
) -> list[ServedRun]:
    """One `ServedRun` per target, in the order given, each level served in `rounds` rounds
    interleaved with the other targets'; `progress` gets a line per round (default: the log).

    With `kept`, each target's round is kept on disk as soon as it is served, under `phase`, and
    a round an earlier run kept is read back instead of served again. A target whose every
    round is kept is asked nothing (its `base_url` and `model` may be None: the kept rounds say)."""
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
    plans = {c: round_prompts(len(msgs), c, rounds) for c in settings.concurrencies}
    to_serve = [t for t in targets if kept is None or not all(kept.has(phase, t.label, c, r) for c, plan in plans.items() for r in range(len(plan)))]
    for t in to_serve:
        warm_up(t.base_url, t.model, msgs, settings, t.api_key)
    levels: dict[str, list] = {t.label: [] for t in targets}
    described: dict[str, Mapping] = {}  # each target's run as its kept rounds describe it
    for c, plan in plans.items():
        served: list[list[RequestResult]] = [[] for _ in targets]
        walls = [[0.0] * len(plan) for _ in targets]
        specs: list[list[SpecStats | None]] = [[None] * len(plan) for _ in targets]
        before: dict[int, object] = {}  # each target's counters since its last round
        for r, chosen in enumerate(plan):
            for i in round_order(len(targets), r):
                t = targets[i]
                earlier = kept.round(phase, t.label, c, r, chosen) if kept is not None else None
                if earlier is not None:
                    results, wall, spec = earlier["requests"], earlier["wall_s"], earlier["spec"]
                    began = min(earlier["run"]["started_at"], described.get(t.label, earlier["run"])["started_at"])
                    described[t.label] = {**earlier["run"], "started_at": began}  # the latest server, the first start
                else:
                    if i not in before:
                        before[i] = settled_counters(t.base_url, t.api_key, t.model, settings)
                    results, wall = send_prompts(t.base_url, t.model, [msgs[j] for j in chosen], c, settings, t.api_key, chosen)
                    after = settled_counters(t.base_url, t.api_key, t.model, settings)
                    # Per round, so that a round kept from a server since restarted adds up too.
                    spec, before[i] = spec_between(before[i], after, results, settings), after
                    if kept is not None:
                        kept.save_round(phase, t.label, c, r, chosen, results, wall, spec, _description(t, settings, len(msgs), started))
                served[i] += results
                walls[i][r] = wall
                specs[i][r] = spec
            rates = ", ".join(f"{t.label} {len(chosen) * settings.output_len / w[r]:.1f}" for t, w in zip(targets, walls))
            progress(f"concurrency {c}, round {r + 1}/{len(plan)} ({len(chosen)} prompts): {rates} tok/s")
        for i, t in enumerate(targets):
            per_round = [len(chosen) * settings.output_len / w for chosen, w in zip(plan, walls[i])]
            spec = _level_spec(specs[i], served[i], settings)
            levels[t.label].append(level_result(c, sorted(served[i], key=lambda x: x.prompt_index), sum(walls[i]), settings, spec, per_round))
    runs = []
    for t in targets:
        run, earlier = _description(t, settings, len(msgs), started), described.get(t.label)
        if earlier:  # the run began then; a target not served again is where it was then
            run.update(started_at=earlier["started_at"], **{k: earlier[k] for k in ("model", "base_url") if run[k] is None})
        runs.append(ServedRun(label=t.label, levels=tuple(levels[t.label]), **run))
    return runs


def _description(target: ServedTarget, settings: SweepSettings, num_prompts: int, started: float) -> dict:
    """What a `ServedRun` says of its run besides its label and levels."""
    return {
        "engine": settings.engine,
        "model": target.model,
        "base_url": target.base_url,
        "output_len": settings.output_len,
        "num_prompts": num_prompts,
        "started_at": started,
        "config": dict(target.config),
    }


def _level_spec(rounds: Sequence[SpecStats | None], results: Sequence[RequestResult], settings: SweepSettings) -> SpecStats | None:
    """A level's speculation statistics from its rounds': vLLM's counter deltas add up (None
    without speculation); SGLang's come from the requests themselves."""
    if settings.engine != "vllm":
        return spec_between(None, None, results, settings)
    present = [s for s in rounds if s is not None]
    if not present:
        return None
    k = max(len(s.accepted_per_pos) for s in present)
    return SpecStats(
        drafts=sum(s.drafts for s in present),
        draft_tokens=sum(s.draft_tokens for s in present),
        accepted=sum(s.accepted for s in present),
        accepted_per_pos=tuple(sum(s.accepted_per_pos[j] for s in present if j < len(s.accepted_per_pos)) for j in range(k)),
    )
