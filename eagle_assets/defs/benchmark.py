"""`benchmark_reference` and `benchmark_report`: served speedup and acceptance, tied to the offline reference."""

# No `from __future__ import annotations`: Dagster resolves Config types from real annotations.

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Literal, Optional

import dagster as dg

from eagle_assets.bench import reference_states
from eagle_assets.bench.benchmark import BenchmarkIncomplete, ServerUnavailable, benchmark_k, run_benchmark
from eagle_assets.bench.checks import BASELINE, CONTROL, NGRAM, against, host_drift, round_speedups
from eagle_assets.bench.parity import ParityTolerance
from eagle_assets.bench.served import OFFLINE_REFERENCES, PromptSet, context_fit, user_prompt_set
from eagle_assets.bench.settings import BenchmarkSettings, default
from eagle_assets.corpus.prompt_formats import FORMATS
from eagle_assets.defs.code_versions import code_version
from eagle_assets.defs.common import GROUP, check_result, hash_files, image_markdown, metadata, target_of
from eagle_assets.defs.drafter import drafter_checkpoint
from eagle_assets.defs.hidden_state_settings import (
    HiddenStatesConfig,
    engine_layer_ids,
    engine_max_model_len,
    extraction_settings,
    hidden_states_source,
)
from eagle_assets.defs.hidden_states import hidden_state_shards
from eagle_assets.defs.hub import push_checked_drafter
from eagle_assets.defs.settings import reference_settings, with_defaults
from eagle_assets.drafter.run_config import ParentNumbering
from eagle_assets.drafter.trackers import RECORD_FILE as TRACKER_RECORD
from eagle_assets.drafter.trackers import benchmark_scalars, log_to_recorded_run
from eagle_assets.engines.k_schedule import KSchedule
from eagle_assets.hidden_states.source import SOURCES
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets.resources.storage import StorageResource
from eagle_assets.url_scope import check_prompt_url


class BenchmarkConfig(dg.Config):
    num_prompts: int = default("num_prompts")
    """MT-Bench first turns (or the first of `prompts_url`), served and offline."""
    prompts_url: Optional[str] = None
    """Benchmark on your own traffic instead of MT-Bench: a prompt file (any fsspec URL or
    pkg://PACKAGE/PATH; ShareGPT, OpenAI chat, Alpaca or text), the first user turn of each of
    its first num_prompts prompts that fit the target's context."""
    prompts_format: Literal[FORMATS] = "auto"
    """The prompts_url file's format: "auto" (detected), "sharegpt", "openai", "alpaca", "eagle" or "text"."""
    output_len: int = default("output_len")
    concurrencies: list[int] = list(default("concurrencies"))
    k: Optional[int] = None
    """Draft tokens per step; default: the drafter's training unroll K."""
    also_k: list[int] = []
    """Also serve the drafter at these K (each its own run), to find the fastest K to deploy."""
    k_schedule: str = ""
    """Also serve the drafter with K by batch size, e.g. "1-2:3,3-:0" (K 3 for 1 or 2 requests in
    a batch, none from 3 up; vLLM's dynamic speculative decoding). The report recommends one."""
    ngram: bool = default("ngram")
    baseline_again: bool = default("baseline_again")
    """Serve no speculation again at the end: the report gives the host's drift over the run."""
    interleave_rounds: Optional[int] = default("interleave_rounds")
    """Serve all configurations at once, each concurrency level in this many rounds alternating
    between them, so a drifting host slows them alike (0: one after another). Default: 10 rounds
    on a CPU host with memory for every server at once, else one after another."""
    control: bool = default("control")
    """Served interleaved: also serve no speculation from a second server, an A/A control whose
    tokens/s over the baseline's is the run's noise floor."""
    confirm_schedule: bool = default("confirm_schedule")
    """Where the K served (k and also_k) recommend a K schedule, serve it after the sweep beside
    no speculation and its fixed K: the report says whether it serves as fast as the fastest."""
    al_tolerance: float = default("tolerance").al_rel
    """Parity holds when |served AL - offline AL| <= this share of the offline AL."""
    offline_reference: Literal[OFFLINE_REFERENCES] = default("offline_reference")
    """"hf" (the reference decoder, the target in fp32 here), "engine" (replayed over the states
    an extraction server captures: the target is never loaded here) or "auto" (hf where the
    target fits this host)."""
    greedy_check: bool = default("greedy_check")
    """Compare the drafter's served greedy output with plain greedy, token for token."""
    parent_al: Optional[float] = None
    """AL of the parent drafter on the same prompts, for a warm start's no-regression check."""
    push_to_hub: Optional[str] = None
    """A hub repository (ORG/NAME) to publish the drafter to once benchmarked: its vLLM export and
    model card at main, the SGLang export at the `sglang` branch (as `eagle-assets push`), only
    when every blocking check of drafter_checkpoint passed on it. HF_TOKEN gives the token. Off
    (None) by default; it makes nothing stale."""
    push_private: bool = False
    """Create the push_to_hub repository private (an existing one keeps its visibility)."""

    def settings(self, k: int, served_dtype: str = "float32", prompt_set: Optional[PromptSet] = None) -> BenchmarkSettings:
        """The benchmark's settings at `k` draft tokens per step (they refuse what cannot run)."""
        return BenchmarkSettings(
            num_prompts=self.num_prompts,
            prompt_set=prompt_set,
            output_len=self.output_len,
            concurrencies=tuple(self.concurrencies),
            k=k,
            also_k=tuple(self.also_k),
            k_schedule=KSchedule.parse(self.k_schedule) if self.k_schedule.strip() else None,
            ngram=self.ngram,
            baseline_again=self.baseline_again,
            interleave_rounds=self.interleave_rounds,
            control=self.control,
            confirm_schedule=self.confirm_schedule,
            tolerance=ParityTolerance(al_rel=self.al_tolerance),
            offline_reference=self.offline_reference,
            greedy_check=self.greedy_check,
            served_dtype=served_dtype,
        )


