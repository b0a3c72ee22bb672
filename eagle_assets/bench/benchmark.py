"""One whole benchmark of a drafter: offline reference, served sweeps, parity, report.

    report, paths = run_benchmark(settings, target_path, drafter_dir, serve, out_dir)

`serve(speculative)` is a context-manager factory giving a server for a speculative config
(None = no speculation); the Dagster asset passes its InferenceServer resource, tests pass
`engines.serving.launch_vllm`. The same prompts go to the offline reference decoder and to
the served configurations of one run (`served_configs`): baseline, our EAGLE-3 drafter at K
(and at each `also_k`, to find the K to deploy; with `k_schedule`, at a K that follows the
batch size), vLLM's n-gram speculation (what a user would pick without training), and the
baseline again, which measures the host's drift over the run (`bench/checks.py`). With
`interleave_rounds` (by default, where every server fits at once), all of them are up at once
and each level is served in rounds that alternate between them (`bench/interleaved.py`), so
that drift cancels out instead of being measured. With `confirm_schedule`, the K schedule the
fixed K recommend is served after the sweep, to confirm it (`bench/k_choice.py`).

Where one host holds one target server at a time, a benchmark may be measured in parts: `serve`
raises `ServerUnavailable` for a configuration no server is given for now, the others are
measured and kept, and `BenchmarkIncomplete` says what is left; a rerun with the other server
measures the rest and writes the report. The offline reference replayed over the engine's
states then comes from the capture the hidden-state stage's extraction server made
(`bench/reference_states.py`), so no extraction server is needed here.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack, closing, contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Callable, ContextManager, Iterator, Mapping, Sequence

import httpx
import numpy as np
import torch

from eagle_assets.bench.breakdown import answers_ending_early, offline_slices
from eagle_assets.bench.checks import BASELINE, BASELINE_END, CONTROL, NGRAM
from eagle_assets.bench.greedy_check import GreedyCheck, check_against, greedy_tokens
from eagle_assets.bench.interleaved import ServedTarget, round_prompts, run_interleaved
from eagle_assets.bench.k_choice import confirmation_configs, fixed_k_label, recommended_schedule, run_schedule, schedule_label
from eagle_assets.bench.parity import AcceptanceNumbers, TrainingFacts
from eagle_assets.bench.progress import Measurements, files_digest
from eagle_assets.bench.reference_decoder import Result, speculative_generate
from eagle_assets.bench.reference_states import BenchmarkReference
from eagle_assets.bench.replay_reference import replay_reference
from eagle_assets.bench.report import BenchmarkReport, build_report, write_report
from eagle_assets.bench.served import (
    ServedRequestError,
    ServedRun,
    SweepSettings,
    mt_bench_set,
    run_served,
)
from eagle_assets.bench.settings import BenchmarkSettings
from eagle_assets.drafter.export import drafter_folder_config, load_drafter
from eagle_assets.drafter.target_head import read_target_embedding
from eagle_assets.engines.cpu_isa import host_cpu
from eagle_assets.engines.host_memory import available_memory_bytes
from eagle_assets.engines.logs import engine_kernels
from eagle_assets.engines.process import ServerFailed
from eagle_assets.engines.serving import replica_numbers
from eagle_assets.engines.vllm_launch import ngram_config, speculative_config
from eagle_assets.hidden_states.engine_extract import EngineStateClient
from eagle_assets.precision import use_exact_fp32


class ServerUnavailable(RuntimeError):
    """Raised by a benchmark's `serve` for a configuration no server is given for now (a server of
    the user's that is not up at this time): the benchmark measures the others and keeps them."""


class BenchmarkIncomplete(RuntimeError):
    """Some configurations had no server this time; what was measured is kept for the rerun."""

    def __init__(self, message: str, missing: Sequence[str]):
        super().__init__(message)
        self.missing = list(missing)


# Rounds per level when the benchmark chooses. On all 80 MT-Bench turns, which come category
# by category in tens, a round of every 10th prompt holds one turn of each category, and at
# concurrency 8 it is one batch; shorter rounds cancel faster drift (two servers of one config
# read closer over more rounds).
DEFAULT_INTERLEAVE_ROUNDS = 10


