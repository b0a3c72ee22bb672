"""The budget planner: disk and hours of a whole run, before any of it starts.

    eagle-assets plan --preset kimi-k2.5 --samples 10000 --tokens-per-sample 1450

    >>> from eagle_assets.planner import estimate
    >>> e = estimate("kimi-k2.5", samples=10_000, tokens_per_sample=1_450)
    >>> round(e.sizes.hidden_state_bytes / 1e9), round(e.extraction_hours, 2), round(e.training_hours, 2), e.target_loads
    (1455, 0.15, 0.21, 3)
    >>> round(estimate("kimi-k2.5", samples=10_000, tokens_per_sample=1_450, num_aux=3).sizes.hidden_state_bytes / 1e9)
    832

Sizes come from `hidden_states/budget.py`, the same arithmetic that the hidden-state asset uses
for its free-space check, so the plan and the check cannot disagree. Hours include the target's
loads: each server of a Kimi-sized target takes ~22 minutes to start, and a run starts three,
one at a time (`TARGET_LOADS`). Hours come from
throughputs (`default_rates`: at Kimi-K2.5's shape, this project's measurements on an H200, and
each plan says where every rate comes from); pass your own where your hardware or target
differs. docs/kimi-k2.5.md reads a plan for an 8-GPU host and a cluster. Pure Python: no
Dagster, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from eagle_assets.hidden_states.budget import Plan, _human, plan
from eagle_assets.targets import TargetPreset, get_preset

# The reference Kimi-K2.5 run: a drafter trained on 8 GPUs from 10,000 samples of ~1,450 tokens.
_SEED_SAMPLES = 10_000
_SEED_TOKENS_PER_SAMPLE = 1_450
_SEED_GENERATION_HOURS = 5.3
_SEED_TRAIN_EPOCHS = 5
_SEED_TRAIN_SAMPLES_PER_EPOCH = 9_000  # 1,000 of the 10,000 held out for validation
_SEED_TRAIN_HOURS = 2.6
_SEED_TRAIN_GPUS = 8
REFERENCE_GENERATION_TOK_S = _SEED_SAMPLES * _SEED_TOKENS_PER_SAMPLE / (_SEED_GENERATION_HOURS * 3600)
"""The reference run's corpus tokens per second from its Kimi-K2.5 INT4 server (TP 8): ~760."""
REFERENCE_EXTRACTION_TOK_S = 3_165.0
"""The reference run's extraction rate while writing its 828 GB."""
REFERENCE_TRAIN_TOK_S_PER_GPU = (
    _SEED_TRAIN_EPOCHS * _SEED_TRAIN_SAMPLES_PER_EPOCH * _SEED_TOKENS_PER_SAMPLE / (_SEED_TRAIN_HOURS * 3600 * _SEED_TRAIN_GPUS)
)
"""The reference run's training tokens per second per GPU: ~871."""

# Rates measured by this project's benchmarks at Kimi-K2.5's shape on one H200 (bf16):
KIMI_FORWARD_TOK_S_PER_GPU = 3_467.0
"""Kimi-K2.5's 61 layers through one GPU with Hugging Face, experts grouped
(docs/kimi-k2.5.md)."""
KIMI_DRAFTER_TRAIN_TOK_S_PER_GPU = 11_004.0
"""A drafter of Kimi-K2.5's width, 7 TTT steps, T=2048, our trainer
(docs/kimi-k2.5.md)."""
MEASURED_SHAPES = ("kimi-k2.5",)
EXTRACTION_SOURCES = ("engine", "hf")

LOAD_MINUTES = {"kimi-k2.5": 22.0}
"""Minutes one server of the target takes to start on the seeds' host: 547 GB of INT4 Kimi-K2.5
read by 8 GPUs at ~0.4 GB/s (engines/vllm_launch.py, SLOW_WEIGHT_READ_BYTES_PER_S)."""
TARGET_LOADS = (
    ("the extraction server", "the corpus's hidden states and the benchmark prompts' greedy answers with theirs"),
    ("the target alone", "the benchmark's baseline"),
    ("the target with the drafter", "the benchmark's speculative sweep; it stays up to serve"),
)
"""The target servers a run starts on one host, one at a time (docs/kimi-k2.5.md): the corpus
comes from the server already serving, and nothing else loads the target."""


@dataclass(frozen=True)
class Throughputs:
    """Rates that turn sizes into hours; None takes the target's default (`default_rates`)."""

    generation_tokens_per_s: float | None = None
    """Corpus tokens written per second by one serving replica of the target (prompt + answer)."""
    extraction_tokens_per_s: float | None = None
    """Tokens per second through one replica's forward pass with the hidden states saved."""
    train_tokens_per_gpu_s: float | None = None
    """Training tokens per second per GPU (training-time test included); scaled linearly in GPUs."""


