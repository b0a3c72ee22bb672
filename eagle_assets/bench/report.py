"""The benchmark report: offline and served acceptance, their parity, throughput and speedup.

`build_report` gathers the served runs ("baseline", "eagle3", "ngram"), the offline reference
numbers and the parity verdict, and runs the checks; `write_report` writes

    report.md                 the report for people (tables, verdict, definitions, plots)
    report.json               the same data (`BenchmarkReport.to_dict`; `load_report` reads it)
    acceptance_per_position.png   p_k offline vs served (bars)
    throughput.png            output tokens/s against concurrency per configuration (lines)
    speedup.png               speedup over the baseline against concurrency (lines)

and `summary_text` gives a one-screen console summary. Print a saved report:

    eagle-assets show report path/to/report.json
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.bench.checks import (
    BASELINE,
    BASELINE_END,
    BASELINES,
    CONTROL,
    NGRAM,
    CheckResult,
    against,
    baseline_tokens_per_s,
    greedy_output_check,
    host_drift,
    parent_al_check,
    parity_check,
    pooled_spec_stats,
    round_speedups,
    speedup_check,
    speedups,
)
from eagle_assets.bench.greedy_check import GreedyCheck
from eagle_assets.bench.k_choice import (
    confirm,
    confirmation_dict,
    confirmation_lines,
    k_schedule_lines,
    k_schedule_summary,
    run_schedule,
    speedups_by_k,
)
from eagle_assets.bench.metrics import METRIC_DEFINITIONS, SpecStats
from eagle_assets.bench.parity import AcceptanceNumbers, ParityTolerance, TrainingFacts, Verdict, judge_parity
from eagle_assets.bench.plots import plot_acceptance, plot_speedup, plot_throughput
from eagle_assets.bench.served import ServedRun
from eagle_assets.durable import write_durably
from eagle_assets.engines.k_schedule import schedule_from_speedups

REPORT_MD = "report.md"
REPORT_JSON = "report.json"
SUMMARY_TXT = "summary.txt"
PLOT_ACCEPTANCE = "acceptance_per_position.png"
PLOT_THROUGHPUT = "throughput.png"
PLOT_SPEEDUP = "speedup.png"
DRIFT_WARNING = 0.10
"""A host whose speed without speculation moved more than this share during the run gets a warning."""


@dataclass(frozen=True)
class BenchmarkReport:
    """Everything the benchmark measured about one drafter on one target and engine."""

    target: str
    """Target name or fingerprint."""
    drafter: str
    """Drafter checkpoint (path or name) that was served."""
    engine: str
    """Serving engine ("vllm" or "sglang")."""
    runs: tuple[ServedRun, ...]
    """One served sweep per engine configuration, same prompts and lengths."""
    spec_label: str = "eagle3"
    """The run that serves this drafter (the others are baseline and comparisons)."""
    offline: AcceptanceNumbers | None = None
    """The reference decoder's acceptance on the same prompts."""
    served: AcceptanceNumbers | None = None
    """The engine's acceptance for `spec_label`, pooled over its concurrency levels."""
    offline_slices: tuple[AcceptanceNumbers, ...] = ()
    """The offline acceptance per prompt category and within / after the target's answer
    (`bench/breakdown.py`); each one's `source` names its slice."""
    parity: Verdict | None = None
    parent_al: float | None = None
    """AL of the parent drafter on the same prompts, when warm-started."""
    checks: tuple[CheckResult, ...] = ()
    speedups: dict[str, dict[int, float]] = field(default_factory=dict)
    """label -> concurrency -> tokens/s over the baseline's."""
    definitions: dict[str, str] = field(default_factory=lambda: dict(METRIC_DEFINITIONS))
    created_at: float = 0.0
    notes: tuple[str, ...] = ()
    training: TrainingFacts | None = None
    """The drafter's validation on its own corpus, from its training (absent for a bare export)."""
    confirmation: tuple[ServedRun, ...] = ()
    """Runs served after the sweep to confirm the recommended K schedule (`bench/k_choice.py`):
    no speculation, the fixed K it uses and the schedule, on the same prompts; empty when none was."""
    greedy_check: GreedyCheck | None = None
    """The drafter's served greedy output against plain greedy, token for token, and the
    target's margin where they part (`bench/greedy_check.py`); None when not checked."""
    prompt_set: str = ""
    """What the prompts were (MT-Bench's first turns, or a user's file), served and offline alike."""
    serving: str = ""
    """What served the runs, where the project launched them on a CPU: the processor's kind, the
    dtype and the kernels vLLM took (they differ by kind); empty where unknown."""

    def run(self, label: str) -> ServedRun | None:
        return next((r for r in self.runs if r.label == label), None)

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def k_schedule_dict(self) -> dict:
        """The speedup at each fixed K served and the K by batch size they recommend."""
        by_k = speedups_by_k(self.runs, self.speedups)
        schedule = schedule_from_speedups(by_k)
        return {
            "recommended": schedule.text() if schedule else None,
            "speedups_by_k": {str(k): {str(c): v for c, v in by_c.items()} for k, by_c in by_k.items()},
            "confirmation": confirmation_dict(self.confirmation),
        }

    def to_dict(self) -> dict:
        return _finite(
            {
                "target": self.target,
                "drafter": self.drafter,
                "engine": self.engine,
                "spec_label": self.spec_label,
                "runs": [r.to_dict() for r in self.runs],
                "offline": _asdict_or_none(self.offline),
                "served": _asdict_or_none(self.served),
                "offline_slices": [_asdict_or_none(x) for x in self.offline_slices],
                "parity": self.parity.to_dict() if self.parity else None,
                "parent_al": self.parent_al,
                "checks": [c.to_dict() for c in self.checks],
                "speedups": {k: {str(c): v for c, v in by_c.items()} for k, by_c in self.speedups.items()},
                "host_drift": {str(c): v for c, v in host_drift(self.runs).items()},
                "round_speedups": {k: {str(c): list(v) for c, v in by_c.items()} for k, by_c in round_speedups(self.runs).items()},
                "against_ngram": {
                    str(c): {"ratio": r, "rounds": list(rounds)} for c, (r, rounds) in against(self.runs, self.spec_label, NGRAM).items()
                },
                "control": {str(c): {"ratio": r, "rounds": list(rounds)} for c, (r, rounds) in against(self.runs, CONTROL, BASELINE).items()},
                "k_schedule": self.k_schedule_dict(),
                "definitions": dict(self.definitions),
                "created_at": self.created_at,
                "notes": list(self.notes),
                "prompt_set": self.prompt_set,
                "serving": self.serving,
                "training": self.training.to_dict() if self.training else None,
                "confirmation_runs": [r.to_dict() for r in self.confirmation],
                "greedy_check": self.greedy_check.to_dict() if self.greedy_check else None,
            }
        )

    @classmethod
    def from_dict(cls, d: Mapping) -> "BenchmarkReport":
        return cls(
            target=d["target"],
            drafter=d["drafter"],
            engine=d["engine"],
            spec_label=d.get("spec_label", "eagle3"),
            runs=tuple(ServedRun.from_dict(_nan_back(r)) for r in d["runs"]),
            offline=AcceptanceNumbers.from_dict(d["offline"]) if d.get("offline") else None,
            served=AcceptanceNumbers.from_dict(d["served"]) if d.get("served") else None,
            offline_slices=tuple(AcceptanceNumbers.from_dict(x) for x in d.get("offline_slices", ())),
            parity=Verdict.from_dict(d["parity"]) if d.get("parity") else None,
            parent_al=d.get("parent_al"),
            checks=tuple(CheckResult.from_dict(c) for c in d.get("checks", ())),
            speedups={k: {int(c): float(v) for c, v in by_c.items()} for k, by_c in d.get("speedups", {}).items()},
            definitions=dict(d.get("definitions", METRIC_DEFINITIONS)),
            created_at=float(d.get("created_at", 0.0)),
            notes=tuple(d.get("notes", ())),
            prompt_set=d.get("prompt_set", ""),
            serving=d.get("serving", ""),
            training=TrainingFacts.from_dict(d["training"]) if d.get("training") else None,
            confirmation=tuple(ServedRun.from_dict(_nan_back(r)) for r in d.get("confirmation_runs", ())),
            greedy_check=GreedyCheck.from_dict(d["greedy_check"]) if d.get("greedy_check") else None,
        )


