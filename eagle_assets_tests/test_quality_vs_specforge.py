"""benchmarks/quality_vs_specforge.py: our recipe against SpecForge 0.2.0's on the same shards.

The GPU run cannot happen here; `--smoke` runs every stage on CPU end to end (a tiny random
target, synthetic shards, our training, SpecForge's model and optimiser without its Triton
loss, the mapping, both exports, the logits check, validation and the reference decoder on 2
prompts), and is run twice: the second run must reuse every stage. The pieces the GPU run
relies on and the smoke cannot show (the schedule past warm-up, a mapping that drops or
misplaces a weight) are checked on their own.

SpecForge comes from its PyPI wheel in `.whl/` (fetched once with pip, as the embedded target
is; the GPU host has no network, so the same wheel travels there).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from eagle_assets_tests.scripts import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "quality_vs_specforge.py"


@pytest.fixture(scope="module")
def specforge_wheel() -> Path:
    """SpecForge 0.2.0's wheel in `.whl/` (downloaded without its dependencies when absent)."""
    wheels = sorted((ROOT / ".whl").glob("specforge-0.2.0-*.whl"))
    if not wheels:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "specforge==0.2.0", "-d", str(ROOT / ".whl")],
            capture_output=True,
            text=True,
        )
        wheels = sorted((ROOT / ".whl").glob("specforge-0.2.0-*.whl"))
        if not wheels:
            pytest.fail(f"could not fetch SpecForge's wheel (pip download --no-deps specforge==0.2.0 -d .whl): {proc.stderr[-500:]}")
    return wheels[0]


@pytest.fixture(scope="module")
def script(specforge_wheel):
    return load_script(SCRIPT)


@pytest.fixture(scope="module")
def sf(script):
    sf, why = script.import_specforge(training=False)
    assert sf is not None, why
    return sf


def run_script(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("TRITON_INTERPRET", None)  # SpecForge's CPU training stays off: the smoke shows the skip
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


def run_smoke(data: Path, out: Path) -> subprocess.CompletedProcess:
    return run_script("--smoke", "--data", str(data), "--out", str(out))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory, smollm2_path, specforge_wheel):
    """The smoke run, then the same command again. Yields (first, second, data, out, report)."""
    root = tmp_path_factory.mktemp("vs_specforge")
    data, out = root / "data", root / "out"
    first = run_smoke(data, out)
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    report = json.loads((out / "quality_vs_specforge.json").read_text())
    second = run_smoke(data, out)
    assert second.returncode == 0, second.stdout[-4000:] + second.stderr[-4000:]
    return first, second, data, out, report


def test_smoke_report_holds_both_sides_measured_alike(smoke):
    first, _, data, _, r = smoke
    k = r["offline_settings"]["k"]
    assert r["smoke"] and r["total_steps"] == r["plan"]["total_steps"] >= 2
    ours, sf = r["ours"], r["specforge"]
    assert ours["trained"] and ours["steps"] == r["total_steps"] and ours["epochs"] == r["epochs"] == 2
    assert ours["tokens_per_s"] > 0 and ours["timing"]["warmup_steps_skipped"] == 1
    assert ours["timing"]["steps_timed"] + ours["timing"]["outlier_steps"] == r["total_steps"] - 1
    # On this CPU SpecForge's loss (a Triton kernel) cannot run: said so, not timed, and its
    # measured weights are the shared initial ones.
    assert not sf["trained"] and "triton" in sf["why_not_trained"].lower() and sf["tokens_per_s"] is None
    assert r["tokens_per_s_ratio"] is None and r["goal"]["speed_ratio_at_least_1.3"] is None
    assert any("SpecForge training" in s for s in r["skipped"]) and any("flex_attention" in s for s in r["skipped"])
    for side in (ours, sf):
        assert side["offline"]["prompts"] == 2 and side["offline"]["output_len"] == 16 and side["offline"]["k"] == k
        p = side["offline_p_k"]
        assert len(p) == k and all(1 >= a >= b >= 0 for a, b in zip(p, p[1:]))
        assert side["offline_al"] == pytest.approx(1 + sum(p))
        assert len(side["val_p_k"]) == k and side["val_al"] == pytest.approx(1 + sum(side["val_p_k"]))
    check = r["logits_check"]
    assert check["ok"] and check["backends"]["sdpa"]["max_abs_diff"] <= 1e-3 * check["backends"]["sdpa"]["max_abs_logit"]
    assert check["backends"]["sdpa"]["argmax_agreement"] == 1.0
    assert r["weights_mapped"]["mapped_tensors"] == r["weights_mapped"]["our_tensors"] == 15
    assert r["schedule"]["max_abs_diff_in_warmup"] == 0.0 and r["schedule"]["betas"] == [0.9, 0.95]
    assert len(r["differences"]) >= 8 and r["incomplete"] == [] and r["failed"] == []
    assert first.stdout.rstrip().splitlines()[-1].startswith("goal (offline AL >= SpecForge's")  # the table ends the output


