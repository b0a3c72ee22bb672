"""Parity verdicts on constructed numbers, and the drafter config evidence read from real files."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from eagle_assets.bench.checks import parent_al_check, parity_check
from eagle_assets.bench.metrics import SpecStats
from eagle_assets.bench.parity import (
    AcceptanceNumbers,
    ParityTolerance,
    TrainingFacts,
    Verdict,
    judge_parity,
    read_drafter_facts,
    wiring_findings,
)

TRAINED_IDS = (2, 15, 27)  # project convention for SmolLM2's 30 layers (the engines' defaults)
HEALTHY = AcceptanceNumbers(2.5, (0.8, 0.5, 0.2), 400, "offline reference")


def _drafter(folder: Path, *, with_d2t: bool, **config) -> Path:
    """A drafter folder with a real config.json and model.safetensors (tiny tensors)."""
    folder.mkdir(parents=True)
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "draft_vocab_size": 8,
        "vocab_size": 49152,
        "hidden_size": 576,
        "target_hidden_size": 576,
        "num_hidden_layers": 1,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(TRAINED_IDS)},
    }
    cfg.update(config)
    (folder / "config.json").write_text(json.dumps(cfg))
    tensors = {"fc.weight": torch.zeros(4, 12), "t2d": torch.zeros(16, dtype=torch.bool)}
    if with_d2t:
        tensors["d2t"] = torch.zeros(8, dtype=torch.int64)
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def test_matching_numbers_are_ok():
    served = AcceptanceNumbers(2.42, (0.78, 0.45, 0.19), 380, "served vllm")
    v = judge_parity(HEALTHY, served)
    assert v.verdict == "ok" and v.parity_ok
    assert v.causes == ()
    assert "2.50" in v.sentence and "2.42" in v.sentence


def test_wrong_export_is_engine_wiring_with_the_config_evidence(tmp_path):
    # A SpecForge-numbered export served by vLLM, norm_output on and no d2t: offline 2.5, served 1.1.
    drafter = _drafter(
        tmp_path / "d",
        with_d2t=False,
        norm_output=True,
        eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 14, 26]},
    )
    served = AcceptanceNumbers(1.1, (0.08, 0.02, 0.0), 900, "served vllm")
    v = judge_parity(HEALTHY, served, drafter=drafter, engine="vllm", trained_aux_layer_ids=TRAINED_IDS)

    assert v.verdict == "engine_wiring" and not v.parity_ok
    assert "offline AL 2.50 vs served AL 1.10" in v.sentence
    specific = [c for c in v.causes if c.startswith(("layer ids:", "norm_output", "d2t is missing"))]
    assert len(specific) == 3, v.causes
    assert any("[1, 14, 26]" in c and "[2, 15, 27]" in c for c in specific)
    # Generic causes follow the specific ones: layer numbering, norms, d2t.
    assert any("SGLang adds 1" in c for c in v.causes)
    ev = v.evidence
    assert ev["al_diff"] == pytest.approx(1.1 - 2.5)
    assert ev["per_position_diff"] == pytest.approx([0.08 - 0.8, 0.02 - 0.5, 0.0 - 0.2])
    assert ev["drafter_config"]["norm_output"] is True
    assert ev["drafter_config"]["has_d2t"] is False
    assert ev["drafter_config"]["eagle_config.eagle_aux_hidden_state_layer_ids"] == [1, 14, 26]
    assert Verdict.from_dict(json.loads(json.dumps(v.to_dict()))) == v


def test_engine_wiring_without_a_drafter_still_names_what_to_check():
    v = judge_parity(HEALTHY, AcceptanceNumbers(1.1, (0.1, 0.0, 0.0)))
    assert v.verdict == "engine_wiring"
    joined = " ".join(v.causes)
    for word in ("layer ids", "norm_output", "norm_before_residual", "d2t"):
        assert word in joined


def test_layer_ids_are_judged_in_each_engines_numbering():
    facts = {"eagle_config.eagle_aux_hidden_state_layer_ids": [1, 14, 26]}
    # SGLang adds 1: these ids capture hidden_states 2, 15, 27, exactly what was trained.
    assert wiring_findings(facts, "sglang", TRAINED_IDS, 30) == []
    assert len(wiring_findings(facts, "vllm", TRAINED_IDS, 30)) == 1
    # No ids: both engines fall back to (2, L//2, L-3), right for defaults, wrong otherwise.
    assert wiring_findings({}, "vllm", TRAINED_IDS, 30) == []
    assert "defaults [2, 15, 27]" in wiring_findings({}, "vllm", (3, 15, 27), 30)[0]
    # vLLM prefers the top-level key over eagle_config.
    top = {"eagle_aux_hidden_state_layer_ids (top level)": [2, 15, 27], **facts}
    assert wiring_findings(top, "vllm", TRAINED_IDS, 30) == []


def test_d2t_present_and_clean_config_gives_no_specific_finding(tmp_path):
    facts = read_drafter_facts(_drafter(tmp_path / "d", with_d2t=True))
    assert facts["has_d2t"] is True and facts["has_t2d"] is True
    assert wiring_findings(facts, "vllm", TRAINED_IDS, 30) == []


def test_both_low_means_the_drafter_needs_training():
    v = judge_parity(AcceptanceNumbers(1.2, (0.15, 0.04, 0.01)), AcceptanceNumbers(1.16, (0.13, 0.03, 0.0)))
    assert v.verdict == "drafter_undertrained" and v.parity_ok
    assert "training" in v.sentence
    # Low offline and served even lower: still the drafter first, with the gap said.
    v = judge_parity(AcceptanceNumbers(1.3, (0.2, 0.08, 0.02)), AcceptanceNumbers(1.0, (0.0, 0.0, 0.0)))
    assert v.verdict == "drafter_undertrained" and not v.parity_ok
    assert "further off" in v.sentence


def _summary(val_al, val_accept):
    """The fields of a trainer's summary.json that the verdict reads."""
    return {"val_al": val_al, "val_accept": val_accept, "epochs": 12, "train_samples": 28, "train_tokens": 6218, "steps": 96}