ReportSettings = with_defaults(BenchmarkConfig, "benchmark_report")
"""BenchmarkConfig with the code location's settings as defaults (defs/settings.py)."""


class BenchmarkReferenceConfig(dg.Config):
    """What the benchmark will ask of the reference (its prompts and tokens) and where the
    hidden-state stage takes its states (the layers, the source). Its defaults are the code
    location's settings of benchmark_report, hidden_state_shards and drafter_checkpoint
    (`run_presets.REFERENCE_FROM`), so the two agree; its own section of a run file goes on top."""

    num_prompts: int = default("num_prompts")
    prompts_url: Optional[str] = None
    prompts_format: Literal[FORMATS] = "auto"
    output_len: int = default("output_len")
    k: Optional[int] = None
    also_k: list[int] = []
    ttt_steps: Optional[int] = None
    """The drafter's training unroll K, the benchmark's K where `k` is unset; default: the preset's."""
    offline_reference: Literal[OFFLINE_REFERENCES] = default("offline_reference")
    aux_layer_ids: Optional[list[int]] = None
    parent_drafter: Optional[str] = None
    parent_numbering: ParentNumbering = "measure"
    source: Literal[SOURCES] = "auto"
    """The hidden-state stage's source: the reference is captured where it is the engine."""


ReferenceSettings = with_defaults(BenchmarkReferenceConfig, "benchmark_reference", values=reference_settings())
"""BenchmarkReferenceConfig with the code location's settings as defaults (module doc of defs/settings.py)."""


def benchmark_prompt_set(num_prompts: int, prompts_url: Optional[str], prompts_format: str, path, preset, new_tokens: int) -> PromptSet:
    """The benchmark's prompts: MT-Bench's first turns, or the first of a file of the user's that fit."""
    if not prompts_url:
        from eagle_assets.bench.served import mt_bench_set

        return mt_bench_set(num_prompts)
    fits = context_fit(path, preset.max_model_len, new_tokens, preset.trust_remote_code)
    return user_prompt_set(prompts_url, num_prompts, prompts_format, fits)


REFERENCE_PRIORITY = "1"
"""The reference's step runs before the drafter's when both are ready in one run (Dagster's
`dagster/priority`): it then finds the hidden-state stage's extraction server still warm, and
the drafter stops it before training."""