def served_configs(settings: BenchmarkSettings, drafter_dir: Path) -> list[tuple[str, dict | None]]:
    """(label, vLLM speculative config) of each served run, in the order they are served."""
    configs: list[tuple[str, dict | None]] = [(BASELINE, None)]
    if settings.control and settings.interleave_rounds:
        configs.append((CONTROL, None))
    configs += [(fixed_k_label(k, settings.k), speculative_config(drafter_dir, k)) for k in (settings.k, *settings.also_k)]
    if settings.k_schedule is not None:
        configs.append((schedule_label(settings.k_schedule), speculative_config(drafter_dir, settings.k, settings.k_schedule)))
    if settings.ngram:
        configs.append((NGRAM, ngram_config(settings.k)))
    if settings.baseline_again and not settings.interleave_rounds:
        configs.append((BASELINE_END, None))
    return configs


def interleaving(
    settings: BenchmarkSettings, drafter_dir: Path, why_not_at_once: Callable[[list[dict | None]], str | None] | None
) -> tuple[BenchmarkSettings, str | None]:
    """The settings with `interleave_rounds` decided, and the report's note on how the
    configurations were served. As asked, or (None) `DEFAULT_INTERLEAVE_ROUNDS` where
    `why_not_at_once(specs)` finds no reason their servers cannot all be up together (no such
    function: nothing known against it), else one after another, saying why."""
    chosen = settings.interleave_rounds
    why = None
    if chosen is None:
        specs = [spec for _, spec in served_configs(replace(settings, interleave_rounds=1), drafter_dir)]
        why = why_not_at_once(specs) if why_not_at_once else None
        chosen = 0 if why else DEFAULT_INTERLEAVE_ROUNDS
    if chosen:
        note = (
            f"configurations served interleaved: all servers up at once, each concurrency level in up to {chosen} "
            "rounds of the same prompts, the order rotated every round"
        )
        if settings.interleave_rounds is None:
            note += " (the default where every server fits at once)"
    elif why:
        note = (
            f"configurations served one after another, not interleaved: {why}"
            + ("; the baseline is served again at the end, to measure the host's drift" if settings.baseline_again else "")
            + ("; the A/A control, which needs interleaving, was not served" if settings.control else "")
        )
    else:
        note = None
    return replace(settings, interleave_rounds=chosen, control=settings.control and bool(chosen)), note


def offline_results(
    target_path: Path,
    drafter_dir: Path,
    prompts: Sequence[Sequence[dict]],
    settings: BenchmarkSettings,
    log: Callable[[str], None] = print,
    device: str = "cpu",
    kept: Measurements | None = None,
    trust_remote_code: bool = False,
) -> list[Result]:
    """The reference decoder's result on each prompt (its tokens and accepted drafts per step).

    fp32 on any device, as the CPU engine serves; on CUDA without TF32, for the same reason.
    With `kept`, each prompt's result is kept on disk as it is decoded, and those an earlier
    run kept are read back instead (the models are not even loaded when all are)."""
    chosen = list(prompts)[: settings.offline_prompts or len(prompts)]
    rows = kept.offline()[: len(chosen)] if kept is not None else []
    results = [_result_from_row(row) for row in rows]
    if results:
        log(f"offline reference: {len(results)} of {len(chosen)} prompts kept from an earlier run")
    if len(results) == len(chosen):
        return results
    from eagle_assets.corpus.target import load_tokenizer
    from eagle_assets.hidden_states.extract import causal_lm_class

    tokenizer = load_tokenizer(target_path, trust_remote_code=trust_remote_code)
    use_exact_fp32(device)
    target = (
        causal_lm_class(target_path, trust_remote_code)
        .from_pretrained(target_path, dtype=torch.float32, trust_remote_code=trust_remote_code)
        .to(device)
        .eval()
    )
    drafter, _ = load_drafter(drafter_dir, dtype=torch.float32)
    drafter.to(device).eval()
    with torch.no_grad():
        drafter.embed_tokens.weight.copy_(target.get_input_embeddings().weight)
    for i, messages in enumerate(chosen[len(results) :], len(results) + 1):
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.inference_mode():
            # No EOS: the served sweep ignores EOS too, so both see the same token stream.
            result = speculative_generate(target, drafter, ids, settings.output_len, settings.k, eos_token_id=None)
        ends = [i for i, t in enumerate(result.tokens) if t == tokenizer.eos_token_id]
        result.answer_end = ends[0] if ends else None
        results.append(result)
        if kept is not None:
            kept.save_offline([_row_of_result(r) for r in results])
        log(f"offline reference: prompt {i}/{len(chosen)}: AL {result.al:.2f}")
    return results


def _row_of_result(result: Result) -> dict:
    return {
        "tokens": result.tokens,
        "accepted_per_step": result.accepted_per_step,
        "k": result.k,
        "drafts": result.drafts,
        "answer_end": result.answer_end,
    }


