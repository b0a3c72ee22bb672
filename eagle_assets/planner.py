"""The budget planner: disk and hours of a whole run, before any of it starts.

    eagle-assets plan --preset kimi-k2.5 --samples 10000 --tokens-per-sample 1450

    >>> from eagle_assets.planner import estimate
    >>> e = estimate("kimi-k2.5", samples=10_000, tokens_per_sample=1_450)
    >>> round(e.sizes.hidden_state_bytes / 1e9), round(e.generation_hours, 1), round(e.training_hours, 1)
    (832, 5.3, 2.6)

Sizes come from `hidden_states/budget.py`, the same arithmetic that the hidden-state asset uses
for its free-space check, so the plan and the check cannot disagree. Hours come from
throughputs measured on a real run (`Throughputs`: each default says where it was measured);
pass your own where your hardware or target differs. Pure Python: no Dagster, no torch.
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


@dataclass(frozen=True)
class Throughputs:
    """Measured rates that turn sizes into hours. Defaults: the reference Kimi-K2.5 run on 8 GPUs."""

    generation_tokens_per_s: float = _SEED_SAMPLES * _SEED_TOKENS_PER_SAMPLE / (_SEED_GENERATION_HOURS * 3600)
    """Corpus tokens written per second by the target's inference server (prompt + answer).
    Seeds: 10,000 samples x 1,450 tokens in 5.3 h on the Kimi-K2.5 INT4 server (TP 8) = ~760 tok/s."""
    extraction_tokens_per_s: float = 3_165.0
    """Tokens per second through the target's forward pass with the hidden states saved.
    Seeds: 3,165 tok/s measured while extracting the 828 GB."""
    train_tokens_per_gpu_s: float = (
        _SEED_TRAIN_EPOCHS * _SEED_TRAIN_SAMPLES_PER_EPOCH * _SEED_TOKENS_PER_SAMPLE / (_SEED_TRAIN_HOURS * 3600 * _SEED_TRAIN_GPUS)
    )
    """Training tokens per second per GPU (training-time test included). Seeds: 5 epochs of
    9,000 samples x 1,450 tokens in 2.6 h on 8 GPUs = ~871 tok/s per GPU; scaled linearly in GPUs."""


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
    """Caveats to print with the numbers (e.g. throughputs measured on another target)."""

    @property
    def total_hours(self) -> float:
        return self.generation_hours + self.extraction_hours + self.training_hours

    def lines(self) -> list[str]:
        t = self.throughputs
        s = self.sizes
        out = s.lines()
        out.append(f"disk in all (corpus + hidden states): {_human(s.corpus_bytes + s.hidden_state_bytes)}")
        out += [
            f"generation: {_hours(self.generation_hours)} at {t.generation_tokens_per_s:,.0f} corpus tok/s",
            f"extraction: {_hours(self.extraction_hours)} at {t.extraction_tokens_per_s:,.0f} tok/s",
            f"training:   {_hours(self.training_hours)} for {self.epochs} epochs over "
            f"{1 - self.val_fraction:.0%} of the samples on {self.gpus} GPU(s) at {t.train_tokens_per_gpu_s:,.0f} tok/s per GPU",
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
) -> Estimate:
    """Sizes and hours for `samples` of `tokens_per_sample` tokens on `preset`.

    `gpus` defaults to the preset's tensor-parallel size (the host that serves it trains on it).
    """
    p = get_preset(preset) if isinstance(preset, str) else preset
    _require(samples >= 1, f"samples must be at least 1, not {samples}")
    _require(tokens_per_sample >= 1, f"tokens per sample must be at least 1, not {tokens_per_sample}")
    _require(epochs >= 1, f"epochs must be at least 1, not {epochs}")
    _require(0 <= val_fraction < 1, f"the validation fraction must be in [0, 1), not {val_fraction}")
    gpus = p.tensor_parallel_size if gpus is None else gpus
    _require(gpus >= 1, f"gpus must be at least 1, not {gpus}")
    for name, rate in vars(throughputs).items():
        _require(math.isfinite(rate) and rate > 0, f"throughput {name} must be a positive finite number, not {rate}: pass a measured rate")
    sizes = plan(p, samples, tokens_per_sample, num_aux=num_aux)
    train_tokens = epochs * sizes.num_tokens * (1 - val_fraction)
    notes = ()
    if throughputs == Throughputs() and p.name != "kimi-k2.5":
        notes = (f"the default throughputs were measured on Kimi-K2.5 (8 GPUs), not {p.name}: pass your own rates for real hours",)
    return Estimate(
        sizes=sizes,
        throughputs=throughputs,
        epochs=epochs,
        val_fraction=val_fraction,
        gpus=gpus,
        generation_hours=sizes.num_tokens / throughputs.generation_tokens_per_s / 3600,
        extraction_hours=sizes.extraction_hours(throughputs.extraction_tokens_per_s),
        training_hours=train_tokens / (throughputs.train_tokens_per_gpu_s * gpus) / 3600,
        notes=notes,
    )


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