@dg.asset(
    group_name=GROUP,
    deps=[hidden_state_shards],
    code_version=code_version("benchmark_reference", ReferenceSettings),
    op_tags={"dagster/priority": REFERENCE_PRIORITY},
)
def benchmark_reference(
    context: dg.AssetExecutionContext, config: ReferenceSettings, inference_server: InferenceServerResource, storage: StorageResource
):
    """The target's side of the offline reference, captured by an extraction server: each
    benchmark prompt's greedy answer and the engine's states along it
    (`bench/reference_states.py`). Right after hidden_state_shards in the same run, it asks for
    the same extraction server, which the inference-server resource kept warm: no second load of
    the target. The benchmark then replays its drafter over the capture and needs no extraction
    server of its own, and serves the target alone and with the drafter one after the other: one
    target server at a time. Not captured (the benchmark takes its reference as before) where
    the hidden states or the offline reference are Hugging Face's."""
    preset, path = target_of(inference_server)
    out = storage.base(preset.name) / "benchmark_reference"
    hidden = HiddenStatesConfig(
        aux_layer_ids=config.aux_layer_ids, parent_drafter=config.parent_drafter, parent_numbering=config.parent_numbering, source=config.source
    )
    why_not = None
    if config.offline_reference == "hf":
        why_not = "the offline reference is Hugging Face's (offline_reference: hf)"
    elif not inference_server.extraction_url and hidden_states_source(hidden, preset, path) != "engine":
        why_not = "the hidden states come from Hugging Face (hidden_state_shards source), not from an extraction server"
    if why_not:
        context.log.info(f"benchmark reference not captured: {why_not}")
        # A content hash of its own (the reason): a reference that is not captured is still data the benchmark reads.
        return dg.MaterializeResult(
            metadata=metadata({"captured": False, "why": why_not}), data_version=dg.DataVersion(hashlib.sha256(why_not.encode()).hexdigest()[:16])
        )
    k = max([config.k or config.ttt_steps or preset.ttt_steps, *config.also_k])
    tokens = config.output_len + k
    prompts_url = check_prompt_url(config.prompts_url, storage.root or None, "benchmark_report.prompts_url") if config.prompts_url else None
    prompt_set = benchmark_prompt_set(config.num_prompts, prompts_url, config.prompts_format, path, preset, tokens)
    ids = engine_layer_ids(extraction_settings(hidden, preset), preset)
    # The hidden-state stage's server, as it launches it (the corpus's longest sample, at least
    # the preset's context), so that its warm one is the one asked for; a benchmark prompt and
    # its answer fit the preset's context (`context_fit`).
    storage.fetch(storage.corpus(preset.name), log=context.log.info)
    with inference_server.extraction_server(ids, engine_max_model_len(preset, str(storage.corpus(preset.name))), log=context.log.info) as server:
        reference_states.capture(
            server.base_url, server.model, server.api_key, prompt_set.messages[: config.num_prompts], tokens, ids, out, log=context.log.info
        )
    storage.publish(out, log=context.log.info)
    return dg.MaterializeResult(
        metadata=metadata({"captured": True, "prompts": config.num_prompts, "tokens": tokens, "layer_ids": ids, "path": str(out)}),
        data_version=dg.DataVersion(hash_files([out / reference_states.MANIFEST_FILE, out / reference_states.STATES_FILE])),
    )