def _result_from_row(row: Mapping) -> Result:
    return Result(
        tokens=list(row["tokens"]),
        accepted_per_step=list(row["accepted_per_step"]),
        k=int(row["k"]),
        drafts=[list(d) for d in row["drafts"]],
        answer_end=row["answer_end"],
    )


def benchmark_fingerprint(
    settings: BenchmarkSettings, target_name: str, target_path: Path, drafter_dir: Path, served_drafter_dir: Path, notes: Sequence[str | None]
) -> dict:
    """What a benchmark's measurements are of, for `Measurements.open`: the settings that shape
    them (as asked: the choice of interleaving is kept with the measurements), the target, the
    drafters' files and the caller's notes on how its servers run (eager or compiled, say)."""
    shaping = {
        "num_prompts": settings.num_prompts,
        "output_len": settings.output_len,
        "concurrencies": list(settings.concurrencies),
        "k": settings.k,
        "also_k": list(settings.also_k),
        "k_schedule": settings.k_schedule.text() if settings.k_schedule else None,
        "ngram": settings.ngram,
        "baseline_again": settings.baseline_again,
        "interleave_rounds": settings.interleave_rounds,
        "control": settings.control,
        "confirm_schedule": settings.confirm_schedule,
        "offline_prompts": settings.offline_prompts,
        "offline_reference": settings.offline_reference,
        "greedy_check": settings.greedy_check,
        "prompt_set": settings.prompt_set.name if settings.prompt_set else None,
    }
    return {
        "settings": shaping,
        "target": target_name,
        "target_path": str(target_path),
        "drafter": str(drafter_dir),
        "drafter_files": files_digest(drafter_dir),
        "served_drafter": str(served_drafter_dir),
        "served_drafter_files": files_digest(served_drafter_dir) if served_drafter_dir != drafter_dir else "the same",
        "servers": [n for n in notes if n],
    }


def benchmark_k(asked: int | None, training_summary: Mapping, default: int) -> int:
    """Draft tokens per step to benchmark at: the K asked for, else the K the drafter trained
    for (its trainer's `summary.json`), else the target's default."""
    if asked is not None:  # 0 included: the settings refuse it, rather than it meaning "the default"
        return asked
    return training_summary.get("ttt_steps") or default