def _asdict_or_none(x: AcceptanceNumbers | None) -> dict | None:
    if x is None:
        return None
    return {"al": x.al, "per_position_acceptance": list(x.per_position_acceptance), "num_drafts": x.num_drafts, "source": x.source}


def _finite(obj):
    """NaN and inf become None: the JSON stays standard (readable by any parser)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _nan_back(run: Mapping) -> dict:
    """Latency distributions written as None (no samples) read back as NaN."""
    run = dict(run)
    levels = []
    for lv in run["levels"]:
        lv = dict(lv)
        for key in ("ttft_s", "itl_s"):
            lv[key] = {k: (math.nan if v is None else v) for k, v in lv[key].items()}
        for key in ("tokens_per_s", "requests_per_s", "tokens_per_chunk"):
            lv[key] = math.nan if lv[key] is None else lv[key]
        levels.append(lv)
    run["levels"] = levels
    return run


def build_report(
    target: str,
    drafter: str,
    runs: Sequence[ServedRun],
    offline: AcceptanceNumbers | None = None,
    offline_slices: Sequence[AcceptanceNumbers] = (),
    engine: str = "vllm",
    spec_label: str = "eagle3",
    parity: Verdict | None = None,
    parent_al: float | None = None,
    tolerance: ParityTolerance = ParityTolerance(),
    drafter_path: str | Path | Mapping | None = None,
    trained_aux_layer_ids: Sequence[int] | None = None,
    target_num_layers: int | None = None,
    min_speedup: float = 1.0,
    notes: Sequence[str] = (),
    training: TrainingFacts | None = None,
    confirmation: Sequence[ServedRun] = (),
    greedy_check: GreedyCheck | None = None,
    prompt_set: str = "",
    serving: str = "",
) -> BenchmarkReport:
    """Put the runs, offline numbers and verdict together and run the checks.

    The served acceptance is `spec_label`'s spec statistics pooled over its levels. The parity
    verdict is computed here (`judge_parity`, with `drafter_path` for config evidence) unless
    given. The parent check compares the offline AL (served when there is no offline) with
    `parent_al`.
    """
    labels = [r.label for r in runs]
    if len(set(labels)) != len(labels):
        raise ValueError(f"two served runs share a label: {labels}; give each configuration its own")
    spec_run = next((r for r in runs if r.label == spec_label), None)
    pooled = pooled_spec_stats(spec_run) if spec_run else None
    served = AcceptanceNumbers.from_spec_stats(pooled, f"served {engine}") if pooled and pooled.drafts else None
    if parity is None and offline is not None and served is not None:
        parity = judge_parity(
            offline,
            served,
            tolerance,
            drafter=drafter_path,
            engine=engine,
            trained_aux_layer_ids=trained_aux_layer_ids,
            target_num_layers=target_num_layers,
            training=training,
        )
    checks = [speedup_check(runs, spec_label, BASELINE, 1, min_speedup), parity_check(parity)]
    if greedy_check is not None:
        checks.append(greedy_output_check(greedy_check))
    own_al = offline.al if offline is not None else (served.al if served is not None else math.nan)
    checks.append(parent_al_check(own_al, parent_al))
    return BenchmarkReport(
        target=target,
        drafter=str(drafter),
        engine=engine,
        runs=tuple(runs),
        spec_label=spec_label,
        offline=offline,
        served=served,
        offline_slices=tuple(offline_slices),
        parity=parity,
        parent_al=parent_al,
        checks=tuple(checks),
        speedups=speedups(runs, BASELINE),
        created_at=time.time(),
        notes=tuple(notes),
        training=training,
        confirmation=tuple(confirmation),
        greedy_check=greedy_check,
        prompt_set=prompt_set,
        serving=serving,
    )


# -- Text ------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else fmt.format(x)


def _ms(x: float | None) -> str:
    return _f(None if x is None else x * 1e3, "{:.1f}")


def _level_rows(report: BenchmarkReport) -> list[list[str]]:
    rows = []
    # Served twice, no speculation is the reference through the mean of both, not either one.
    baseline_cell = "mean = 1.00x" if report.run(BASELINE_END) else "1.00x"
    concurrencies = sorted({lv.concurrency for r in report.runs for lv in r.levels})
    for c in concurrencies:
        for run in report.runs:
            lv = run.level(c)
            if lv is None:
                continue
            spec = lv.spec
            rows.append(
                [
                    str(c),
                    run.label,
                    _f(lv.tokens_per_s, "{:.1f}"),
                    _f(lv.requests_per_s, "{:.3f}"),
                    _ms(lv.ttft_s["mean"]),
                    _ms(lv.ttft_s["p50"]),
                    _ms(lv.ttft_s["p90"]),
                    _ms(lv.itl_s["mean"]),
                    _ms(lv.itl_s["p50"]),
                    _ms(lv.itl_s["p90"]),
                    _f(spec.al if spec else None),
                    _f(spec.draft_acceptance_rate if spec else None, "{:.1%}"),
                    _f(report.speedups.get(run.label, {}).get(c), "{:.2f}x") if run.label not in BASELINES else baseline_cell,
                ]
            )
    return rows


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def to_markdown(report: BenchmarkReport, plots: Mapping[str, str] | None = None) -> str:
    """The report as Markdown; `plots` maps plot names to paths relative to the Markdown file."""
    plots = plots or {}
    base = report.run(BASELINE)
    first = report.runs[0] if report.runs else None
    out = [f"# Benchmark report: {report.drafter}", ""]
    out += [
        f"- target: `{report.target}`",
        f"- engine: {report.engine}; served configurations: {', '.join(r.label for r in report.runs) or 'none'}",
    ]
    if first:
        out.append(
            f"- load: {first.num_prompts} prompts, greedy, exactly {first.output_len} output tokens each, "
            f"concurrency {', '.join(str(lv.concurrency) for lv in first.levels)}"
        )
    if report.prompt_set:
        out.append(f"- prompts: {report.prompt_set}")
    if report.serving:
        out.append(f"- {report.serving}")
    ks = [f"{r.label} {'by batch size' if run_schedule(r) else k}" for r in report.runs if (k := draft_tokens_per_step(r)) is not None]
    if ks:
        out.append(f"- draft tokens per step (K): {', '.join(ks)}; parity and checks at `{report.spec_label}`'s")
    out.append(f"- created: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(report.created_at))}")
    out.append("")

    if report.parity:
        p = report.parity
        out += [f"## Verdict: `{p.verdict}`", "", p.sentence, ""]
        if p.causes:
            out += ["Check, most likely first:", ""] + [f"1. {c}" for c in p.causes] + [""]
        cfg = p.evidence.get("drafter_config") or {}
        if cfg:
            out += ["Drafter config values read:", "", _table(["key", "value"], [[k, f"`{json.dumps(v)}`"] for k, v in cfg.items()]), ""]
    if report.greedy_check:
        g = report.greedy_check
        out += [f"## Greedy output under speculation: `{g.verdict}`", "", g.sentence(), ""]

    if report.checks:
        out += [
            "## Checks",
            "",
            _table(["check", "result", "detail"], [[c.name, "pass" if c.passed else "FAIL", c.description] for c in report.checks]),
            "",
        ]

    out += ["## Acceptance", ""]
    if report.offline or report.served:
        k = max(len(x.per_position_acceptance) for x in (report.offline, report.served) if x)
        rows = []
        validation = report.training.validation if report.training else None
        measured = (
            ("training validation (held-out corpus answers, replayed)", validation),
            ("offline (reference decoder)", report.offline),
            (f"served ({report.spec_label})", report.served),
        )
        for name, x in measured:
            if x is None:
                continue
            pk = [_f(x.per_position_acceptance[i]) if i < len(x.per_position_acceptance) else "-" for i in range(k)]
            rows.append([name, _f(x.al), _f(x.num_drafts, "{:d}") if x.num_drafts is not None else "-", *pk])
        out += [_table(["", "AL", "drafts", *[f"p_{i + 1}" for i in range(k)]], rows), ""]
        if report.training:
            out += [
                f"From the drafter's training: {report.training.describe()}. It walks the corpus's own answers "
                "at the training K, so it reads above live decoding; far above the offline AL means these "
                "prompts are unlike the training data.",
                "",
            ]
            if report.training.origin:
                out += [f"The drafter served: {report.training.origin}.", ""]
    else:
        out += ["No acceptance measured (no speculative run with drafts, no offline numbers).", ""]
    if others := other_served_al(report):
        out += ["Other speculative runs, from the engine's counters: " + "; ".join(others) + ".", ""]
    if report.offline_slices:
        k = max(len(x.per_position_acceptance) for x in report.offline_slices)
        rows = [
            [x.source, _f(x.al), _f(x.num_drafts, "{:d}") if x.num_drafts is not None else "-", *[_f(p) for p in x.per_position_acceptance]]
            for x in report.offline_slices
        ]
        out += [
            "### Offline acceptance by slice",
            "",
            "Where the reference decoder's drafts fail: per prompt category, and within the target's answer "
            "against after its end-of-answer token (the benchmark ignores EOS, so a shorter answer runs on "
            "into text no training answer contains).",
            "",
            _table(["slice", "AL", "drafts", *[f"p_{i + 1}" for i in range(k)]], rows),
            "",
        ]
    if report.parent_al is not None:
        out += [f"Parent drafter AL (warm start): {report.parent_al:.2f}", ""]
    if PLOT_ACCEPTANCE in plots:
        out += [f"![per-position acceptance]({plots[PLOT_ACCEPTANCE]})", ""]

    out += ["## Throughput and latency per concurrency", ""]
    if base is None:
        out += ["No `baseline` run: speedups cannot be computed.", ""]
    out += [
        _table(
            [
                "conc.",
                "config",
                "tok/s",
                "req/s",
                "TTFT mean ms",
                "TTFT p50",
                "TTFT p90",
                "ITL mean ms",
                "ITL p50",
                "ITL p90",
                "AL",
                "draft acc.",
                "speedup",
            ],
            _level_rows(report),
        ),
        "",
    ]
    if report.speedups:
        labels = list(report.speedups)
        cs = sorted({c for v in report.speedups.values() for c in v})
        out += [
            "### Speedup over no speculation",
            "",
            _table(["concurrency", *labels], [[str(c), *[_f(report.speedups[l].get(c), "{:.2f}x") for l in labels]] for c in cs]),
            "",
        ]
    if drift_lines := host_drift_lines(report):
        out += [
            "### Host drift",
            "",
            "No speculation was served first and again last; its tokens/s last over first:",
            "",
            *[f"- {line}" for line in drift_lines],
            "",
        ]
    if round_lines := round_speedup_lines(report):
        out += [
            "### Speedup from round to round",
            "",
            "The configurations were served interleaved, in rounds of the same prompts with the order rotated, "
            "so a change in the host's speed hits them alike; each round's speedup:",
            "",
            *[f"- {line}" for line in round_lines],
            "",
        ]
    if control_lines := _ratio_lines(report, CONTROL, BASELINE):
        out += [
            "### Noise floor: the A/A control",
            "",
            "No speculation was also served from a second server of its own, interleaved like the rest: its "
            "tokens/s over the baseline's is how far two identical servers read apart in this run. Ratios between "
            "configurations no further from each other than that are not told apart.",
            "",
            *[f"- {line}" for line in control_lines],
            "",
        ]
    if ngram_lines := _ratio_lines(report, report.spec_label, NGRAM):
        out += [
            f"### {report.spec_label} against n-gram",
            "",
            "What training the drafter bought over vLLM's n-gram speculation, which needs none: "
            f"{report.spec_label}'s tokens/s over n-gram's in the same run.",
            "",
            *[f"- {line}" for line in ngram_lines],
            "",
        ]
    fastest = fastest_per_concurrency(report)
    if fastest:
        out += ["### Fastest configuration per concurrency", "", *[f"- {line}" for line in fastest], ""]
    if k_lines := k_schedule_lines(report.drafter, report.runs, report.speedups, confirmed=bool(report.confirmation)):
        out += ["### K to serve at each load", "", *[f"- {line}" for line in k_lines], ""]
    if confirm_lines := confirmation_lines(report.confirmation):
        runs = report.confirmation
        cs = sorted({lv.concurrency for r in runs for lv in r.levels})
        rows = [[str(c), *[_f(lv.tokens_per_s, "{:.1f}") if (lv := r.level(c)) else "-" for r in runs]] for c in cs]
        out += [
            "### The recommended K schedule, served to confirm it",
            "",
            *[f"- {line}" for line in confirm_lines],
            "",
            "Tokens/s of the confirming runs:",
            "",
            _table(["concurrency", *[r.label for r in runs]], rows),
            "",
        ]
    for name, alt in ((PLOT_THROUGHPUT, "throughput"), (PLOT_SPEEDUP, "speedup")):
        if name in plots:
            out += [f"![{alt}]({plots[name]})", ""]

    out += ["## Definitions", ""] + [f"- **{k}**: {v}" for k, v in report.definitions.items()] + [""]
    if report.notes:
        out += ["## Notes", ""] + [f"- {n}" for n in report.notes] + [""]
    return "\n".join(out)


def draft_tokens_per_step(run: ServedRun) -> int | None:
    """The K a run served with (from its speculative config); None without speculation."""
    spec = (run.config or {}).get("speculative") or {}
    k = spec.get("num_speculative_tokens")
    return int(k) if k is not None else None


def drafted_share(run: ServedRun, stats: SpecStats | None) -> float | None:
    """Share of the run's decode steps that drafted, given `stats`, the run's spec statistics
    pooled over its levels. Each streamed chunk is one engine step of one request and a request's
    first chunk comes from its prefill, which drafts nothing. n-gram drafts only where the context
    repeats, so its AL (over drafts) alone overstates it."""
    steps = sum(lv.output_tokens / lv.tokens_per_chunk - lv.num_requests for lv in run.levels if lv.tokens_per_chunk > 0)
    if stats is None or not steps > 0:
        return None
    return min(1.0, stats.drafts / steps)


def other_served_al(report: BenchmarkReport) -> list[str]:
    """AL from the engine's counters of every speculative run but `spec_label`'s, pooled over its
    levels, with the share of steps it drafted at."""
    out = []
    for run in report.runs:
        pooled = pooled_spec_stats(run) if run.label != report.spec_label else None
        if pooled and pooled.drafts:
            share = drafted_share(run, pooled)
            drafted = f"; drafted at {share:.0%} of steps" if share is not None else ""
            out.append(f"{run.label} {pooled.al:.2f} (p_k {', '.join(f'{p:.2f}' for p in pooled.per_position_acceptance)}{drafted})")
    return out


def host_drift_lines(report: BenchmarkReport) -> list[str]:
    """Per concurrency, how far the host's speed without speculation moved between the run's
    first and last server, with a warning where it moved more than `DRIFT_WARNING`."""
    lines = []
    for c, drift in sorted(host_drift(report.runs).items()):
        line = f"concurrency {c}: {drift:.2f}x"
        if abs(drift - 1) > DRIFT_WARNING:
            line += (
                f" - the host's speed moved {abs(drift - 1):.0%} during the run: ratios between its "
                "configurations at this load are uncertain by about as much; rerun on a quieter host, or "
                "interleaved (--interleave 10, interleave_rounds: 10) where the servers fit in memory at once"
            )
        lines.append(line)
    return lines


def round_speedup_lines(report: BenchmarkReport) -> list[str]:
    """Per speculative run and concurrency served interleaved: the level's speedup and the
    lowest and highest of its rounds'."""
    lines = []
    for label, by_c in round_speedups(report.runs).items():
        for c, ratios in sorted(by_c.items()):
            whole = report.speedups.get(label, {}).get(c)
            lines.append(
                f"{label} at concurrency {c}: {_f(whole, '{:.2f}x')} over the level, rounds {min(ratios):.2f}x "
                f"to {max(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})"
            )
    return lines