def default_rates(preset: TargetPreset, extraction: str) -> tuple[Throughputs, tuple[str, ...]]:
    """The rates a plan uses where none are given, and where each comes from.

    At Kimi-K2.5's shape they are measured here, except generation: no serving engine for it runs
    on the hardware here, so that rate is the reference run's. Engine extraction runs the target
    tensor-parallel, every GPU of the replica on each batch: the measured per-GPU forward times
    the replica's GPUs (an upper bound: the engine's all-reduces are not counted, nor its INT4
    kernels). Hugging Face extraction spreads layers over the GPUs (device_map), one busy at a
    time: one GPU's forward. Other targets take the reference run's rates, said in the notes."""
    if preset.name in MEASURED_SHAPES:
        tp = preset.tensor_parallel_size
        extract = KIMI_FORWARD_TOK_S_PER_GPU * (tp if extraction == "engine" else 1)
        rates = Throughputs(REFERENCE_GENERATION_TOK_S, extract, KIMI_DRAFTER_TRAIN_TOK_S_PER_GPU)
        return rates, (
            f"generation: the reference run's {REFERENCE_GENERATION_TOK_S:,.0f} corpus tok/s per replica (not measured here: "
            "no Kimi-K2.5 engine runs on this hardware); pass --generation-tok-s from your server",
            f"extraction ({extraction}): {KIMI_FORWARD_TOK_S_PER_GPU:,.0f} tok/s per GPU measured at Kimi-K2.5's shape on one H200"
            + (
                f", x {tp} GPUs of a tensor-parallel replica (an upper bound)"
                if extraction == "engine"
                else ", one GPU busy at a time under device_map; its bf16 weights (~2 TB) do not fit one host of 8 H200s"
            ),
            f"training: {KIMI_DRAFTER_TRAIN_TOK_S_PER_GPU:,.0f} tok/s per GPU measured for a Kimi-K2.5-sized drafter on one H200 "
            f"(the reference run trained at {REFERENCE_TRAIN_TOK_S_PER_GPU:,.0f})",
        )
    rates = Throughputs(REFERENCE_GENERATION_TOK_S, REFERENCE_EXTRACTION_TOK_S, REFERENCE_TRAIN_TOK_S_PER_GPU)
    return rates, (f"the default throughputs are the reference Kimi-K2.5 run's (8 GPUs), not {preset.name}'s: pass your own rates for real hours",)


@dataclass(frozen=True)
class Estimate:
    """A run's sizes and hours: what `eagle-assets plan` prints."""

    sizes: Plan
    """Corpus and hidden-state bytes (`hidden_states.budget.plan`)."""
    throughputs: Throughputs
    epochs: int
    """Training epochs over the training split."""
    val_fraction: float
    """Share of samples held out for validation (not trained on)."""
    gpus: int
    """GPUs the drafter trains on."""
    generation_hours: float
    """Hours to generate the corpus at `throughputs.generation_tokens_per_s`."""
    extraction_hours: float
    """Hours to extract the hidden states at `throughputs.extraction_tokens_per_s`."""
    training_hours: float
    """Hours to train `epochs` over the training split on `gpus` GPUs."""
    notes: tuple[str, ...] = field(default=())
    """Where each rate comes from, and caveats to print with the numbers."""
    replicas: int = 1
    """Serving replicas generating and extracting side by side (one per host of tensor-parallel GPUs)."""
    extraction: str = "engine"
    """Which source extracts the states: "engine" or "hf"."""
    target_loads: int = len(TARGET_LOADS)
    """Target servers started, one at a time, on each serving host (`TARGET_LOADS`)."""
    load_minutes: float | None = None
    """Minutes one load takes (`LOAD_MINUTES`, or given); None: unknown, not counted in the total."""

    @property
    def load_hours(self) -> float:
        return self.target_loads * (self.load_minutes or 0.0) / 60

    @property
    def total_hours(self) -> float:
        return self.generation_hours + self.extraction_hours + self.training_hours + self.load_hours

    def lines(self) -> list[str]:
        t = self.throughputs
        s = self.sizes
        out = s.lines()
        out.append(f"disk in all (corpus + hidden states): {_human(s.corpus_bytes + s.hidden_state_bytes)}")
        out += [
            f"generation: {_hours(self.generation_hours)} at {t.generation_tokens_per_s:,.0f} corpus tok/s x {self.replicas} replica(s)",
            f"extraction: {_hours(self.extraction_hours)} at {t.extraction_tokens_per_s:,.0f} tok/s x {self.replicas} replica(s) ({self.extraction})",
            f"training:   {_hours(self.training_hours)} for {self.epochs} epochs over "
            f"{1 - self.val_fraction:.0%} of the samples on {self.gpus} GPU(s) at {t.train_tokens_per_gpu_s:,.0f} tok/s per GPU",
            (
                f"loads:      {_hours(self.load_hours)} for {self.target_loads} target loads of {self.load_minutes:.0f} min, one server at a time "
                if self.load_minutes
                else f"loads:      {self.target_loads} target loads, one server at a time (pass --load-minutes for their hours) "
            )
            + f"({'; '.join(f'{who}: {why}' for who, why in TARGET_LOADS)})",
            f"total:      {_hours(self.total_hours)}",
        ]
        return out + [f"note: {n}" for n in self.notes]

    def render(self) -> str:
        return "\n".join(self.lines())