def run_benchmark(
    settings: BenchmarkSettings,
    target_name: str,
    target_path: Path,
    drafter_dir: Path,
    serve: Callable[..., ContextManager],
    out_dir: Path,
    trained_aux_layer_ids: Sequence[int] | None = None,
    target_num_layers: int | None = None,
    parent_al: float | None = None,
    served_drafter_dir: Path | None = None,
    notes: Sequence[str | None] = (),
    training_summary: Mapping | None = None,
    why_not_at_once: Callable[[list[dict | None]], str | None] | None = None,
    extraction_server: Callable[[Sequence[int]], ContextManager] | None = None,
    trust_remote_code: bool = False,
    fresh: bool = False,
    on_other: str = "replace",
    log: Callable[[str], None] = print,
    reference: BenchmarkReference | None = None,
    report_notes: Sequence[str] = (),
) -> tuple[BenchmarkReport, object]:
    """Offline reference on `drafter_dir` (the drafter as trained), served sweeps with the
    export at `served_drafter_dir` (default: the same folder), report written to `out_dir`;
    `notes` (how the servers ran, say; None skipped) go into the report as they are.
    `training_summary`, the trainer's `summary.json`: its aux layer ids (unless
    `trained_aux_layer_ids` is given) go to the verdict, its validation beside the offline numbers.
    `why_not_at_once(specs)` says why these configurations' servers cannot all be up together
    (None when they can; a spec given twice is two servers), for the default of
    `interleave_rounds` (`interleaving`). With `settings.control`, `serve(None, replica=1)` must
    give a second server without speculation, not the first one again.
    `extraction_server(layer_ids)` gives a server capturing the target's states at those ids
    (the resource's, or a launched one): the offline reference replays over it
    (`settings.offline_reference`), and the target is never loaded here. `reference`, a capture
    of the target's greedy answers and states made earlier (`bench/reference_states.py`), takes
    its place where it fits this benchmark's prompts, tokens and the drafter's layers.
    `report_notes` go into the report but not into what the measurements are of (a server's
    address, say, which may change between the parts of a benchmark measured in turn).

    Every finished measurement is kept in `out_dir/measurements/` (`bench/progress.py`), and a
    rerun with the same settings resumes from them; `fresh` discards them first, and `on_other`
    says what becomes of unfinished ones of other settings: "replace" them, or "refuse" to start.
    A server that dies, or requests that fail after their retries, end the benchmark with a
    `ServerFailed` naming the configuration, the server and its log. Configurations whose
    `serve` raises `ServerUnavailable` are left for a rerun: the rest is measured and kept, and
    `BenchmarkIncomplete` is raised at the end, saying which are left."""
    training_summary = training_summary or {}
    if trained_aux_layer_ids is None:
        trained_aux_layer_ids = training_summary.get("aux_layer_ids")
    served_drafter_dir = served_drafter_dir or drafter_dir
    fingerprint = benchmark_fingerprint(settings, target_name, target_path, drafter_dir, served_drafter_dir, notes)
    kept = Measurements.open(out_dir, fingerprint, fresh=fresh, on_other=on_other, log=log)
    prompt_set = settings.prompt_set or mt_bench_set(settings.num_prompts)
    prompts = list(prompt_set.messages[: settings.num_prompts])
    sweep = SweepSettings(
        output_len=settings.output_len, concurrencies=tuple(settings.concurrencies), progress=False, request_timeout_s=settings.request_timeout_s
    )
    drafter_aux = None
    if reference is not None:
        drafter_aux = drafter_folder_config(drafter_dir).aux_layer_ids
        why = reference.mismatch(prompts, settings.output_len + settings.k, drafter_aux)
        if why:
            log(f"the captured benchmark reference does not fit this benchmark ({why}): not used")
            reference = None
    source = offline_reference_source(settings.offline_reference, target_path, extraction_server is not None or reference is not None)
    streams = GreedyStreams(settings, prompts, log, kept) if (source == "engine" or settings.greedy_check) else None
    notes = [n for n in notes if n] + list(prompt_set.notes) + list(report_notes)
    kernels = EngineKernels()

    def on_served(label: str, spec: dict | None, server) -> None:
        kernels.add(server)
        if streams is not None:
            streams.on_served(label, spec, server)

    if source == "hf":
        results = offline_results(target_path, drafter_dir, prompts, settings, log, kept=kept, trust_remote_code=trust_remote_code)
    decided = kept.choice("served")
    if decided is None:  # chosen once: a resumed benchmark is served as it began, whatever memory is free now
        settings, how_served = interleaving(settings, served_drafter_dir, why_not_at_once)
        kept.set_choice("served", {"interleave_rounds": settings.interleave_rounds, "control": settings.control, "note": how_served})
    else:
        settings = replace(settings, interleave_rounds=decided["interleave_rounds"], control=decided["control"])
        how_served = decided["note"]
    if how_served:
        notes.append(how_served)
        log(how_served)
    missing: list[str] = []
    runs = _serve_all(
        served_configs(settings, served_drafter_dir),
        serve,
        prompts,
        sweep,
        settings.interleave_rounds,
        log,
        kept,
        "sweep",
        on_served=on_served,
        missing=missing,
    )
    if streams is not None:
        try:
            streams.fill_missing(serve, speculative_config(served_drafter_dir, settings.k))
        except ServerUnavailable as exc:
            log(f"greedy streams left for the rerun: {exc}")
    if source == "engine" and reference is not None:
        results = captured_offline_results(drafter_dir, target_path, reference, settings, log, kept)
        notes.append(
            "offline reference replayed over the states the serving engine captured along the target's greedy answers, "
            "in the hidden-state stage (the target was not loaded here)"
        )
        if streams is not None and streams.plain is not None:
            same = sum(
                list(r) == list(p[1][: len(r)]) for r, p in zip((s[: settings.output_len + settings.k] for s in reference.streams), streams.plain)
            )
            notes.append(
                f"the extraction server's greedy answers equal the plain server's on {same} of {len(streams.plain)} prompts "
                f"({settings.output_len + settings.k} tokens each)"
            )
    elif source == "engine":
        if streams.plain is None:
            raise _incomplete(missing or [BASELINE], kept)
        results = engine_offline_results(drafter_dir, target_path, streams.plain, extraction_server, settings, log)
        notes.append(
            "offline reference replayed over the states the serving engine captured along the target's greedy answers "
            "from its server (the target was not loaded here)"
        )
    if missing:
        raise _incomplete(missing, kept)
    offline = AcceptanceNumbers.from_results(results, settings.k)
    chosen = list(prompt_set.categories[: len(results)]) if prompt_set.categories else None  # none: no per-category slices
    slices = offline_slices(results, chosen, settings.k)
    log(f"offline reference: AL {offline.al:.3f}, p_k {[round(p, 3) for p in offline.per_position_acceptance]}")
    ended_early = answers_ending_early(results)
    if ended_early:
        notes.append(
            f"{ended_early} of {len(results)} offline answers ended before {settings.output_len} "
            "tokens and ran on past the target's end-of-answer token (EOS is ignored, served and offline alike)"
        )
    confirmation = []
    if settings.confirm_schedule:
        confirmation, note = _confirm_schedule(runs, settings, served_drafter_dir, serve, prompts, sweep, log, kept)
        if note:
            notes.append(note)
    notes += _measurement_notes([*runs, *confirmation], kept)
    report = build_report(
        target=target_name,
        drafter=str(served_drafter_dir),
        runs=runs,
        offline=offline,
        offline_slices=slices,
        notes=notes,
        parent_al=parent_al,
        tolerance=settings.tolerance,
        drafter_path=served_drafter_dir,
        trained_aux_layer_ids=trained_aux_layer_ids,
        target_num_layers=target_num_layers,
        min_speedup=settings.min_speedup,
        training=TrainingFacts.from_summary(training_summary),
        confirmation=confirmation,
        greedy_check=streams.check if streams else None,
        prompt_set=prompt_set.name,
        serving=kernels.note(settings.served_dtype) or "",
    )
    paths = write_report(report, out_dir)
    kept.finish()
    return report, paths