def _ratio_lines(report: BenchmarkReport, label: str, other: str) -> list[str]:
    """Per concurrency, `label`'s tokens/s over `other`'s, with its rounds' lowest and highest."""
    lines = []
    for c, (ratio, rounds) in sorted(against(report.runs, label, other).items()):
        spread = f" (rounds {min(rounds):.2f}x to {max(rounds):.2f}x)" if rounds else ""
        lines.append(f"concurrency {c}: {ratio:.2f}x{spread}")
    return lines


def _ratio_summary(report: BenchmarkReport, label: str, other: str) -> str:
    """`_ratio_lines` in one line of the console summary ("" when either run is missing)."""
    return "; ".join(
        f"c={c} {ratio:.2f}x" + (f" (rounds {min(rounds):.2f}-{max(rounds):.2f}x)" if rounds else "")
        for c, (ratio, rounds) in sorted(against(report.runs, label, other).items())
    )


def fastest_per_concurrency(report: BenchmarkReport) -> list[str]:
    """Per measured concurrency, the configuration with the most output tokens/s, and by how
    much it beats the runner-up: what to serve at that load (speculation pays at low load and
    can cost at high load, where verification competes with other requests for compute).
    No speculation counts once, at `baseline_tokens_per_s` (the mean, when served twice)."""
    without = baseline_tokens_per_s(report.runs)
    lines = []
    for c in sorted({lv.concurrency for r in report.runs for lv in r.levels}):
        measured = [(lv.tokens_per_s, r.label) for r in report.runs if r.label not in (*BASELINES, CONTROL) and (lv := r.level(c)) is not None]
        if c in without:
            measured.append((without[c], BASELINE))
        # Ties go to no speculation: the simpler deployment.
        measured.sort(key=lambda m: (m[0], m[1] == BASELINE), reverse=True)
        if len(measured) < 2 or not measured[1][0] > 0:
            continue
        (best, label), (second, other) = measured[0], measured[1]
        name = "no speculation" if label == BASELINE else label
        lines.append(f"concurrency {c}: {name} ({best:.1f} tok/s, {best / second:.2f}x {other})")
    return lines


