"""Offline vs served acceptance: is a low acceptance the drafter's fault or the engine's?

The reference decoder (`bench/reference_decoder.py`) replays the engine's exact draft semantics
in PyTorch on the same prompts; the served sweep reads the engine's own counters. When both
agree, the engine runs the drafter as trained. When the engine accepts much less than the
reference while the reference is healthy, the export or the engine wiring is wrong (the
failure that cost the Kimi-K2.5 team a day: 15 % acceptance, 0.66x throughput, and no tool
telling them why). The verdict is one of

    "ok"                    served matches offline within tolerance, and offline is healthy
    "engine_wiring"         served far below a healthy offline: check layer ids, norms, d2t
    "drafter_undertrained"  offline itself is low: the drafter needs more data or training
    "served_higher"         served above offline beyond tolerance: the two do not measure
                            the same thing; check prompts, lengths, K and the checkpoint

with a sentence for a human, the things to check and the evidence: the numbers and the
drafter config values read from its `config.json` (and whether `d2t` is in its weights).

    from eagle_assets.bench.parity import AcceptanceNumbers, judge_parity
    v = judge_parity(AcceptanceNumbers(2.5, (0.8, 0.5, 0.2)), AcceptanceNumbers(1.1, (0.1, 0.0, 0.0)),
                     drafter="/path/to/drafter")
    print(v.verdict, v.sentence)

Pure code: plain numbers and dataclasses in, a `Verdict` out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from eagle_assets.bench.metrics import SpecStats
from eagle_assets.targets import default_aux_layer_ids

VERDICTS = ("ok", "engine_wiring", "drafter_undertrained", "served_higher")

DRAFTER_CONFIG_KEYS = (
    "architectures",
    "draft_vocab_size",
    "vocab_size",
    "hidden_size",
    "target_hidden_size",
    "num_hidden_layers",
    "norm_output",
    "norm_before_residual",
    "norm_before_fc",
    "fc_norm",
    "attention_bias",
    "tie_word_embeddings",
    "bias",
)
"""Drafter config values that change what the engine computes (docs/eagle3-semantics.md, section 7)."""


@dataclass(frozen=True)
class AcceptanceNumbers:
    """Acceptance of one drafter on one prompt set, measured one way (offline or served)."""

    al: float
    """Acceptance length: 1 + accepted / drafts."""
    per_position_acceptance: tuple[float, ...] = ()
    """p_k for k = 1..K: drafts whose k-th token was accepted / drafts."""
    num_drafts: int | None = None
    """Verification steps behind the numbers (their statistical weight)."""
    source: str = ""
    """Where the numbers come from, for the report ("offline reference", "served vllm", ...)."""

    @classmethod
    def from_spec_stats(cls, stats: SpecStats, source: str = "served") -> "AcceptanceNumbers":
        return cls(stats.al, tuple(stats.per_position_acceptance), stats.drafts, source)

    @classmethod
    def from_result(cls, result: object, source: str = "offline reference") -> "AcceptanceNumbers":
        """From any object with `al`, `per_position_acceptance` and `num_drafts` (the reference
        decoder's result has them)."""
        return cls(
            float(result.al),
            tuple(float(p) for p in result.per_position_acceptance),
            getattr(result, "num_drafts", None),
            source,
        )

    @classmethod
    def from_results(cls, results: Sequence[object], k: int, source: str = "offline reference") -> "AcceptanceNumbers":
        """Pooled over several prompts' results, each with `accepted_per_step` (accepted drafts per
        verification step): AL = 1 + all accepted / all steps, p_k = steps accepting >= k / all steps."""
        return cls.from_steps([a for r in results for a in r.accepted_per_step], k, source)

    @classmethod
    def from_steps(cls, accepted_per_step: Sequence[int], k: int, source: str = "offline reference") -> "AcceptanceNumbers":
        """From accepted drafts per verification step: AL = 1 + accepted / steps, p_k = steps
        accepting >= k / steps (NaN when there is no step)."""
        steps = [int(a) for a in accepted_per_step]
        if not steps:
            return cls(math.nan, (math.nan,) * k, 0, source)
        n = len(steps)
        if max(steps) > k:
            raise ValueError(f"a step accepted {max(steps)} drafts but k={k}: pass the K the decoder ran with")
        return cls(1.0 + sum(steps) / n, tuple(sum(a >= j for a in steps) / n for j in range(1, k + 1)), n, source)

    @classmethod
    def from_dict(cls, d: Mapping) -> "AcceptanceNumbers":
        return cls(
            al=_num(d["al"]),
            per_position_acceptance=tuple(_num(p) for p in d.get("per_position_acceptance", ())),
            num_drafts=d.get("num_drafts"),
            source=d.get("source", ""),
        )


def _json_ready(x: AcceptanceNumbers) -> dict:
    d = asdict(x)
    d["per_position_acceptance"] = list(x.per_position_acceptance)
    return d


def _num(x: float | None) -> float:
    return math.nan if x is None else float(x)


def warm_start_origin(summary: Mapping) -> str | None:
    """One line on what a warm start exported, from the trainer's summary; None for a drafter
    trained from scratch (or a summary written before the trainer said)."""
    if not summary.get("warm_start"):
        return None
    if summary.get("finetune_skipped"):
        return f"the parent drafter, {summary['finetune_skipped']}"
    comparison = summary.get("parent_comparison")
    return comparison["sentence"] if comparison else None


@dataclass(frozen=True)
class TrainingFacts:
    """What the drafter's training measured on its own corpus (the trainer's `summary.json`):
    with it, a weak drafter's verdict says whether it is weak on its own kind of prompt too
    (more data or training) or only on the benchmark's (prompts unlike its training data)."""

    validation: AcceptanceNumbers
    """AL and p_k replayed along held-out answers of the training corpus, at the training K."""
    train_samples: int | None = None
    train_tokens: int | None = None
    """Tokens of the training samples, prompts and answers."""
    epochs: int | None = None
    origin: str | None = None
    """For a warm start, which drafter was exported and why: the fine-tune or its parent, with the
    comparison's numbers, or the parent unchanged where the corpus was too small to fine-tune on."""

    @classmethod
    def from_summary(cls, summary: Mapping) -> "TrainingFacts | None":
        """None when the training had no validation split (nothing to compare)."""
        if summary.get("val_al") is None:
            return None
        accept = tuple(summary.get("val_accept") or ())
        validation = AcceptanceNumbers(float(summary["val_al"]), accept, None, "training validation (replayed along held-out corpus answers)")
        return cls(validation, summary.get("train_samples"), summary.get("train_tokens"), summary.get("epochs"), warm_start_origin(summary))

    @classmethod
    def from_dict(cls, d: Mapping) -> "TrainingFacts":
        return cls(AcceptanceNumbers.from_dict(d["validation"]), d.get("train_samples"), d.get("train_tokens"), d.get("epochs"), d.get("origin"))

    def to_dict(self) -> dict:
        return {**asdict(self), "validation": _json_ready(self.validation)}

    def describe(self) -> str:
        v = self.validation
        pk = " / ".join(f"{p:.2f}" for p in v.per_position_acceptance)
        data = [
            f"{self.train_tokens:,} tokens" if self.train_tokens is not None else None,
            f"{self.train_samples:,} samples" if self.train_samples is not None else None,
            f"{self.epochs} epochs" if self.epochs is not None else None,
        ]
        trained = f"; trained on {', '.join(x for x in data if x)}" if any(data) else ""
        return f"validation AL {v.al:.2f} (p_k {pk}) on held-out answers of its own corpus{trained}"


@dataclass(frozen=True)
class ParityTolerance:
    """When served and offline acceptance count as the same, and when a drafter counts as healthy."""

    al_rel: float = 0.15
    """Parity holds when |served AL - offline AL| <= al_rel * offline AL ..."""
    per_position_abs: float = 0.10
    """... and every |served p_k - offline p_k| <= per_position_abs (k present in both)."""
    min_healthy_al: float = 1.5
    """Offline AL below this means the drafter itself is weak (half a token per step or less)."""
    min_drafts: int = 20
    """Fewer served drafts than this make the numbers too noisy to blame anyone; said in the verdict."""


@dataclass(frozen=True)
class Verdict:
    """The parity verdict, a sentence for a human, what to check, and the evidence behind it."""

    verdict: str
    """One of VERDICTS."""
    sentence: str
    parity_ok: bool
    """Served within tolerance of offline (independent of whether the drafter is any good)."""
    causes: tuple[str, ...] = ()
    """Things to check, most likely first."""
    evidence: dict = field(default_factory=dict)
    """The numbers compared and the drafter config values read."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["causes"] = list(self.causes)
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "Verdict":
        d = dict(d)
        d["causes"] = tuple(d.get("causes", ()))
        return cls(**d)


# -- Drafter facts ---------------------------------------------------------------------------


def read_drafter_facts(drafter: str | Path | Mapping) -> dict:
    """The config values that matter to the engine, and whether the weights carry `d2t`/`t2d`.

    `drafter` is a checkpoint folder, a `config.json` path, or an already-read config dict.
    """
    weights_file = None
    if isinstance(drafter, Mapping):
        config = dict(drafter)
    else:
        path = Path(drafter)
        cfg_path = path / "config.json" if path.is_dir() else path
        if not cfg_path.is_file():
            raise FileNotFoundError(f"no drafter config at {cfg_path}: pass the exported checkpoint folder")
        config = json.loads(cfg_path.read_text())
        candidate = cfg_path.parent / "model.safetensors"
        weights_file = candidate if candidate.is_file() else None
    eagle_config = config.get("eagle_config") or {}
    facts = {k: config.get(k) for k in DRAFTER_CONFIG_KEYS if k in config}
    facts["eagle_config.eagle_aux_hidden_state_layer_ids"] = eagle_config.get("eagle_aux_hidden_state_layer_ids")
    facts["eagle_aux_hidden_state_layer_ids (top level)"] = config.get("eagle_aux_hidden_state_layer_ids")
    for k in ("norm_before_fc", "use_aux_hidden_state"):
        if k in eagle_config:
            facts[f"eagle_config.{k}"] = eagle_config[k]
    if weights_file is not None:
        from safetensors import safe_open

        with safe_open(str(weights_file), framework="pt") as f:
            names = set(f.keys())
        facts["has_d2t"] = "d2t" in names
        facts["has_t2d"] = "t2d" in names
    return facts


def _served_layer_ids(facts: Mapping, engine: str) -> list[int] | None:
    """The ids the engine reads (vLLM: top-level key first, then eagle_config; SGLang: eagle_config)."""
    top = facts.get("eagle_aux_hidden_state_layer_ids (top level)")
    nested = facts.get("eagle_config.eagle_aux_hidden_state_layer_ids")
    ids = nested if engine == "sglang" else (top or nested)
    return list(ids) if ids else None


def wiring_findings(
    facts: Mapping,
    engine: str = "vllm",
    trained_aux_layer_ids: Sequence[int] | None = None,
    target_num_layers: int | None = None,
    target_vocab_size: int | None = None,
) -> list[str]:
    """Config values that would make the engine compute something else than what was trained.

    `trained_aux_layer_ids` are in the project's convention (HF `hidden_states` index = r_k).
    vLLM reads config ids as that index; SGLang's llama adds 1 (config id k -> r_{k+1}).
    """
    found = []
    ids = _served_layer_ids(facts, engine)
    if trained_aux_layer_ids is not None:
        trained = sorted(int(i) for i in trained_aux_layer_ids)
        if ids is None:
            if target_num_layers is not None:
                served = sorted(default_aux_layer_ids(target_num_layers))
                if served != trained:
                    found.append(
                        f"layer ids: the config names none, so {engine} captures its defaults "
                        f"{served} but the drafter was trained on {trained}; write them into "
                        "eagle_config.eagle_aux_hidden_state_layer_ids"
                    )
        else:
            served = sorted(int(i) + 1 for i in ids) if engine == "sglang" else sorted(int(i) for i in ids)
            if served != trained:
                shift = " (SGLang adds 1 to each id)" if engine == "sglang" else " (vLLM reads them as HF hidden_states indices)"
                found.append(
                    f"layer ids: config ids {sorted(ids)} make {engine} capture hidden_states "
                    f"{served}{shift}, but the drafter was trained on {trained}"
                )
    if facts.get("norm_output"):
        found.append(
            "norm_output is true: the engine feeds the post-norm state back at draft steps 2..K "
            "where training fed the pre-norm state; export norm_output false"
        )
    if facts.get("norm_before_residual"):
        found.append(
            "norm_before_residual is true: vLLM then takes the normed hidden state as the residual "
            "(SGLang ignores the key); our training keeps the raw one, export it false"
        )
    if facts.get("norm_before_fc") or facts.get("eagle_config.norm_before_fc") or facts.get("fc_norm"):
        found.append("norm_before_fc/fc_norm is set: the engine normalises the aux states before fc, training did not")
    if facts.get("attention_bias"):
        found.append("attention_bias is true: vLLM adds q/k/v/o biases (zeros or missing in the weights); export it false")
    if engine == "sglang" and facts.get("tie_word_embeddings"):
        found.append("tie_word_embeddings is true: SGLang replaces the drafter's lm_head by the embeddings")
    draft_vocab = facts.get("draft_vocab_size")
    vocab = target_vocab_size or facts.get("vocab_size")
    if facts.get("has_d2t") is False and draft_vocab and (vocab is None or draft_vocab != vocab):
        found.append(
            "d2t is missing from model.safetensors: vLLM keeps it all zeros, so draft id i is "
            "read as target id i (SGLang: identity); re-export with d2t"
        )
    archs = facts.get("architectures")
    if archs and "Eagle3" not in "".join(archs):
        found.append(f"architectures is {archs}: the engines expect LlamaForCausalLMEagle3")
    return found


GENERIC_WIRING_CAUSES = (
    "layer ids and their numbering: vLLM reads eagle_aux_hidden_state_layer_ids as the HF "
    "hidden_states index (id k = output of k layers); SGLang adds 1; SpecForge ids need +1 for vLLM",
    "norms: norm_output must be false (else the post-norm state is fed back); norm_before_residual false",
    "d2t: saved in model.safetensors with target_id = draft_id + d2t[draft_id] (missing -> zeros in vLLM)",
    "the served checkpoint is the one evaluated offline (same folder, same export)",
)


# -- The verdict -----------------------------------------------------------------------------


def position_diffs(offline: AcceptanceNumbers, served: AcceptanceNumbers) -> list[float]:
    """served p_k - offline p_k for the positions both have."""
    n = min(len(offline.per_position_acceptance), len(served.per_position_acceptance))
    return [served.per_position_acceptance[k] - offline.per_position_acceptance[k] for k in range(n)]


def within_tolerance(offline: AcceptanceNumbers, served: AcceptanceNumbers, tol: ParityTolerance) -> bool:
    """|AL diff| <= al_rel * offline AL and every compared |p_k diff| <= per_position_abs."""
    if not (math.isfinite(offline.al) and math.isfinite(served.al)):
        return False
    if abs(served.al - offline.al) > tol.al_rel * offline.al:
        return False
    return all(abs(d) <= tol.per_position_abs for d in position_diffs(offline, served))


def judge_parity(
    offline: AcceptanceNumbers,
    served: AcceptanceNumbers,
    tolerance: ParityTolerance = ParityTolerance(),
    drafter: str | Path | Mapping | None = None,
    engine: str = "vllm",
    trained_aux_layer_ids: Sequence[int] | None = None,
    target_num_layers: int | None = None,
    target_vocab_size: int | None = None,
    training: TrainingFacts | None = None,
) -> Verdict:
    """Compare offline and served acceptance of one drafter on the same prompts; see the module doc.

    `training` (the trainer's validation on its own corpus) tells a weak drafter's two causes
    apart: weak there too (more data or training) or weak only on these prompts.

    `drafter` (folder, config.json or dict) adds its config values to the evidence and, for an
    engine-wiring verdict, the specific values that look wrong. `trained_aux_layer_ids` (project
    convention) lets the layer-id check say whether the engine captures what training saw.
    """
    if not math.isfinite(offline.al):
        raise ValueError("offline AL is not a number: the reference decoder made no drafts; run it on more prompts")
    if not math.isfinite(served.al):
        raise ValueError(
            "served AL is not a number: the server counted no drafts. Is speculation on (a 'baseline' "
            "run has none) and did the load reach the decode phase?"
        )
    tol = tolerance
    diffs = position_diffs(offline, served)
    parity_ok = within_tolerance(offline, served, tol)
    facts = read_drafter_facts(drafter) if drafter is not None else {}
    evidence = {
        "offline": _json_ready(offline),
        "served": _json_ready(served),
        "al_diff": served.al - offline.al,
        "al_ratio": served.al / offline.al,
        "al_tolerance": tol.al_rel * offline.al,
        "per_position_diff": diffs,
        "per_position_tolerance": tol.per_position_abs,
        "min_healthy_al": tol.min_healthy_al,
        "engine": engine,
        "drafter_config": facts,
        "training": training.to_dict() if training else None,
    }
    k_off, k_srv = len(offline.per_position_acceptance), len(served.per_position_acceptance)
    k_note = f" Offline used K={k_off} but the server K={k_srv}; compare at the same K." if k_off and k_srv and k_off != k_srv else ""
    noise = ""
    if served.num_drafts is not None and served.num_drafts < tol.min_drafts:
        noise = f" Only {served.num_drafts} served drafts: serve more tokens before trusting this."
    nums = f"offline AL {offline.al:.2f} vs served AL {served.al:.2f}"
    # Which way parity fails: by AL when AL is out of tolerance, else by the worst position.
    if abs(served.al - offline.al) > tol.al_rel * offline.al:
        served_above = served.al > offline.al
    else:
        served_above = bool(diffs) and max(diffs, key=abs) > 0

    if not parity_ok and served_above:
        causes = (
            "the served prompts or output length differ from the offline ones (fixed-length "
            "generation with ignore_eos runs into repetitive text that is easy to draft)",
            "the served K is larger than the offline K" + (f" (offline {k_off}, served {k_srv})" if k_off != k_srv else ""),
            "the served checkpoint is not the one evaluated offline",
            "the server samples (temperature > 0) or runs another method (n-gram) than the reference",
            "the reference decoder's semantics drift from the engine's (docs/eagle3-semantics.md)",
        )
        return Verdict(
            "served_higher",
            f"The server accepts more than the offline reference ({nums}): suspicious, the two do not "
            f"measure the same thing; check prompts, lengths, K and the checkpoint.{k_note}{noise}",
            parity_ok,
            causes,
            evidence,
        )

    # A config value that makes the engine compute another function than the one trained is a
    # wiring fault whatever the numbers say: with a weak drafter, or layers whose states are
    # close, the numbers alone may not show it.
    definite = wiring_findings(facts, engine, trained_aux_layer_ids, target_num_layers, target_vocab_size) if facts else []
    if definite:
        return Verdict(
            "engine_wiring",
            f"The served export is wired differently from the drafter as trained ({'; '.join(definite)}); "
            f"{nums}. Fix the export before judging the drafter.{k_note}{noise}",
            False,
            tuple(definite) + GENERIC_WIRING_CAUSES,
            evidence,
        )
    if offline.al < tol.min_healthy_al:
        gap = "" if parity_ok else f" (and the server is further off: {nums})"
        too_little = "too few training samples or tokens for this target"
        own_template = "training data not drawn from the target's own responses (or a different chat template)"
        too_short = "too few epochs, or the validation loss had not converged"
        far = "the evaluation prompts are far from the training distribution"
        if training is None:
            why = "It needs more or more relevant training data, or more training (epochs, a warm start from a stronger parent)"
            causes = (too_little, own_template, too_short, far)
        elif training.validation.al < tol.min_healthy_al:
            why = (
                f"It is weak on its own kind of prompt too ({training.describe()}): it needs more training "
                "data or more training (epochs, a warm start from a stronger parent)"
            )
            causes = (too_little, too_short, own_template, far)
        else:
            why = (
                f"On its own kind of prompt it does well ({training.describe()}), so these prompts are unlike "
                "what it trained on: train on prompts like them (a prompt file of your traffic, or Magpie "
                "openings that steer towards them)"
            )
            causes = (far, own_template, too_little, too_short)
        return Verdict(
            "drafter_undertrained",
            f"The drafter itself is weak: offline AL {offline.al:.2f} is below {tol.min_healthy_al:.2f} on "
            f"these prompts{gap}. {why}; the engine is not the first suspect.{k_note}{noise}",
            parity_ok,
            causes,
            evidence,
        )

    if not parity_ok:
        specific = wiring_findings(facts, engine, trained_aux_layer_ids, target_num_layers, target_vocab_size)
        where = (
            f" The drafter config shows: {'; '.join(specific)}."
            if specific
            else (
                " Nothing in the drafter config stands out; check each item below on the engine actually installed."
                if facts
                else " Pass the drafter folder to check its config values."
            )
        )
        return Verdict(
            "engine_wiring",
            f"The engine runs the drafter worse than the reference decoder does ({nums}, "
            f"{served.al / offline.al:.0%} of offline) while offline acceptance is healthy: the export or "
            f"the engine wiring is wrong, not the drafter.{where}{k_note}{noise}",
            parity_ok,
            tuple(specific) + GENERIC_WIRING_CAUSES,
            evidence,
        )

    return Verdict(
        "ok",
        f"Served acceptance matches the offline reference ({nums}, per-position within "
        f"{tol.per_position_abs:.2f}): the engine runs the drafter as trained.{k_note}{noise}",
        parity_ok,
        (),
        evidence,
    )
