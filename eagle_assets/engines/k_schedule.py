"""The K to draft at each batch size: vLLM's dynamic speculative decoding schedule.

Speculation pays at low load and can cost at high load, where verifying K+1 tokens per request
competes with the other requests for compute (`benchmark_report` measures both). vLLM 0.32
takes a schedule in its speculative config, `num_speculative_tokens_per_batch_size`: a list of
inclusive batch-size ranges and the K each drafts at, where K 0 drafts nothing (the drafter
still runs its first forward over the new tokens, to keep its KV cache in step, so K 0 costs a
little more than serving without a drafter).

    KSchedule.parse("1-2:3,3-:0")       K 3 for batches of 1 or 2, none from 3 up
    schedule.vllm_entries()             [[1, 2, 3], [3, 4096, 0]]
    schedule_from_speedups({3: {1: 1.5, 8: 0.9}, 2: {1: 1.4, 8: 0.97}})   the K that served fastest per load

Pure: no engine import, so the pipeline, the CLI and the tests all read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPEN_END = 4096
"""The last batch size an open range ("3-") stands for: vLLM caps it at its max_num_seqs."""

SYNTAX = "FIRST-LAST:K ranges separated by commas, LAST left out on the last range for 'and up', e.g. 1-2:3,3-:0"


def _span(first: int, last: int) -> str:
    return f"{first}-" if last >= OPEN_END else str(first) if first == last else f"{first}-{last}"


@dataclass(frozen=True)
class KSchedule:
    """Inclusive batch-size ranges and the K drafted in each, from batch size 1 up, no gaps."""

    ranges: tuple[tuple[int, int, int], ...]
    """(first batch size, last batch size, K); the last range's end may be `OPEN_END`."""

    def __post_init__(self) -> None:
        problems = []
        if not self.ranges:
            problems.append("no ranges")
        expected_first = 1
        for first, last, k in self.ranges:
            if expected_first > OPEN_END:
                problems.append(f"the range {_span(first, last)} follows an open range, which takes every batch size from its start up")
            elif first != expected_first:
                problems.append(
                    f"the range {_span(first, last)} starts at {first}, not {expected_first}: "
                    "ranges start at batch size 1 and follow each other without gaps or overlaps"
                )
            if last < first:
                problems.append(f"the range {first}-{last} ends before it starts")
            if k < 0:
                problems.append(f"K {k} for batch sizes {_span(first, last)} is negative (0 drafts nothing)")
            expected_first = last + 1
        if self.ranges and all(k == 0 for _, _, k in self.ranges):
            problems.append("K is 0 at every batch size: serve without a drafter instead")
        if problems:
            raise ValueError(f"K schedule {self.text()!r}: " + "; ".join(problems) + f". Write it as {SYNTAX}")

    @classmethod
    def parse(cls, text: str) -> "KSchedule":
        """From "FIRST-LAST:K,..." ("5-:0" for 5 and up, "1:4" for batch size 1 alone)."""
        ranges = []
        for part in (p.strip() for p in text.split(",")):
            try:
                span, k = part.split(":")
                first, dash, last = span.partition("-")
                first_n = int(first)
                last_n = first_n if not dash else int(last) if last.strip() else OPEN_END
                ranges.append((first_n, last_n, int(k)))
            except ValueError:
                raise ValueError(f"K schedule {text!r}: cannot read {part!r}. Write it as {SYNTAX}") from None
        return cls(tuple(ranges))

    def text(self) -> str:
        """The form `parse` reads; an open last range is written "N-"."""
        return ",".join(f"{_span(first, last)}:{k}" for first, last, k in self.ranges)

    def describe(self) -> str:
        """In words: "K 3 at batch sizes 1-2, 0 from 3 up"."""

        def span(first: int, last: int) -> str:
            return f"from {first} up" if last >= OPEN_END else f"at batch size {first}" if first == last else f"at batch sizes {first}-{last}"

        return ", ".join(f"{'K ' if i == 0 else ''}{k} {span(first, last)}" for i, (first, last, k) in enumerate(self.ranges))

    @classmethod
    def of_config(cls, speculative: Mapping | None) -> "KSchedule | None":
        """The schedule in a vLLM speculative config, None for a fixed K."""
        entries = (speculative or {}).get("num_speculative_tokens_per_batch_size")
        return cls(tuple((int(a), int(b), int(k)) for a, b, k in entries)) if entries else None

    @property
    def max_k(self) -> int:
        """The config's `num_speculative_tokens`: vLLM drafts at most that many at any batch size."""
        return max(k for _, _, k in self.ranges)

    def k_at(self, batch_size: int) -> int:
        """K at `batch_size`; past the last range, the last range's K (as vLLM carries it on)."""
        for first, last, k in self.ranges:
            if first <= batch_size <= last:
                return k
        return self.ranges[-1][2]

    def vllm_entries(self) -> list[list[int]]:
        """`num_speculative_tokens_per_batch_size` as vLLM's config takes it."""
        return [[first, last, k] for first, last, k in self.ranges]


def schedule_from_speedups(speedups_by_k: Mapping[int, Mapping[int, float]]) -> KSchedule | None:
    """The K that served fastest at each measured concurrency, as a schedule; None where no K
    beat serving without speculation at any of them (serve without a drafter).

    `speedups_by_k[k][concurrency]` is the speedup served at K (over no speculation, same run).
    A concurrency level's batches hold up to that many requests, so level c covers the batch
    sizes above the level below it, up to c; the last level's K carries on above it. A level
    where every K ran below 1x gets K 0; ties go to the smaller K (fewer drafts to verify)."""
    levels = sorted({c for by_c in speedups_by_k.values() for c in by_c})
    chosen: list[tuple[int, int]] = []
    for c in levels:
        measured = sorted((-s, k) for k, by_c in speedups_by_k.items() if (s := by_c.get(c)) is not None)
        best_k = measured[0][1] if measured and -measured[0][0] > 1.0 else 0
        chosen.append((c, best_k))
    if not chosen or all(k == 0 for _, k in chosen):
        return None
    ranges: list[tuple[int, int, int]] = []
    first = 1
    for i, (c, k) in enumerate(chosen):
        last = OPEN_END if i == len(chosen) - 1 else c
        if ranges and ranges[-1][2] == k:
            ranges[-1] = (ranges[-1][0], last, k)
        else:
            ranges.append((first, last, k))
        first = last + 1
    return KSchedule(tuple(ranges))
