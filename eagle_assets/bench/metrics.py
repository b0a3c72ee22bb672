"""Speculative-decoding counters from a serving engine, and what they mean.

vLLM exports cumulative Prometheus counters on `GET /metrics` (see
`vllm/v1/spec_decode/metrics.py` in the engine):

    vllm:spec_decode_num_drafts_total{engine, model_name}           verification steps that carried a draft
    vllm:spec_decode_num_draft_tokens_total{engine, model_name}     draft tokens proposed
    vllm:spec_decode_num_accepted_tokens_total{engine, model_name}  draft tokens accepted
    vllm:spec_decode_num_accepted_tokens_per_pos_total{engine, model_name, position="k"}
                                                                    drafts whose token k (0-based) was accepted

Counters only grow, so the statistics of a piece of load are the difference of two scrapes, one
before and one after (`spec_stats_between`). Label sets (one per engine core, one per served
model name) are summed.

SGLang has no per-position counters; its `/generate` responses carry per-request statistics in
`meta_info` (`spec_verify_ct`, `spec_num_correct_drafts`, `spec_num_proposed_drafts`,
`spec_correct_drafts_histogram`, `spec_accept_length` = completion tokens / verify count), and its
OpenAI chat endpoint returns the same keys under `sglext.spec_tokens_details` when asked with
`return_spec_tokens_details`. `spec_stats_from_sglang` turns a list of those into the same
`SpecStats`.

Definitions used everywhere in the project (docs/design.md, "Metrics"):
    AL  (acceptance length)     = tokens emitted per target verification step = 1 + accepted / drafts
    draft acceptance rate       = accepted / draft tokens   (vLLM's "avg draft acceptance rate";
                                  AL 2.05 at K = 7 shows as 15 %)
    p_k (per-position)          = drafts whose k-th token was accepted / drafts   (k = 1..K)

Print a live server's counters so far (`counters_text`):

    eagle-assets show counters http://127.0.0.1:8000
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass

import httpx

from eagle_assets.http_client import auth_headers

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
SPEC_COUNTERS = (DRAFTS, DRAFT_TOKENS, ACCEPTED, ACCEPTED_PER_POS)

METRIC_DEFINITIONS: dict[str, str] = {
    "AL": "acceptance length: tokens emitted per target verification step = 1 + accepted / drafts",
    "draft_acceptance_rate": ("accepted draft tokens / proposed draft tokens (vLLM's 'avg draft acceptance rate'; AL 2.05 at K=7 shows as 15%)"),
    "p_k": "per-position acceptance: drafts whose k-th token was accepted / drafts (k = 1..K)",
    "speedup": (
        "output tokens/s with speculation / without, same prompts, same engine, same run (without: the mean "
        "of no speculation served first and last, where the run served it twice)"
    ),
    "host_drift": (
        "no speculation's tokens/s served last / served first: 1.00 on a steady host; ratios between the "
        "run's configurations are uncertain by about its distance from 1"
    ),
    "round_speedup": (
        "where the configurations were served interleaved in rounds of the same prompts: a round's tokens/s "
        "with speculation / without; their spread shows how far one run's ratio can move"
    ),
    "against_ngram": (
        "our drafter's tokens/s / n-gram speculation's, same prompts, same run (equal to the ratio of their "
        "speedups): above 1x, training the drafter paid over what needs no training"
    ),
    "control": (
        "an A/A control: no speculation served from a second server, interleaved with the rest; its tokens/s / "
        "the baseline's, 1.00x on a quiet host, is the run's noise floor"
    ),
    "k_schedule": (
        "the K drafted at each batch size (vLLM's num_speculative_tokens_per_batch_size), written FIRST-LAST:K; "
        "recommended: the K that served fastest at each concurrency measured, 0 where none beat no speculation"
    ),
    "k_schedule_confirmation": (
        "the recommended schedule served after the sweep beside no speculation and the fixed K it uses, same "
        "prompts: confirmed where its speedup is at least 95% of the fastest of them at every concurrency"
    ),
    "TTFT": "time to first token: request sent to first streamed output token",
    "ITL": "inter-token latency: gap between streamed chunks divided by the tokens each chunk carries",
    "tokens_per_s": "total output tokens of a concurrency level / wall time of that level (served in rounds: their sums)",
}
"""The metric definitions, stated in every report."""


# -- Prometheus text format ------------------------------------------------------------------

# name{labels} value [timestamp]; label values are quoted with \\, \" and \n escapes.
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True)
class Sample:
    """One line of a Prometheus text exposition."""

    name: str
    """Metric name as exposed, suffix included (`..._total`)."""
    labels: tuple[tuple[str, str], ...]
    """Label pairs in the order the server wrote them."""
    value: float


def _unescape(value: str) -> str:
    return value.replace("\\n", "\n").replace('\\"', '"').replace("\\\\", "\\")


def parse_prometheus(text: str) -> list[Sample]:
    """Every sample of a Prometheus text exposition; comments and blank lines are skipped.

    A line that is neither raises, naming its line number, since a half-read scrape would give
    wrong deltas silently.
    """
    samples = []
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise ValueError(f"/metrics line {lineno} is not a Prometheus sample: {line[:200]!r}")
        labels = []
        raw = m.group("labels") or ""
        pos = 0
        while pos < len(raw):
            lm = _LABEL.match(raw, pos)
            if lm is None:
                raise ValueError(f"/metrics line {lineno}: cannot read labels {raw!r}")
            labels.append((lm.group(1), _unescape(lm.group(2))))
            pos = lm.end()
        samples.append(Sample(m.group("name"), tuple(labels), float(m.group("value"))))
    return samples


# -- Counters and their deltas ---------------------------------------------------------------


@dataclass(frozen=True)
class SpecCounters:
    """Cumulative spec-decode counters of one scrape, summed over engines and model names."""

    present: bool
    """False when the server exports no spec-decode counters (it runs without speculation)."""
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()
    """Index k-1 holds the drafts whose k-th token was accepted (vLLM's `position="k-1"`)."""


def spec_counters_from_text(text: str, model: str | None = None) -> SpecCounters:
    """The spec-decode counters in a `/metrics` body.

    `model` keeps only samples whose `model_name` label equals it (all are summed when None).
    """
    totals = {DRAFTS: 0.0, DRAFT_TOKENS: 0.0, ACCEPTED: 0.0}
    per_pos: dict[int, float] = {}
    present = False
    for s in parse_prometheus(text):
        if s.name not in SPEC_COUNTERS:
            continue
        labels = dict(s.labels)
        if model is not None and labels.get("model_name", model) != model:
            continue
        present = True
        if s.name == ACCEPTED_PER_POS:
            try:
                k = int(labels["position"])
            except (KeyError, ValueError):
                raise ValueError(f"{ACCEPTED_PER_POS} sample without an integer position label: {labels}") from None
            per_pos[k] = per_pos.get(k, 0.0) + s.value
        else:
            totals[s.name] += s.value
    if per_pos and sorted(per_pos) != list(range(len(per_pos))):
        raise ValueError(f"{ACCEPTED_PER_POS} has gaps in its positions: {sorted(per_pos)}")
    return SpecCounters(
        present=present,
        drafts=round(totals[DRAFTS]),
        draft_tokens=round(totals[DRAFT_TOKENS]),
        accepted=round(totals[ACCEPTED]),
        accepted_per_pos=tuple(round(per_pos[k]) for k in range(len(per_pos))),
    )


def scrape(
    base_url: str,
    api_key: str | None = None,
    model: str | None = None,
    client: httpx.Client | None = None,
    timeout_s: float = 30.0,
) -> SpecCounters:
    """GET `{base_url}/metrics` and read the spec-decode counters (see `spec_counters_from_text`)."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        if client is None:
            resp = httpx.get(url, headers=auth_headers(api_key), timeout=timeout_s)
        else:
            resp = client.get(url, headers=auth_headers(api_key), timeout=timeout_s)
    except httpx.HTTPError as e:
        raise RuntimeError(f"could not scrape {url}: {e}. Is the server up and is the URL right?") from e
    if resp.status_code != 200:
        raise RuntimeError(
            f"{url} answered HTTP {resp.status_code}: {resp.text[:200]!r}. vLLM serves /metrics by "
            "default; a proxy in front of it must pass that path through."
        )
    return spec_counters_from_text(resp.text, model=model)


@dataclass(frozen=True)
class SpecStats:
    """Speculation statistics of one piece of load (the delta of two scrapes, or SGLang meta_info).

    AL = 1 + accepted / drafts; draft acceptance rate = accepted / draft_tokens;
    p_k = accepted_per_pos[k-1] / drafts.
    """

    drafts: int
    """Target verification steps that carried a draft (SGLang: `spec_verify_ct`)."""
    draft_tokens: int
    """Draft tokens proposed over those steps."""
    accepted: int
    """Draft tokens the target accepted (the bonus token is not counted)."""
    accepted_per_pos: tuple[int, ...] = ()
    """Index k-1: drafts whose k-th token was accepted. Length K; empty when the engine gives none."""
    engine_reported_al: float | None = None
    """The engine's own AL where it reports one (SGLang: completion tokens / verify count,
    which also counts the prefill's token and so reads a little above 1 + accepted / drafts)."""

    @property
    def al(self) -> float:
        """Acceptance length: 1 + accepted / drafts (NaN without drafts)."""
        return 1.0 + self.accepted / self.drafts if self.drafts else math.nan

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / draft_tokens (NaN without draft tokens)."""
        return self.accepted / self.draft_tokens if self.draft_tokens else math.nan

    @property
    def per_position_acceptance(self) -> list[float]:
        """p_k = accepted_per_pos[k-1] / drafts for k = 1..K."""
        if not self.drafts:
            return [math.nan] * len(self.accepted_per_pos)
        return [a / self.drafts for a in self.accepted_per_pos]

    @property
    def num_speculative_tokens(self) -> int | None:
        """K as the engine reports it (from the per-position counters), None if unknown."""
        return len(self.accepted_per_pos) or None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accepted_per_pos"] = list(self.accepted_per_pos)
        d.update(
            al=self.al,
            draft_acceptance_rate=self.draft_acceptance_rate,
            per_position_acceptance=self.per_position_acceptance,
        )
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "SpecStats":
        return cls(
            drafts=int(d["drafts"]),
            draft_tokens=int(d["draft_tokens"]),
            accepted=int(d["accepted"]),
            accepted_per_pos=tuple(int(x) for x in d.get("accepted_per_pos", ())),
            engine_reported_al=d.get("engine_reported_al"),
        )


def spec_stats_between(before: SpecCounters, after: SpecCounters) -> SpecStats | None:
    """What happened between two scrapes; None when the server exports no spec counters."""
    if not before.present and not after.present:
        return None
    if before.present != after.present:
        raise ValueError(
            "spec-decode counters appeared or vanished between two scrapes of the same server: the "
            "server was restarted or replaced during the run. Rerun the level."
        )
    per_pos_before = before.accepted_per_pos or (0,) * len(after.accepted_per_pos)
    if len(per_pos_before) != len(after.accepted_per_pos):
        raise ValueError(
            f"per-position counters changed length ({len(per_pos_before)} -> "
            f"{len(after.accepted_per_pos)}): the server was restarted with another K. Rerun the level."
        )
    delta = SpecStats(
        drafts=after.drafts - before.drafts,
        draft_tokens=after.draft_tokens - before.draft_tokens,
        accepted=after.accepted - before.accepted,
        accepted_per_pos=tuple(a - b for a, b in zip(after.accepted_per_pos, per_pos_before)),
    )
    if min((delta.drafts, delta.draft_tokens, delta.accepted, *delta.accepted_per_pos)) < 0:
        raise ValueError(
            f"spec-decode counters went down between scrapes ({before} -> {after}): the server restarted during the run. Rerun the level."
        )
    return delta


# -- SGLang ----------------------------------------------------------------------------------


def spec_stats_from_sglang(meta_infos: Iterable[Mapping]) -> SpecStats | None:
    """Aggregate SGLang per-request statistics into one `SpecStats`; None when none carried any.

    Each item is a `/generate` response's `meta_info` or a chat response's
    `sglang.spec_tokens_details` (SGLang 0.5.23 writes the same keys in both). Per request:
    `spec_verify_ct` = verification steps, `spec_num_correct_drafts` = accepted draft tokens,
    `spec_num_proposed_drafts` = verify steps x (draft tokens - 1), `completion_tokens`,
    `spec_correct_drafts_histogram[j]` = steps that accepted exactly j drafts (chain drafts: the
    k-th token was accepted in a step iff it accepted at least k, so count_k = sum_{j>=k} hist[j]).
    """
    drafts = draft_tokens = accepted = completion = 0
    hist: list[int] = []
    any_seen = False
    for i, meta in enumerate(meta_infos):
        verify = int(meta.get("spec_verify_ct") or 0)
        if verify <= 0:
            continue
        any_seen = True
        drafts += verify
        if meta.get("spec_num_correct_drafts") is not None:
            accepted += int(meta["spec_num_correct_drafts"])
        elif meta.get("spec_accept_length") is not None:
            # Older servers report only the ratio: completion / verify = 1 + accepted / verify.
            accepted += round((float(meta["spec_accept_length"]) - 1.0) * verify)
        else:
            raise ValueError(
                f"SGLang response {i} has spec_verify_ct={verify} but neither spec_num_correct_drafts "
                "nor spec_accept_length; ask /generate (meta_info) or chat with return_spec_tokens_details"
            )
        draft_tokens += int(meta.get("spec_num_proposed_drafts") or 0)
        completion += int(meta.get("completion_tokens") or round(float(meta.get("spec_accept_length", 0)) * verify))
        for j, n in enumerate(meta.get("spec_correct_drafts_histogram") or ()):
            if j >= len(hist):
                hist.extend([0] * (j + 1 - len(hist)))
            hist[j] += int(n)
    if not any_seen:
        return None
    # count_k = steps with at least k accepted, for k = 1..max seen; padded with zeros to K when
    # K = proposed / verify steps is known, so the list has one entry per draft position.
    per_pos = [sum(hist[k:]) for k in range(1, len(hist))]
    if hist and draft_tokens and draft_tokens % drafts == 0:
        per_pos += [0] * max(0, draft_tokens // drafts - len(per_pos))
    return SpecStats(
        drafts=drafts,
        draft_tokens=draft_tokens,
        accepted=accepted,
        accepted_per_pos=tuple(per_pos),
        engine_reported_al=completion / drafts if completion else None,
    )


def counters_text(base_url: str, api_key: str | None = None) -> str:
    """A live server's speculative-decoding counters so far, in two lines (one when it runs without
    speculation); a RuntimeError naming the URL when it cannot be scraped."""
    c = scrape(base_url, api_key)
    if not c.present:
        return "no spec-decode counters: the server runs without speculation"
    s = SpecStats(c.drafts, c.draft_tokens, c.accepted, c.accepted_per_pos)
    p = ", ".join(f"{x:.3f}" for x in s.per_position_acceptance)
    return f"drafts {s.drafts}  draft tokens {s.draft_tokens}  accepted {s.accepted}\nAL {s.al:.3f}  draft acceptance rate {s.draft_acceptance_rate:.1%}  p_k [{p}]"