def offline_reference_source(asked: str, target_path: Path, can_extract: bool) -> str:
    """ "hf" or "engine" for the offline reference: as asked, else (auto) "hf" where the target's
    weights, read in fp32, fit in half this host's available memory, else "engine"."""
    if asked == "engine" and not can_extract:
        raise ValueError(
            "offline_reference 'engine' needs an extraction server, and none was given: serve the target with "
            "`eagle-assets serve --extract` and give its URL, or use offline_reference 'hf'"
        )
    if asked != "auto":
        return asked
    if not can_extract:
        return "hf"
    available = available_memory_bytes()
    return "hf" if available is None or fp32_weight_bytes(target_path) <= available // 2 else "engine"


def fp32_weight_bytes(target_path: Path) -> int:
    """The target's weights as fp32 (what the reference decoder holds): twice their bf16 files."""
    files = list(Path(target_path).glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) * 2


class EngineKernels:
    """The kernels the launched CPU servers of a benchmark took (their plugin logs each choice):
    processor kinds differ in them (AMX or vector attention, AMX_MLA or CPU_MLA), so a report
    names them beside the host's CPU kind."""

    def __init__(self) -> None:
        self.choices: list[str] = []

    def add(self, server) -> None:
        for choice in engine_kernels(server.log_path) if getattr(server, "log_path", None) else ():
            if choice not in self.choices:
                self.choices.append(choice)

    def note(self, served_dtype: str) -> str | None:
        if not self.choices:
            return None
        return f"served on {host_cpu().describe()} in {served_dtype}; vLLM's kernels: {'; '.join(self.choices)}"


class GreedyStreams:
    """Collects greedy streams from the servers while they are up: the target's plain stream
    (from the baseline: `output_len + k` tokens, so the replay judges the last round's drafts)
    and, at the drafter's K, the greedy check against it (`bench/greedy_check.py`). Both are kept
    with the measurements, so a benchmark measured in parts (one server at a time) has them in
    the part that serves the other configuration."""

    def __init__(self, settings: BenchmarkSettings, prompts: Sequence, log: Callable[[str], None], kept: Measurements | None = None):
        self.settings, self.prompts, self.log, self.kept = settings, list(prompts), log, kept
        self.plain: list[tuple[list[int], list[int]]] | None = None
        self.check: GreedyCheck | None = None
        if kept is not None:
            plain = kept.extra("greedy_streams")
            if isinstance(plain, list) and len(plain) == len(self.prompts):
                self.plain = [(list(p), list(t)) for p, t in plain]
            check = kept.extra("greedy_check")
            if isinstance(check, dict):
                self.check = GreedyCheck.from_dict(check)

    def on_served(self, label: str, spec: dict | None, server) -> None:
        s = self.settings
        if label == BASELINE and self.plain is None:
            self.log(f"greedy streams of the target: {len(self.prompts)} prompts x {s.output_len + s.k} tokens")
            self.plain = [
                greedy_tokens(server.base_url, server.model, m, s.output_len + s.k, server.api_key, s.request_timeout_s) for m in self.prompts
            ]
            if self.kept is not None:
                self.kept.save_extra("greedy_streams", self.plain)
        elif label == fixed_k_label(s.k, s.k) and s.greedy_check and self.plain is not None and self.check is None:
            self.check = check_against(
                self.plain, server.base_url, server.model, self.prompts, s.output_len, s.served_dtype, server.api_key, s.request_timeout_s
            )
            self.log(self.check.sentence())
            if self.kept is not None:
                self.kept.save_extra("greedy_check", self.check.to_dict())

    def fill_missing(self, serve: Callable[..., ContextManager], eagle3_spec: dict) -> None:
        """Serve what a resumed sweep did not (its levels were kept from an earlier run), for the streams alone."""
        if self.plain is None:
            with serve(None) as server:
                self.on_served(BASELINE, None, server)
        if self.settings.greedy_check and self.check is None:
            with serve(eagle3_spec) as server:
                self.on_served(fixed_k_label(self.settings.k, self.settings.k), eagle3_spec, server)