def _hours(h: float) -> str:
    return f"{h:6.2f} h" if h >= 0.1 else f"{h * 60:6.1f} min"


def estimate(
    preset: str | TargetPreset,
    samples: int,
    tokens_per_sample: int,
    throughputs: Throughputs = Throughputs(),
    epochs: int = _SEED_TRAIN_EPOCHS,
    val_fraction: float = 0.1,
    gpus: int | None = None,
    num_aux: int | None = None,
    replicas: int = 1,
    extraction: str | None = None,
    load_minutes: float | None = None,
) -> Estimate:
    """Sizes and hours for `samples` of `tokens_per_sample` tokens on `preset`.

    `gpus` (training) defaults to the preset's tensor-parallel size times `replicas` (the hosts
    that serve it train on it); `replicas` serving replicas generate and extract side by side;
    `extraction` defaults to the engine where the target needs several GPUs, else Hugging Face;
    `load_minutes`, the minutes one target server takes to start, to the seeds' host's for a
    target measured there (`LOAD_MINUTES`).
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    _require(samples >= 1, f"samples must be at least 1, not {samples}")
    _require(tokens_per_sample >= 1, f"tokens per sample must be at least 1, not {tokens_per_sample}")
    _require(epochs >= 1, f"epochs must be at least 1, not {epochs}")
    _require(0 <= val_fraction < 1, f"the validation fraction must be in [0, 1), not {val_fraction}")
    _require(replicas >= 1, f"replicas must be at least 1, not {replicas}")
    _require(load_minutes is None or (math.isfinite(load_minutes) and load_minutes >= 0), f"load minutes must be 0 or more, not {load_minutes}")
    extraction = extraction or ("engine" if p.tensor_parallel_size > 1 else "hf")
    _require(extraction in EXTRACTION_SOURCES, f"extraction must be one of {', '.join(EXTRACTION_SOURCES)}, not {extraction!r}")
    gpus = p.tensor_parallel_size * replicas if gpus is None else gpus
    _require(gpus >= 1, f"gpus must be at least 1, not {gpus}")
    for name, rate in vars(throughputs).items():
        _require(
            rate is None or (math.isfinite(rate) and rate > 0),
            f"throughput {name} must be a positive finite number, not {rate}: pass a measured rate",
        )
    defaults, sources = default_rates(p, extraction)
    if num_aux is None and p.parent_drafter:
        # A warm start from an unmarked parent keeps both readings' layers until training has
        # measured which one the parent was trained at (drafter/train.py).
        ids = p.default_aux_layer_ids
        num_aux = len(set(ids) | {i + 1 for i in ids if i < p.num_layers})
        sources = (
            *sources,
            f"hidden states at {num_aux} aux layers: a warm start from {p.parent_drafter}, whose layer ids carry no "
            "numbering, keeps the layers of both readings (as written and one up) until training measures which it was trained at",
        )
    given = {k: v for k, v in vars(throughputs).items() if v is not None}
    rates = Throughputs(**{**vars(defaults), **given})
    notes = tuple(line for line in sources if not any(line.startswith(_RATE_LINE[k]) for k in given))
    sizes = plan(p, samples, tokens_per_sample, num_aux=num_aux)
    train_tokens = epochs * sizes.num_tokens * (1 - val_fraction)
    return Estimate(
        sizes=sizes,
        throughputs=rates,
        epochs=epochs,
        val_fraction=val_fraction,
        gpus=gpus,
        generation_hours=sizes.num_tokens / (rates.generation_tokens_per_s * replicas) / 3600,
        extraction_hours=sizes.extraction_hours(rates.extraction_tokens_per_s * replicas),
        training_hours=train_tokens / (rates.train_tokens_per_gpu_s * gpus) / 3600,
        notes=notes,
        replicas=replicas,
        extraction=extraction,
        load_minutes=LOAD_MINUTES.get(p.name) if load_minutes is None else load_minutes,
    )


# Which source line a given rate replaces.
_RATE_LINE = {"generation_tokens_per_s": "generation", "extraction_tokens_per_s": "extraction", "train_tokens_per_gpu_s": "training"}


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