@dg.asset(
    group_name=GROUP,
    deps=[drafter_checkpoint, benchmark_reference],
    output_required=False,
    code_version=code_version("benchmark_report", ReportSettings),
    check_specs=[
        dg.AssetCheckSpec("speedup", asset="benchmark_report", description="Tokens/s with the drafter above tokens/s without, at concurrency 1."),
        dg.AssetCheckSpec("parity", asset="benchmark_report", description="Served AL and per-position acceptance agree with the offline reference."),
        dg.AssetCheckSpec("parent_al", asset="benchmark_report", description="AL at least the parent drafter's when warm-started."),
        dg.AssetCheckSpec(
            "greedy_output",
            asset="benchmark_report",
            description="Greedy output under speculation equals plain greedy, "
            "or parts from it only where the target's two best tokens are nearly tied.",
        ),
    ],
)
def benchmark_report(context: dg.AssetExecutionContext, config: ReportSettings, inference_server: InferenceServerResource, storage: StorageResource):
    """The drafter in the real engine: the same prompts (MT-Bench's, or prompts_url's) without
    speculation, with our EAGLE-3 drafter and with vLLM's n-gram speculation, over a concurrency sweep; acceptance
    from the engine's own counters against the offline reference decoder, with a verdict on
    whether a gap is the drafter's fault or the engine wiring's. Markdown, JSON and plots.

    With servers of the user's given one at a time (the target alone, later with the drafter),
    each run measures what its server serves and keeps it; the asset is materialised by the run
    that completes the measurements (a run that cannot finish yet says what is left)."""
    preset, path = target_of(inference_server)
    drafter_dir = storage.drafter(preset.name) / "drafter-vllm"
    tracker_file = storage.drafter(preset.name) / TRACKER_RECORD
    storage.fetch(drafter_dir, storage.drafter(preset.name) / "summary.json", tracker_file, log=context.log.info)  # not the checkpoints
    summary = json.loads((storage.drafter(preset.name) / "summary.json").read_text())
    k = benchmark_k(config.k, summary, preset.ttt_steps)
    prompt_set = None
    if config.prompts_url:
        # Read only under the roots a run's prompt files may come from, as prompts.file_url.
        prompts_url = check_prompt_url(config.prompts_url, storage.root or None, "benchmark_report.prompts_url")
        fits = context_fit(path, preset.max_model_len, config.output_len + max([k, *config.also_k]), preset.trust_remote_code)
        prompt_set = user_prompt_set(prompts_url, config.num_prompts, config.prompts_format, fits)
    settings = config.settings(k, inference_server.served_dtype(), prompt_set)
    notes = [inference_server.serving_note()]
    report_notes = []
    if inference_server.connected:
        # Servers of the user's: the target alone and with the drafter, one configuration each,
        # given together or one at a time (a host holding one target server: measured in turn).
        settings = dataclasses.replace(
            settings, also_k=(), k_schedule=None, ngram=False, control=False, interleave_rounds=0, baseline_again=False, confirm_schedule=False
        )
        report_notes.append(
            "served by your servers: the target alone and with the drafter (at the K it was started with), "
            "one configuration each; no n-gram, other K or A/A control"
        )

    def serve(speculative, replica=0):
        if inference_server.connected and not (inference_server.speculative_url if speculative else inference_server.url):
            raise ServerUnavailable(
                "no server of the target with the drafter is given (EAGLE_ASSETS_SPECULATIVE_URL)"
                if speculative
                else "no server of the target alone is given (EAGLE_ASSETS_SERVER_URL)"
            )
        return inference_server.serve(speculative=speculative, replica=replica, log=context.log.info)

    def extraction_server(layer_ids):
        return inference_server.extraction_server(layer_ids, preset.max_model_len + settings.k + 1, log=context.log.info)

    reference_dir = storage.base(preset.name) / "benchmark_reference"
    storage.fetch(reference_dir, log=context.log.info)
    reference = reference_states.load(reference_dir)
    can_extract = not inference_server.connected or bool(inference_server.extraction_url)
    try:
        report, paths = run_benchmark(
            settings,
            preset.name,
            path,
            drafter_dir,
            serve,
            storage.report(preset.name),
            target_num_layers=preset.num_layers,
            parent_al=config.parent_al,
            log=context.log.info,
            notes=notes,
            training_summary=summary,
            why_not_at_once=inference_server.why_not_at_once,
            extraction_server=extraction_server if can_extract else None,
            trust_remote_code=preset.trust_remote_code,
            reference=reference,
            report_notes=report_notes,
        )
    except BenchmarkIncomplete as exc:
        # Measured in parts (one target server at a time): what was measured is kept, and the
        # asset is materialised by the run that measures the rest.
        context.log.warning(str(exc))
        storage.publish(storage.report(preset.name), log=context.log.info)
        for check_name in ("speedup", "parity", "parent_al", "greedy_output"):
            yield check_result(False, {"not_measured_yet": str(exc)}, check_name=check_name, blocking_severity=dg.AssetCheckSeverity.WARN)
        return
    storage.publish(storage.report(preset.name), log=context.log.info)
    reported = _report_to_tracker(storage.drafter(preset.name), summary.get("steps") or 0, report.to_dict(), context.log)
    hub = _push(context, storage.drafter(preset.name), config) if config.push_to_hub else None
    text = paths.summary.read_text().rstrip("\n")
    context.log.info("\n" + text)
    k_schedule = report.k_schedule_dict()
    plots = {f"plot_{name}": image_markdown(p, name.replace("_", " ")) for name, p in paths.plots.items()}
    yield dg.MaterializeResult(
        metadata={
            **metadata(
                {
                    "offline_al": report.offline.al if report.offline else None,
                    "served_al": report.served.al if report.served else None,
                    "served_per_position": list(report.served.per_position_acceptance) if report.served else None,
                    "speedups": {label: {str(c): s for c, s in v.items()} for label, v in report.speedups.items()},
                    "host_drift": {str(c): d for c, d in host_drift(report.runs).items()},
                    "round_speedups": {label: {str(c): list(v) for c, v in by_c.items()} for label, by_c in round_speedups(report.runs).items()},
                    "against_ngram": {str(c): ratio for c, (ratio, _) in against(report.runs, report.spec_label, NGRAM).items()},
                    "control": {str(c): ratio for c, (ratio, _) in against(report.runs, CONTROL, BASELINE).items()},
                    "recommended_k_schedule": k_schedule["recommended"],
                    "k_schedule_confirmation": k_schedule["confirmation"],
                    "verdict": report.parity.verdict if report.parity else None,
                    "verdict_sentence": report.parity.sentence if report.parity else None,
                    "tracker": reported,
                    "hub": hub,
                }
            ),
            "summary": dg.MetadataValue.md("```\n" + text + "\n```"),
            "report": dg.MetadataValue.path(str(paths.markdown)),
            **plots,
        },
        data_version=dg.DataVersion(hash_files([paths.json])),
    )
    ours = {"speedup": "speedup_above", "parity": "parity_within", "parent_al": "al_not_below_parent", "greedy_output": "greedy_output_equal"}
    for check_name, prefix in ours.items():
        c = next((x for x in report.checks if x.name.startswith(prefix)), None)
        if c is None:  # the greedy check was switched off
            yield check_result(True, {"skipped": "greedy_check is off"}, check_name=check_name, blocking_severity=dg.AssetCheckSeverity.WARN)
            continue
        yield check_result(c.passed, c.to_dict(), check_name=check_name, blocking_severity=dg.AssetCheckSeverity.WARN)