def captured_offline_results(
    drafter_dir: Path,
    target_path: Path,
    reference: BenchmarkReference,
    settings: BenchmarkSettings,
    log: Callable[[str], None],
    kept: Measurements | None = None,
) -> list[Result]:
    """The reference decoder's results, replayed over a capture of the engine's states
    (`bench/reference_states.py`) along the target's greedy answers; kept with the measurements."""
    rows = kept.offline() if kept is not None else []
    if len(rows) >= settings.num_prompts:
        return [_result_from_row(row) for row in rows[: settings.num_prompts]]
    drafter, config = load_drafter(drafter_dir, dtype=torch.float32)
    drafter.load_target_embedding(read_target_embedding(target_path, torch.float32))
    drafter.eval()
    tokens = settings.output_len + settings.k
    n = settings.num_prompts
    results = replay_reference(
        drafter,
        reference.prompt_ids[:n],
        [s[:tokens] for s in reference.streams[:n]],
        _captured_states(reference, config.aux_layer_ids, tokens),
        settings.output_len,
        settings.k,
        log,
    )
    if kept is not None:
        kept.save_offline([_row_of_result(r) for r in results])
    return results


def _captured_states(reference: BenchmarkReference, aux_ids: Sequence[int], tokens: int) -> Callable[[list[int]], torch.Tensor]:
    """`replay_reference`'s `states_of` over a capture: the states of the prompt the ids begin with."""
    by_ids = {tuple(p + s[:tokens]): i for i, (p, s) in enumerate(zip(reference.prompt_ids, reference.streams))}

    def states_of(ids: list[int]) -> torch.Tensor:
        return reference.states_of(by_ids[tuple(ids)], aux_ids, tokens)

    return states_of


def _incomplete(missing: Sequence[str], kept: Measurements) -> BenchmarkIncomplete:
    """The error ending a benchmark measured in part, its message also kept with the measurements
    (`LEFT_CHOICE`: `eagle-assets run` prints it)."""
    note = _left_note(missing, kept)
    kept.set_choice(LEFT_CHOICE, note)
    return BenchmarkIncomplete(note, missing)


LEFT_CHOICE = "left"
"""The measurements' note of what a benchmark measured in part still needs."""


def _left_note(missing: Sequence[str], kept: Measurements) -> str:
    """What a benchmark measured in parts still needs, and where the rest is kept."""
    return (
        f"not measured yet: {', '.join(missing)} (no server of it was given this time). What was measured is kept in "
        f"{kept.folder}; serve the other configuration (for the target with the drafter: EAGLE_ASSETS_SPECULATIVE_URL; "
        "alone: EAGLE_ASSETS_SERVER_URL) and run the benchmark again: it measures only what is left and writes the report"
    )


def engine_offline_results(
    drafter_dir: Path,
    target_path: Path,
    plain: Sequence[tuple[list[int], list[int]]] | None,
    extraction_server: Callable[[Sequence[int]], ContextManager],
    settings: BenchmarkSettings,
    log: Callable[[str], None],
) -> list[Result]:
    """The reference decoder's results, replayed over the engine's states (`bench/replay_reference.py`)."""
    if plain is None:
        raise RuntimeError("the baseline was not served, so the target's greedy streams are missing for the offline replay")
    drafter, config = load_drafter(drafter_dir, dtype=torch.float32)
    drafter.load_target_embedding(read_target_embedding(target_path, torch.float32))
    drafter.eval()
    ids = sorted(config.aux_layer_ids)
    with extraction_server(ids) as server:
        client = EngineStateClient(server.base_url, server.model, ids, api_key=server.api_key)
        cols = [client.column(k) for k in config.aux_layer_ids]

        def states_of(seq: list[int]) -> torch.Tensor:
            states = client.one(np.asarray(seq))  # (T, n_ids, Ht)
            return states[:, cols].reshape(len(seq), -1).float()  # the drafter's order, as vLLM concatenates them

        with closing(client):
            return replay_reference(drafter, [p for p, _ in plain], [t for _, t in plain], states_of, settings.output_len, settings.k, log)