def summary_text(report: BenchmarkReport) -> str:
    """A one-screen console summary: verdict, checks, acceptance and the speedup table."""
    spec_run = report.run(report.spec_label)
    k = draft_tokens_per_step(spec_run) if spec_run else None
    lines = [f"benchmark: {report.drafter} on {report.target} ({report.engine}{f', K={k}' if k else ''})"]
    if report.prompt_set:
        lines.append(f"prompts: {report.prompt_set}")
    if report.serving:
        lines.append(report.serving)
    if report.parity:
        lines.append(f"verdict: {report.parity.verdict} - {report.parity.sentence}")
    if report.greedy_check:
        lines.append(f"greedy output: {report.greedy_check.verdict} - {report.greedy_check.sentence()}")
    if report.offline or report.served:

        def fmt(x: AcceptanceNumbers | None) -> str:
            if x is None:
                return "-"
            return f"AL {_f(x.al)}  p_k [{', '.join(_f(p) for p in x.per_position_acceptance)}]"

        if report.training:
            lines.append(f"trained: {fmt(report.training.validation)} (held-out corpus answers, replayed)")
            if report.training.origin:
                lines.append(f"drafter: {report.training.origin}")
        lines.append(f"offline: {fmt(report.offline)}")
        lines.append(f"served : {fmt(report.served)}")
    if others := other_served_al(report):
        lines.append(f"served AL of the other runs: {'; '.join(others)}")
    header = f"{'conc':>4}  " + "  ".join(f"{r.label:>16}" for r in report.runs)
    lines += ["tokens/s (speedup):", header]
    for c in sorted({lv.concurrency for r in report.runs for lv in r.levels}):
        cells = []
        for r in report.runs:
            lv = r.level(c)
            s = report.speedups.get(r.label, {}).get(c)
            cells.append(
                f"{'-' if lv is None else f'{lv.tokens_per_s:.1f}':>9} ({_f(s, '{:.2f}x'):>5})"
                if r.label not in BASELINES
                else f"{'-' if lv is None else f'{lv.tokens_per_s:.1f}':>16}"
            )
        lines.append(f"{c:>4}  " + "  ".join(cells))
    if drift_lines := host_drift_lines(report):
        lines.append("host drift (no speculation, last / first): " + "; ".join(drift_lines))
    if rounds := round_speedups(report.runs):
        lines.append(
            "speedup by round, lowest-highest: "
            + "; ".join(
                f"{label} " + ", ".join(f"c={c} {min(v):.2f}-{max(v):.2f}x" for c, v in sorted(by_c.items())) for label, by_c in rounds.items()
            )
        )
    if ngram := _ratio_summary(report, report.spec_label, NGRAM):
        lines.append(f"{report.spec_label} over n-gram (tok/s): {ngram}")
    if control := _ratio_summary(report, CONTROL, BASELINE):
        lines.append(f"A/A control (a second server without speculation, over the first): {control}")
    fastest = fastest_per_concurrency(report)
    if fastest:
        lines.append("fastest: " + "; ".join(fastest))
    if k_line := k_schedule_summary(report.runs, report.speedups):
        lines.append(k_line)
    if confirmation := confirm(report.confirmation):
        lines.append(
            f"K schedule {confirmation.schedule.text()} served after the sweep: "
            f"{'confirmed' if confirmation.confirmed else 'NOT confirmed'}; "
            + "; ".join(f"c={lv.concurrency} K{lv.k} {lv.speedup:.2f}x ({lv.fastest} {lv.fastest_speedup:.2f}x)" for lv in confirmation.levels)
        )
    for ch in report.checks:
        lines.append(f"[{'pass' if ch.passed else 'FAIL'}] {ch.name}: {ch.description}")
    lines.append(
        "AL = 1 + accepted/drafts; draft acceptance = accepted/drafted; speedup = tok/s with / without speculation"
        + (" (without: the mean of its first and last run)" if report.run(BASELINE_END) else "")
    )
    return "\n".join(lines)