def test_smoke_exports_load_and_hold_what_each_side_trained(smoke, script):
    from safetensors.torch import load_file

    from eagle_assets.drafter.export import load_drafter
    from eagle_assets.hidden_states.vocab import load_vocab_mapping

    _, _, data, out, _ = smoke
    work = data / "vs_specforge"
    initial = load_file(str(work / "init" / script.INITIAL_WEIGHTS))
    mapping = load_vocab_mapping(data / "vocab_mapping.safetensors")
    models = {}
    for side in ("ours", "specforge"):
        model, config = load_drafter(out / f"{side}-vllm")
        assert torch.equal(model.d2t, mapping.d2t.long()) and torch.equal(model.t2d, mapping.t2d.bool())
        assert config.aux_layer_ids == (2, 4, 5) and config.draft_vocab_size == 256
        models[side] = model.trainable_state_dict()
    # SpecForge's untrained weights went through its model, the mapping and our exporter unchanged.
    assert all(torch.equal(models["specforge"][k], v.float()) for k, v in initial.items())
    # Ours trained from the same start and moved.
    assert any(not torch.equal(models["ours"][k], v.float()) for k, v in initial.items())


def test_rerun_reuses_every_stage(smoke):
    first, second, _, out, report = smoke
    log = second.stdout
    assert "ours: trained earlier (4 steps), reused" in log
    for stage in ("init", "export", "check", "validate", "offline"):
        assert f"{stage}: done earlier, reused" in log
    assert "training 4 steps" not in second.stderr + log
    again = json.loads((out / "quality_vs_specforge.json").read_text())
    for key in ("ours", "specforge", "logits_check", "schedule", "plan"):
        assert {k: v for k, v in again[key].items() if k != "seconds"} == {k: v for k, v in report[key].items() if k != "seconds"}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's: a scheduler stepped without optimiser steps, on purpose
def test_deadline_stops_what_cannot_finish_and_says_run_again(tmp_path, smollm2_path, specforge_wheel):
    """Under --deadline-s a stage that needs more time than is left does not start, the report
    says what is incomplete and the exit status is 3; a training that meets its deadline before
    its first step writes no checkpoint (a rerun starts from the initial weights) and exits 3."""
    data = tmp_path / "data"
    short = run_script("--smoke", "--data", str(data), "--deadline-s", "50")
    assert short.returncode == 3, short.stdout[-3000:] + short.stderr[-3000:]
    assert "ours: not started, " in short.stdout and "left before the deadline" in short.stdout
    assert short.stdout.rstrip().splitlines()[-1].startswith("incomplete: ours, specforge")
    report = json.loads((data / "vs_specforge" / "quality_vs_specforge.json").read_text())
    assert report["stages"] == {"init": True} and report["incomplete"][:2] == ["ours", "specforge"]
    worker = run_script("--data", str(data), "--device", "cpu", "--worker", "ours", "--worker-deadline", "0")
    assert worker.returncode == 3 and "ours: deadline at step 0" in worker.stdout, worker.stdout[-2000:] + worker.stderr[-2000:]
    assert not list((data / "vs_specforge" / "ours" / "checkpoints").glob("step-*"))


def test_specforge_schedule_matches_ours_through_warmup_and_cosine(script, sf):
    """BF16Optimizer's scheduler as the script sets it up gives our WarmupCosine's rate at every
    step, the cosine floor included (its own eta_min is 0; its betas are torch's).

    Exactly in the warm-up; on the cosine within tan^2(pi/2T) of the peak (T = 53 cosine steps
    here: 8.8e-4), where torch's chainable CosineAnnealingLR (2.13 here) starts SpecForge's decay
    from its formula at step -1. One warm-up step more or less, another floor or another total
    would each differ by 1e-2 or more."""
    from eagle_assets.drafter.run_config import TrainConfig

    cfg = TrainConfig(shard_dirs=("x",), vocab_mapping="x", target="x", out_dir="x", lr=2e-3, warmup_steps=7, min_lr_ratio=0.1)
    bound = math.tan(math.pi / (2 * 53)) ** 2 * (1 + 1e-9)  # the (1 - floor) factor taken as 1, so the floor-0 case fits too
    got = script.schedule_check(sf, cfg, 60)
    assert got["max_abs_diff_over_peak_lr"] <= bound and got["betas"] == [0.9, 0.95]
    assert got["max_abs_diff_in_warmup"] == 0.0
    opt = script.make_bf16_optimizer(sf, torch.nn.Linear(2, 2), cfg, 60)
    assert opt.scheduler.warmup_epochs == 7 and opt.scheduler.after_scheduler.eta_min == pytest.approx(2e-4)
    plain = sf["BF16Optimizer"](torch.nn.Linear(2, 2), lr=2e-3, total_steps=60, warmup_ratio=7.5 / 60)
    assert plain.optimizer.param_groups[0]["betas"] == (0.9, 0.999)  # what the script has to override
    assert script.schedule_check(sf, cfg.replace(min_lr_ratio=0.0), 60)["max_abs_diff_over_peak_lr"] <= bound
    for wrong, total in ((cfg.replace(warmup_steps=8), 60), (cfg.replace(min_lr_ratio=0.0), None), (cfg, 70)):
        opt = script.make_bf16_optimizer(sf, torch.nn.Linear(2, 2), wrong, total or 60)
        worst = 0.0
        for step in range(60):  # against our schedule with the right settings
            ours = cfg.lr * script.WarmupCosine(7, 60, 0.1)(step)
            worst = max(worst, abs(opt.optimizer.param_groups[0]["lr"] - ours) / cfg.lr)
            opt.scheduler.step()
        assert worst > 1e-2