def _measurement_notes(runs: Sequence, kept: Measurements) -> list[str]:
    """What the report says of measurements kept from an interrupted run, and of retried requests."""
    notes = []
    if kept.kept and kept.choice(LEFT_CHOICE):
        notes.append(
            f"measured in parts, one server at a time: {kept.kept} measurement(s) were kept from the part begun "
            f"{kept.state.get('started')}, the rest measured on the server given after it"
        )
    elif kept.kept:
        notes.append(
            f"resumed: {kept.kept} measurement(s) (levels, rounds or the offline reference) were kept from an "
            f"interrupted run of the same benchmark begun {kept.state.get('started')}; the rest were measured "
            "on servers started again"
        )
    retried = {f"{r.label} c={lv.concurrency}": lv.retried_requests for r in runs for lv in r.levels if lv.retried_requests}
    if retried:
        notes.append(
            "requests that succeeded only when retried (their wait is in the level's time, which reads slower): "
            + ", ".join(f"{where}: {n}" for where, n in retried.items())
        )
    return notes


def _serve_all(
    configs: Sequence[tuple[str, dict | None]],
    serve: Callable[..., ContextManager],
    prompts: Sequence,
    sweep: SweepSettings,
    rounds: int,
    log: Callable[[str], None],
    kept: Measurements,
    phase: str,
    on_served: Callable[[str, dict | None, object], None] | None = None,
    missing: list[str] | None = None,
) -> list:
    """Serve every configuration's sweep: interleaved in `rounds`, or (0) one after another;
    each level (or round) kept under `phase` as it finishes, those kept before read back.
    `on_served(label, spec, server)` runs after a configuration's sweep while its server is up
    (not for a configuration whose every measurement was kept). One after another, a
    configuration whose `serve` raises `ServerUnavailable` is skipped and its label added to
    `missing` (given; else the exception stands)."""
    if rounds:
        return _serve_interleaved(configs, serve, prompts, sweep, rounds, log, kept, phase, on_served)
    runs = []
    for label, spec in configs:
        earlier = {c: kept.level(phase, label, c) for c in sweep.concurrencies if kept.has(phase, label, c)}
        earlier = {c: found for c, found in earlier.items() if found is not None}
        missing_levels = tuple(c for c in sweep.concurrencies if c not in earlier)
        levels = {c: level for c, (level, _) in earlier.items()}
        descriptions = [d for _, d in earlier.values()]
        if missing_levels:
            try:
                run, description = _serve_one(label, spec, serve, prompts, sweep, missing_levels, earlier, log, kept, phase, on_served)
            except ServerUnavailable as exc:  # raised as the block enters: nothing of it was served
                if missing is None:
                    raise
                log(f"served sweep: {label} left for a rerun: {exc}")
                missing.append(label)
                continue
            levels.update({level.concurrency: level for level in run.levels})
            descriptions.append(description)
        else:
            log(f"served sweep: {label}: every level kept from an earlier run")
        # The run began with its first level; the latest server is the one it names.
        run_fields = {**descriptions[-1], "started_at": min(d["started_at"] for d in descriptions)}
        runs.append(ServedRun(label=label, levels=tuple(levels[c] for c in sweep.concurrencies), **run_fields))
    return runs


def _serve_one(
    label: str,
    spec: dict | None,
    serve: Callable[..., ContextManager],
    prompts: Sequence,
    sweep: SweepSettings,
    levels: tuple[int, ...],
    earlier: Mapping,
    log: Callable[[str], None],
    kept: Measurements,
    phase: str,
    on_served: Callable[[str, dict | None, object], None] | None,
) -> tuple[ServedRun, dict]:
    """One configuration's sweep at the concurrency `levels` not kept from an earlier run, each
    kept as it finishes: (its run, its description)."""
    with serve(spec) as server:
        log(
            f"served sweep: {label} at concurrency {list(levels)}"
            + (f" (c={', '.join(map(str, earlier))} kept from an earlier run)" if earlier else "")
        )
        description = {
            "engine": sweep.engine,
            "model": server.model,
            "base_url": server.base_url,
            "output_len": sweep.output_len,
            "num_prompts": len(prompts),
            "started_at": time.time(),
            "config": {"speculative": spec},
        }
        with _failures_named(label, [server], kept):
            run = run_served(
                label,
                server.base_url,
                server.model,
                prompts,
                replace(sweep, concurrencies=levels),
                api_key=server.api_key,
                config=description["config"],
                on_level=lambda level: kept.save_level(phase, label, level, description),
            )
            if on_served is not None:
                on_served(label, spec, server)
    return run, description