# -- Files -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportPaths:
    """Files `write_report` produced."""

    markdown: Path
    json: Path
    summary: Path
    """`summary_text` of the report: what `make run` prints at its end."""
    plots: dict[str, Path]


def _write_text_atomic(path: Path, text: str) -> Path:
    write_durably(path, text.encode("utf-8"))  # a full disk: DiskFull naming the path, the old file kept
    return path


def write_report(report: BenchmarkReport, out_dir: str | Path) -> ReportPaths:
    """Write the plots, `report.json`, `summary.txt` and `report.md` (last, so its presence means complete)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    plots: dict[str, Path] = {}
    acc = {}
    if report.offline and report.offline.per_position_acceptance:
        acc["offline"] = report.offline.per_position_acceptance
    if report.served and report.served.per_position_acceptance:
        acc["served"] = report.served.per_position_acceptance
    if acc:
        plots[PLOT_ACCEPTANCE] = plot_acceptance(acc, out / PLOT_ACCEPTANCE, f"Per-position acceptance: {report.spec_label}")
    if report.runs:
        plots[PLOT_THROUGHPUT] = plot_throughput(report.runs, out / PLOT_THROUGHPUT)
    if any(report.speedups.values()):
        plots[PLOT_SPEEDUP] = plot_speedup(report.speedups, out / PLOT_SPEEDUP)
    json_path = _write_text_atomic(out / REPORT_JSON, json.dumps(report.to_dict(), indent=2, allow_nan=False))
    summary_path = _write_text_atomic(out / SUMMARY_TXT, summary_text(report) + "\n")
    md = to_markdown(report, {name: p.name for name, p in plots.items()})
    md_path = _write_text_atomic(out / REPORT_MD, md)
    return ReportPaths(markdown=md_path, json=json_path, summary=summary_path, plots=plots)


def load_report(path: str | Path) -> BenchmarkReport:
    """Read a `report.json` (or the folder holding it)."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_JSON
    try:
        return BenchmarkReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (KeyError, TypeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not a benchmark report written by write_report: {e}") from e