def test_a_weak_drafter_is_told_apart_by_its_training_validation():
    low = (AcceptanceNumbers(1.15, (0.13, 0.01, 0.0)), AcceptanceNumbers(1.15, (0.13, 0.01, 0.0)))
    # Weak on held-out answers of its own corpus too: data or training first.
    weak = TrainingFacts.from_summary(_summary(1.27, [0.2, 0.05, 0.02]))
    v = judge_parity(*low, training=weak)
    assert v.verdict == "drafter_undertrained" and v.parity_ok
    assert "weak on its own kind of prompt too (validation AL 1.27 (p_k 0.20 / 0.05 / 0.02)" in v.sentence
    assert "6,218 tokens, 28 samples, 12 epochs" in v.sentence
    assert v.causes[0].startswith("too few training samples") and v.causes[-1].startswith("the evaluation prompts")
    assert v.evidence["training"]["validation"]["al"] == 1.27
    # Strong on its own kind of prompt: the benchmark's prompts are unlike its training data.
    strong = TrainingFacts.from_summary(_summary(2.7, [0.74, 0.55, 0.42]))
    v = judge_parity(*low, training=strong)
    assert v.verdict == "drafter_undertrained"
    assert "On its own kind of prompt it does well (validation AL 2.70" in v.sentence and "prompt file" in v.sentence
    assert v.causes[0].startswith("the evaluation prompts are far")
    # No validation split in the training: nothing to tell apart, the generic order.
    assert TrainingFacts.from_summary({**_summary(None, None)}) is None
    assert judge_parity(*low).causes[0].startswith("too few training samples")
    # A healthy drafter's verdict does not change; the numbers go into the evidence.
    v = judge_parity(HEALTHY, HEALTHY, training=strong)
    assert v.verdict == "ok" and v.evidence["training"]["epochs"] == 12
    assert TrainingFacts.from_dict(strong.to_dict()) == strong


def test_served_above_offline_is_suspicious():
    v = judge_parity(AcceptanceNumbers(2.0, (0.6, 0.3, 0.1)), AcceptanceNumbers(2.9, (0.8, 0.6, 0.4, 0.1)))
    assert v.verdict == "served_higher" and not v.parity_ok
    assert "K=3" in v.sentence and "K=4" in v.sentence
    assert any("prompts or output length" in c for c in v.causes)


def test_a_single_position_out_of_tolerance_breaks_parity():
    # AL within 15 % but p_1 is 0.15 lower: the per-position check catches it.
    v = judge_parity(HEALTHY, AcceptanceNumbers(2.3, (0.65, 0.45, 0.2)))
    assert v.verdict == "engine_wiring" and not v.parity_ok