@contextmanager
def _failures_named(label: str, servers: Sequence, kept: Measurements) -> Iterator[None]:
    """Requests that failed for good, or a server that died, as a `ServerFailed` that names the
    configuration, the server (dead: its last log lines; alive: its log) and where the finished
    measurements are, instead of an HTTP client's traceback."""
    try:
        yield
    except (ServedRequestError, httpx.HTTPError, ConnectionError) as exc:
        url = getattr(exc, "base_url", None)
        suspects = [s for s in servers if s.base_url == url] or list(servers)
        resume = f"{len(kept.files())} finished measurement file(s) are kept in {kept.folder}: a rerun with the same settings resumes from them"
        for server in suspects:
            problem = server.problem(timeout_s=5) if hasattr(server, "problem") else None
            if problem:
                failure = server.failure(problem)
                raise ServerFailed(f"the benchmark stopped while serving '{label}': {failure}\n{resume}", failure.log_path, failure.tail) from exc
        where = ", ".join(f"{s.base_url} (log {s.log_path})" if getattr(s, "log_path", None) else s.base_url for s in suspects)
        raise ServerFailed(f"the benchmark stopped while serving '{label}': {exc}\nthe server still answers /health: {where}\n{resume}") from exc


def _confirm_schedule(
    runs: Sequence,
    settings: BenchmarkSettings,
    drafter_dir: Path,
    serve: Callable[..., ContextManager],
    prompts: Sequence,
    sweep: SweepSettings,
    log: Callable[[str], None],
    kept: Measurements,
) -> tuple[list, str | None]:
    """The runs confirming the schedule the sweep recommends (none when it recommends no
    schedule, or one the sweep served already), and a note saying which."""
    schedule = recommended_schedule(runs)
    if schedule is None or len(schedule.ranges) == 1:
        advice = "no K beat no speculation" if schedule is None else f"K={schedule.max_k} served fastest at every load"
        return [], f"confirm_schedule: no schedule to confirm ({advice})"
    if any(run_schedule(r) == schedule for r in runs):
        return [], f"confirm_schedule: the recommended schedule {schedule.text()} was served in the sweep itself"
    log(f"confirming the recommended K schedule {schedule.text()} ({schedule.describe()})")
    configs = confirmation_configs(schedule, settings.k, drafter_dir, settings.baseline_again and not settings.interleave_rounds)
    return _serve_all(configs, serve, prompts, sweep, settings.interleave_rounds, log, kept, "confirm"), None


def _serve_interleaved(
    configs: Sequence[tuple[str, dict | None]],
    serve: Callable[..., ContextManager],
    prompts: Sequence,
    sweep: SweepSettings,
    rounds: int,
    log: Callable[[str], None],
    kept: Measurements,
    phase: str,
    on_served: Callable[[str, dict | None, object], None] | None = None,
) -> list:
    """Start (or reuse) every configuration's server, then serve them interleaved. A config
    given twice (the A/A control) gets a server of its own: `serve(spec, replica=1)`. A
    configuration whose every round was kept by an earlier run is not served at all."""
    plans = [round_prompts(len(prompts), c, rounds) for c in sweep.concurrencies]
    with ExitStack() as stack:
        targets, servers, started = [], [], []
        for (label, spec), replica in zip(configs, replica_numbers([spec for _, spec in configs])):
            if all(kept.has(phase, label, c, r) for c, plan in zip(sweep.concurrencies, plans) for r in range(len(plan))):
                targets.append(ServedTarget(label, None, None, None, {"speculative": spec}))
                continue
            server = stack.enter_context(serve(spec, replica=replica) if replica else serve(spec))
            servers.append(server)
            started.append((label, spec, server))
            targets.append(ServedTarget(label, server.base_url, server.model, server.api_key, {"speculative": spec}))
        log(f"served sweeps: {', '.join(t.label for t in targets)} interleaved in up to {rounds} rounds at concurrency {list(sweep.concurrencies)}")
        with _failures_named(" and ".join(t.label for t in targets), servers, kept):
            runs = run_interleaved(targets, prompts, sweep, rounds, progress=log, kept=kept, phase=phase)
            for label, spec, server in started if on_served is not None else ():
                on_served(label, spec, server)
        return runs


def load_report_json(out_dir: Path) -> dict:
    return json.loads((Path(out_dir) / "report.json").read_text())
