"""The benchmark's settings, declared once.

`BenchmarkSettings` is what `run_benchmark` (bench/benchmark.py) measures with; the benchmark
assets' Dagster settings (defs/benchmark.py) and `eagle-assets bench`'s options (cli.py) take
their defaults from it through `default`, so a default is written here and nowhere else. The
module imports no torch: the command line reads the defaults to build its options.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, field
from typing import Any

from eagle_assets.bench.parity import ParityTolerance
from eagle_assets.bench.served import OFFLINE_REFERENCES, PromptSet, SweepSettings, mt_bench_size, refuse_too_few_prompts
from eagle_assets.engines.k_schedule import KSchedule


@dataclass(frozen=True)
class BenchmarkSettings:
    """What the benchmark measures and how hard."""

    num_prompts: int = 8
    """MT-Bench first turns (evaluation only), or the first of `prompt_set`."""
    output_len: int = 64
    """Tokens per answer, exact (ignore_eos), served and offline alike."""
    concurrencies: tuple[int, ...] = (1, 4, 8)
    k: int = 3
    """Draft tokens per step for EAGLE-3 and n-gram alike; parity and the checks are judged at it."""
    also_k: tuple[int, ...] = ()
    """Also serve the drafter at these K, each its own run (`eagle3 k=2`, ...): which K serves
    fastest depends on the engine's cost of verifying K+1 tokens, so it is measured, not assumed."""
    k_schedule: KSchedule | None = None
    """Also serve the drafter with the K following the batch size (`eagle3 k=1-2:3,3-:0`), as
    vLLM's dynamic speculative decoding does; the report recommends one from the fixed K served."""
    ngram: bool = True
    """Also serve vLLM's n-gram speculation on the same prompts."""
    baseline_again: bool = True
    """Serve no speculation again after the other configurations: the report gives the host's
    drift between the two and compares with their mean (one more server start)."""
    interleave_rounds: int | None = None
    """Serve every configuration from its own server, all up at once, each level in this many
    rounds alternating between them (a drifting host then slows them alike); 0 serves them one
    after another. Interleaved, no speculation is not served again: there is no drift to measure.
    None: `DEFAULT_INTERLEAVE_ROUNDS` (bench/benchmark.py) where every server fits at once, else one after another."""
    control: bool = False
    """Also serve no speculation from a second server (`CONTROL`), interleaved with the rest: an
    A/A control whose tokens/s over the baseline's is the run's noise floor."""
    confirm_schedule: bool = False
    """Where the fixed K served recommend a K schedule (another K at some loads), serve it after
    the sweep beside no speculation and the fixed K it uses, served as the sweep was: the report
    says whether it served as fast as the fastest of them at every level (`bench/k_choice.py`)."""
    offline_prompts: int | None = None
    """Prompts for the offline reference (default: all of them)."""
    offline_reference: str = "auto"
    """"hf": the reference decoder runs the target here in fp32 (it must fit the host);
    "engine": chain drafting replayed over the states an extraction server captures along the
    target's greedy answers from its server (`bench/replay_reference.py`), the target never
    loaded here; "auto": "hf" where the target fits this host, else "engine"."""
    greedy_check: bool = True
    """Compare the drafter's served greedy output with plain greedy, token for token, and read
    the target's top-2 margin where they part (`bench/greedy_check.py`)."""
    served_dtype: str = "float32"
    """The dtype the engine serves in (fp32 on CPU hosts, the model's on GPUs): the near-tie
    threshold of the greedy check depends on it."""
    tolerance: ParityTolerance = field(default_factory=ParityTolerance)
    min_speedup: float = 1.0
    prompt_set: PromptSet | None = None
    """The prompts (`served.user_prompt_set`: a user's own traffic); None: MT-Bench's first turns."""
    request_timeout_s: float = SweepSettings.request_timeout_s
    """A request to a server that makes no progress for this long (no token streamed; for one
    not streamed, this and its tokens at 2 tokens/s) is abandoned, and the benchmark stops
    naming the server; what was measured is kept for a rerun."""

    def __post_init__(self) -> None:
        ks = (self.k, *self.also_k)
        if min(ks) < 1:
            raise ValueError(f"draft tokens per step must be at least 1; got k={self.k}, also_k={list(self.also_k)}")
        if self.interleave_rounds is not None and self.interleave_rounds < 0:
            raise ValueError(f"interleave_rounds={self.interleave_rounds}: give 0 (one configuration after another) or more rounds")
        if self.control and self.interleave_rounds == 0:
            raise ValueError(
                "control=True serves a second server without speculation interleaved with the rest; with "
                "interleave_rounds=0 serve the baseline again at the end instead (baseline_again), "
                "which measures the host's drift over the run"
            )
        if len(set(ks)) != len(ks):
            raise ValueError(f"k={self.k} and also_k={list(self.also_k)} repeat a K: give each K once (k is served anyway)")
        # Checked here, before the offline reference and the servers' starts, not at the first
        # level that cannot be filled.
        refuse_too_few_prompts(self.num_prompts, self.concurrencies, f"num_prompts={self.num_prompts}")
        if self.prompt_set is not None and self.num_prompts > (available := len(self.prompt_set.messages)):
            raise ValueError(f"num_prompts={self.num_prompts}: the prompt set has {available}; give at most {available}")
        if self.prompt_set is None and self.num_prompts > (available := mt_bench_size()):
            raise ValueError(f"num_prompts={self.num_prompts}: MT-Bench has {available} first turns; give at most {available}")
        if not (math.isfinite(self.request_timeout_s) and self.request_timeout_s > 0):
            raise ValueError(f"request_timeout_s={self.request_timeout_s}: give a positive number of seconds")
        if self.offline_reference not in OFFLINE_REFERENCES:
            raise ValueError(f"offline_reference={self.offline_reference!r}: give one of {', '.join(OFFLINE_REFERENCES)}")


def default(name: str) -> Any:
    """The default of `BenchmarkSettings.<name>` (a fresh copy where it is built by a factory)."""
    spec = BenchmarkSettings.__dataclass_fields__[name]
    return spec.default_factory() if spec.default is MISSING else spec.default