def test_weight_mapping_places_every_tensor_or_refuses(script):
    from eagle_assets.drafter.config import tiny_config
    from eagle_assets.drafter.model import Eagle3Drafter

    config = tiny_config()
    ours = Eagle3Drafter(config).trainable_state_dict()
    theirs = {**script.specforge_state(ours), "embed_tokens.weight": torch.zeros(256, 64)}
    assert sum(k.startswith("midlayer.") for k in theirs) == 10
    back = script.ours_from_specforge(theirs, config)
    assert set(back) == set(ours) and all(torch.equal(back[k], ours[k]) for k in ours)
    with pytest.raises(ValueError, match=r"no place for \['fc_norm.0.weight'\]"):
        script.ours_from_specforge({**theirs, "fc_norm.0.weight": torch.ones(64)}, config)
    with pytest.raises(ValueError, match=r"unfilled \['norm.weight'\]"):
        script.ours_from_specforge({k: v for k, v in theirs.items() if k != "norm.weight"}, config)


def test_logits_check_passes_on_the_mapping_and_fails_on_a_wrong_one(script, sf):
    from eagle_assets.drafter.config import tiny_config
    from eagle_assets.drafter.model import Eagle3Drafter

    torch.manual_seed(0)
    config = tiny_config()
    ours = Eagle3Drafter(config).eval()
    with torch.no_grad():
        for p in ours.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))  # norms away from one, so a swapped norm shows
    embedding = torch.randn(256, 64)
    ours.load_target_embedding(embedding)
    g = torch.Generator().manual_seed(1)
    lengths = torch.tensor([12, 7])
    batch = {
        "aux": torch.randn(2, 12, 3 * 64, generator=g),
        "final": torch.randn(2, 12, 64, generator=g),
        "input_ids": torch.randint(0, 256, (2, 12), generator=g),
        "loss_mask": torch.ones(2, 12),
        "lengths": lengths,
    }
    state = script.specforge_state(ours.trainable_state_dict())
    same = script.compare_logits(sf, config, state, ours, embedding, ours.d2t, ours.t2d, batch, "sdpa")
    assert same["ok"] and same["positions"] == 19 and same["max_abs_diff"] < 1e-5
    for a, b in (
        ("midlayer.mlp.gate_proj.weight", "midlayer.mlp.up_proj.weight"),
        ("midlayer.input_layernorm.weight", "midlayer.hidden_norm.weight"),
    ):
        wrong = {**state, a: state[b], b: state[a]}
        got = script.compare_logits(sf, config, wrong, ours, embedding, ours.d2t, ours.t2d, batch, "sdpa")
        assert not got["ok"], (a, b, got)


def test_specforge_input_shift(script, sf):
    """Tokens and final states move left by one (zero at the end), aux states stay, the mask gains a
    dimension, and right padding becomes SpecForge's attention mask."""
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]]),
        "final": torch.arange(8.0).reshape(2, 4, 1),
        "aux": torch.arange(24.0).reshape(2, 4, 3),
        "loss_mask": torch.tensor([[0.0, 1, 1, 1], [0, 1, 0, 0]]),
        "lengths": torch.tensor([4, 2]),
    }
    got = script.shift_batch(batch, sf["padding"])
    assert got["input_ids"].tolist() == [[6, 7, 8, 0], [10, 0, 0, 0]]
    assert got["target_hidden_for_compact"][..., 0].tolist() == [[1, 2, 3, 0], [5, 6, 7, 0]]
    assert torch.equal(got["hidden_states"], batch["aux"]) and got["loss_mask"].shape == (2, 4, 1)
    assert got["attention_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 0, 0]]


def test_script_needs_no_dagster():
    for path in (SCRIPT, ROOT / "benchmarks" / "specforge_glue.py"):
        code = [line for line in path.read_text().splitlines() if line.lstrip().startswith(("import ", "from "))]
        assert not [line for line in code if "dagster" in line or "eagle_assets.defs" in line or "eagle_assets.resources" in line]