def test_tolerance_bounds_are_inclusive_and_configurable():
    tol = ParityTolerance(al_rel=0.125, per_position_abs=0.25)
    offline = AcceptanceNumbers(2.0, (0.5, 0.5))
    assert judge_parity(offline, AcceptanceNumbers(1.75, (0.25, 0.5)), tol).verdict == "ok"  # exactly at both bounds
    assert judge_parity(offline, AcceptanceNumbers(1.75, (0.25, 0.5)), ParityTolerance()).verdict == "engine_wiring"
    assert judge_parity(offline, AcceptanceNumbers(1.5, (0.5, 0.5)), tol).verdict == "engine_wiring"


def test_few_served_drafts_are_flagged_as_noisy():
    v = judge_parity(HEALTHY, AcceptanceNumbers(2.45, (0.8, 0.5, 0.2), num_drafts=5))
    assert v.verdict == "ok" and "Only 5 served drafts" in v.sentence


def test_missing_numbers_raise_with_the_fix():
    with pytest.raises(ValueError, match="no drafts"):
        judge_parity(HEALTHY, AcceptanceNumbers.from_spec_stats(SpecStats(0, 0, 0, (0, 0, 0))))
    with pytest.raises(ValueError, match="reference decoder"):
        judge_parity(AcceptanceNumbers(math.nan), HEALTHY)


def test_numbers_come_from_spec_stats_and_reference_results():
    stats = SpecStats(drafts=20, draft_tokens=60, accepted=30, accepted_per_pos=(15, 9, 6))
    a = AcceptanceNumbers.from_spec_stats(stats, "served vllm")
    assert a == AcceptanceNumbers(2.5, (0.75, 0.45, 0.3), 20, "served vllm")

    @dataclass
    class ReferenceResult:  # the shape of the reference decoder's result
        al: float
        per_position_acceptance: list[float]
        num_drafts: int
        accepted_per_step: list[int]

    r = AcceptanceNumbers.from_result(ReferenceResult(2.5, [0.75, 0.45, 0.3], 20, [1, 2]))
    assert (r.al, r.per_position_acceptance, r.num_drafts) == (2.5, (0.75, 0.45, 0.3), 20)
    # Pooled over prompts by steps, not by averaging per-prompt ALs: 8 steps, 10 accepted.
    prompts = [ReferenceResult(0, [], 2, [3, 3]), ReferenceResult(0, [], 6, [0, 1, 0, 2, 1, 0])]
    pooled = AcceptanceNumbers.from_results(prompts, k=3)
    assert pooled.al == 1 + 10 / 8 and pooled.num_drafts == 8
    assert pooled.per_position_acceptance == (5 / 8, 3 / 8, 2 / 8)
    with pytest.raises(ValueError, match="k=2"):
        AcceptanceNumbers.from_results(prompts, k=2)


def test_parity_and_parent_checks():
    ok = judge_parity(HEALTHY, AcceptanceNumbers(2.42, (0.78, 0.45, 0.19)))
    bad = judge_parity(HEALTHY, AcceptanceNumbers(1.1, (0.1, 0.0, 0.0)))
    assert parity_check(ok).passed and not parity_check(bad).passed
    assert parity_check(bad).metadata["verdict"] == "engine_wiring"
    assert not parity_check(None).passed
    assert parent_al_check(2.5, 2.4).passed
    assert parent_al_check(2.4, 2.4).passed  # "at least" the parent's
    regressed = parent_al_check(2.3, 2.4)
    assert not regressed.passed and "REGRESSED" in regressed.description
    assert parent_al_check(2.0, None).passed  # from scratch: nothing to regress against
    assert not parent_al_check(math.nan, 2.4).passed


def test_shifted_ids_are_wiring_even_when_the_numbers_cannot_show_it(tmp_path):
    # A weak drafter served with ids shifted by one: offline and served both near 1.1, so the
    # numbers alone would say "undertrained"; the config says the engine captures other layers.
    drafter = _drafter(tmp_path / "d", with_d2t=True, eagle_config={"eagle_aux_hidden_state_layer_ids": [3, 16, 28]})
    weak = AcceptanceNumbers(1.12, (0.1, 0.02, 0.0), 300, "offline reference")
    served = AcceptanceNumbers(1.10, (0.09, 0.01, 0.0), 300, "served vllm")
    v = judge_parity(weak, served, drafter=drafter, engine="vllm", trained_aux_layer_ids=TRAINED_IDS)
    assert v.verdict == "engine_wiring" and not v.parity_ok
    assert any("[3, 16, 28]" in c and "[2, 15, 27]" in c for c in v.causes)
    assert parity_check(v).passed is False
