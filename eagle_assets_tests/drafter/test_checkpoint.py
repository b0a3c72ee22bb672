"""Checkpoints: exact round trip of weights, optimiser and RNG states; atomic folders and pruning;
and a training process killed with SIGKILL that resumes onto the uninterrupted trajectory, bit
for bit (fp32 on CPU)."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)

from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets_tests.drafter.test_train import read_metrics, write_tiny_run

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def _trained_drafter(seed: int = 0):
    torch.manual_seed(seed)
    model = Eagle3Drafter(tiny_config())
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95))
    for _ in range(2):
        sum(p.square().sum() for p in params).backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def test_round_trip_is_exact(tmp_path):
    model, opt = _trained_drafter()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
    osd = get_optimizer_state_dict(model, opt, options=FULL)
    path = ckpt.save_checkpoint(tmp_path, 7, state, osd, {"sampler": {"epoch": 1, "step": 3}, "note": "x"})
    assert path.name == "step-00000007"
    back = ckpt.load_checkpoint(path)
    assert back.step == 7 and back.trainer_state["sampler"] == {"epoch": 1, "step": 3}
    assert set(back.model_state) == set(state)
    assert all(torch.equal(back.model_state[k], v) for k, v in state.items())
    assert back.model_state["t2d"].dtype == torch.bool and back.model_state["d2t"].dtype == torch.int64
    for fqn, per_param in osd["state"].items():
        for name, value in per_param.items():
            assert torch.equal(back.optimizer_state["state"][fqn][name], value), (fqn, name)
    assert back.optimizer_state["param_groups"] == osd["param_groups"]
    # the state loads into a fresh optimiser and the next update is identical
    model2, opt2 = _trained_drafter(seed=1)
    model2.load_state_dict(back.model_state, strict=False)
    set_optimizer_state_dict(model2, opt2, back.optimizer_state, options=StateDictOptions(full_state_dict=True))
    for m, o in ((model, opt), (model2, opt2)):
        sum(p.pow(3).sum() for p in m.parameters() if p.requires_grad).backward()
        o.step()
    assert torch.equal(model.lm_head.weight, model2.lm_head.weight)


def test_rng_states_restore_every_generator():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = json.loads(json.dumps(ckpt.capture_rng_state()))  # through JSON, as on disk
    first = (random.random(), np.random.rand(), torch.rand(3).tolist(), np.random.randn())
    ckpt.restore_rng_state(saved)
    assert (random.random(), np.random.rand(), torch.rand(3).tolist(), np.random.randn()) == first


def test_folders_are_atomic_and_pruned(tmp_path):
    model, opt = _trained_drafter()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
    osd = get_optimizer_state_dict(model, opt, options=FULL)
    for step in (5, 10, 15):
        ckpt.save_checkpoint(tmp_path, step, state, osd, {}, keep_last=2)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [10, 15]
    # a crash mid-write leaves a hidden temp folder and a folder without trainer_state.json:
    # neither counts as a checkpoint, and the temp folder is cleaned up on start
    (tmp_path / ".tmp-step-00000020-deadbeef").mkdir()
    (tmp_path / ".tmp-step-00000020-deadbeef" / ckpt.MODEL_FILE).write_bytes(b"partial")
    (tmp_path / "step-00000025").mkdir()
    assert ckpt.latest_checkpoint(tmp_path).name == "step-00000015"
    ckpt.remove_stale_temp(tmp_path)
    assert not list(tmp_path.glob(".tmp-*"))
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        ckpt.load_checkpoint(tmp_path / "step-00000025")


def _train_rows(out_dir) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out_dir) if "loss" in r}


def _val_rows(out_dir) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out_dir) if "val_loss" in r}


COMPARED = ("loss", "step_loss", "acc", "grad_norm", "lr", "tokens_seen", "epoch")


def test_killed_run_resumes_to_the_same_trajectory(tmp_path, one_thread):
    from eagle_assets.drafter.train import train

    steps = 40
    ref_cfg = write_tiny_run(
        tmp_path,
        num_samples=24,
        max_steps=steps,
        checkpoint_every=4,
        keep_last=2,
        val_fraction=0.2,
        val_interval=15,
        warmup_steps=5,
    )
    train(ref_cfg)  # uninterrupted, in this process
    ref = _train_rows(ref_cfg.out_dir)
    assert sorted(ref) == list(range(1, steps + 1))

    cfg = ref_cfg.replace(out_dir=str(tmp_path / "killed"))
    config_path = cfg.save(tmp_path / "killed.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # the same reduction order as this process
    with open(tmp_path / "killed.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle_assets.drafter.train", "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any(s >= 12 for s, _ in ckpt.list_checkpoints(cfg.checkpoint_dir)):
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (tmp_path / "killed.log").read_text()[-2000:]
    assert not (Path(cfg.out_dir) / "summary.json").exists()  # it really died before the end
    killed_at = ckpt.list_checkpoints(cfg.checkpoint_dir)[-1][0]
    assert 12 <= killed_at < steps
    sampler = json.loads((ckpt.latest_checkpoint(cfg.checkpoint_dir) / ckpt.STATE_FILE).read_text())["sampler"]
    # 10 steps per epoch here: the kill lands mid-epoch, after an epoch boundary
    assert sampler["epoch"] >= 1 and 0 < sampler["step"] < 10, sampler
    before = _train_rows(cfg.out_dir)
    for s in range(1, killed_at + 1):  # the other process computed exactly what this one did
        assert {k: before[s][k] for k in COMPARED} == {k: ref[s][k] for k in COMPARED}, s

    summary = train(cfg)  # resume from the newest complete checkpoint
    assert summary["resumed_from_step"] == killed_at and summary["steps"] == steps
    got = _train_rows(cfg.out_dir)
    assert sorted(got) == list(range(1, steps + 1))  # rows the killed run logged past its checkpoint are gone
    for s in range(1, steps + 1):
        assert {k: got[s][k] for k in COMPARED} == {k: ref[s][k] for k in COMPARED}, s
    assert _val_rows(cfg.out_dir) == _val_rows(ref_cfg.out_dir) and sorted(_val_rows(cfg.out_dir)) == [15, 30, 40]
    final_ref = ckpt.latest_checkpoint(ref_cfg.checkpoint_dir)
    final_got = ckpt.latest_checkpoint(cfg.checkpoint_dir)
    assert final_ref.name == final_got.name == f"step-{steps:08d}"
    for name in (ckpt.MODEL_FILE, ckpt.OPTIMIZER_FILE):
        a, b = load_file(str(final_ref / name)), load_file(str(final_got / name))
        assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a), name


def test_resume_refuses_settings_that_would_change_the_run(tmp_path, one_thread):
    from eagle_assets.drafter.train import train

    cfg = write_tiny_run(tmp_path, num_samples=12, max_steps=3, checkpoint_every=3, val_fraction=0.0)
    train(cfg)
    longer = cfg.replace(max_steps=6)
    with pytest.raises(ValueError, match=r"target_temperature=1\.0, this run has 0\.5: the loss would change objective"):
        train(longer.replace(target_temperature=0.5))
    with pytest.raises(ValueError, match=r"unreached_weight=1\.0, this run has 0\.0: the loss would change objective"):
        train(longer.replace(unreached_weight=0.0))
    with pytest.raises(ValueError, match=r"seed=0, this run has 1: the data order would differ"):
        train(longer.replace(seed=1))
    assert [s for s, _ in ckpt.list_checkpoints(cfg.checkpoint_dir)] == [3]  # nothing was overwritten
    assert train(longer)["resumed_from_step"] == 3  # the same settings resume


def test_a_checkpoint_records_its_files_and_older_ones_still_load(tmp_path):
    model, opt = _trained_drafter()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
    path = ckpt.save_checkpoint(tmp_path, 4, state, get_optimizer_state_dict(model, opt, options=FULL), {})
    files = json.loads((path / ckpt.STATE_FILE).read_text())["files"]
    for name in (ckpt.MODEL_FILE, ckpt.OPTIMIZER_FILE):
        assert files[name] == {"bytes": (path / name).stat().st_size, "sha256": hashlib.sha256((path / name).read_bytes()).hexdigest()}
    assert ckpt.checkpoint_problem(path) is None and "files" not in ckpt.load_checkpoint(path).trainer_state
    # A checkpoint written before the record existed gets every other check and loads.
    raw = json.loads((path / ckpt.STATE_FILE).read_text())
    del raw["files"]
    (path / ckpt.STATE_FILE).write_text(json.dumps(raw))
    assert ckpt.checkpoint_problem(path) is None and ckpt.load_checkpoint(path).step == 4


def test_saving_a_step_removes_the_checkpoints_after_it(tmp_path):
    """Checkpoints newer than the one just saved were left by a run this one did not resume from
    (a damaged one skipped, or a restart with resume=false); a later resume must not pick them."""
    model, opt = _trained_drafter()
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embed_tokens.")}
    osd = get_optimizer_state_dict(model, opt, options=FULL)
    for step in (4, 8, 12):
        ckpt.save_checkpoint(tmp_path, step, state, osd, {}, keep_last=3)
    ckpt.save_checkpoint(tmp_path, 2, state, osd, {}, keep_last=3)
    assert [s for s, _ in ckpt.list_checkpoints(tmp_path)] == [2]