def _report_to_tracker(drafter_dir: Path, step: int, report: dict, log) -> Optional[dict]:
    """The benchmark's figures into the run the training reported to (its tracker.json), at
    the training's last step: one run shows both. A tracker that cannot be reached is said, not
    fatal: the report stands on its own."""
    try:
        return log_to_recorded_run(drafter_dir, step, benchmark_scalars(report))
    except Exception as exc:  # the trackers' clients raise their own types (network, auth, a missing package)
        log.warning(f"the benchmark's figures did not reach the training's tracker: {type(exc).__name__}: {exc}")
        return None


def _push(context: dg.AssetExecutionContext, drafter_dir: Path, config: BenchmarkConfig) -> dict:
    """push_to_hub's step: the drafter published once its blocking checks passed (defs/hub.py);
    a refusal or a failed push is logged as an error and recorded, and the report stays."""
    try:
        commits = push_checked_drafter(context.instance, drafter_dir, config.push_to_hub, private=config.push_private, log=context.log.info)
    except (ValueError, RuntimeError) as exc:
        context.log.error(f"push_to_hub {config.push_to_hub}: {exc}")
        return {"repo_id": config.push_to_hub, "pushed": False, "reason": str(exc)}
    return {"repo_id": config.push_to_hub, "pushed": True, "commits": commits}


def report_path(storage: StorageResource, target: str) -> Path:
    return storage.report(target) / "report.md"
