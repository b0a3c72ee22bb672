"""Online training from the target in the trainer (hidden_states="target") against shard training,
on a tiny random llama in fp32 on CPU: the same samples in the same order, the same losses and
weights; and a run killed mid-epoch that resumes onto the same trajectory.

Tolerance. The online source rounds its states to bf16 as the shards store them, so where both
paths run the target's forward over the same batches (one sample per forward here and in the
extraction) they compute the same bits and training must match exactly: every logged number and
every weight equal. Where the batches differ (the extraction pads a shard's samples together, the
trainer a micro-batch's), fp32 rounding moves a state by a few units in its 24th bit (padding
changes the summation order of attention), and the rare value that sits on a bf16 rounding
boundary then lands one bf16 step (2^-8 relative) away. That is the only difference the source
makes, and its effect is bounded in `test_batched_online_states_differ_only_by_bf16_rounding`:
per-step losses within 1e-4 relative and weights within 1e-4 of their largest magnitude after
the run. Dropping the rounding (training on the fp32 states) moves them further than that, which
the test also shows, so the tolerance separates a faithful source from an unfaithful one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from eagle_assets.corpus.target import target_fingerprint
from eagle_assets.drafter import checkpoint as ckpt
from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets.drafter.sources import CorpusSamples, TargetStates, open_training_data
from eagle_assets.formats import stable_id
from eagle_assets.hidden_states.extract import ExtractSettings, extract_all
from eagle_assets.hidden_states.vocab import build_vocab_mapping, count_assistant_tokens, save_vocab_mapping
from eagle_assets_tests.drafter.test_train import read_metrics
from eagle_assets_tests.hidden_states.conftest import corpus_row, write_corpus

VOCAB, HIDDEN, LAYERS = 512, 64, 4
AUX = (1, 2, 3)
NUM_SHARDS = 2
STEPS = 12
COMPARED = ("loss", "step_loss", "acc", "grad_norm", "lr", "tokens_seen", "epoch")


def write_tiny_llama(folder: Path, tokenizer_from: Path) -> None:
    """A random llama folder, with SmolLM2's tokenizer files (the target's loader reads them)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():  # larger than the init's 0.02, so the states and logits carry signal
        model.model.embed_tokens.weight.normal_(0, 1.0)
        model.lm_head.weight.normal_(0, 0.5)
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tokenizer_from / name).is_file():
            shutil.copyfile(tokenizer_from / name, folder / name)


def write_random_corpus(folder: Path, fingerprint: str, num_samples: int = 16, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(num_samples):
        n = int(torch.randint(12, 48, (1,), generator=g))
        ids = torch.randint(0, VOCAB, (n,), generator=g).tolist()
        mask = [0] * 4 + [1] * (n - 4)
        msgs = [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
        rows.append(corpus_row(stable_id("online-test", seed, i), msgs, ids, mask, fingerprint))
    return write_corpus(folder, rows)


@pytest.fixture(scope="module")
def tiny_world(tmp_path_factory, smollm2_path, one_thread):
    """A tiny fp32 target, its corpus and vocabulary mapping, and shards extracted from it one
    sample per forward (`batch_tokens=1`) and a whole shard per forward (padded)."""
    root = tmp_path_factory.mktemp("online")
    target = root / "target"
    write_tiny_llama(target, smollm2_path)
    corpus = write_random_corpus(root / "corpus", target_fingerprint(target))
    mapping = build_vocab_mapping(count_assistant_tokens(str(corpus), VOCAB), VOCAB, 128)
    save_vocab_mapping(mapping, root / "vocab_mapping.safetensors")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    for name, batch_tokens in (("shards-single", 1), ("shards-padded", 4096)):
        settings = ExtractSettings(aux_layer_ids=AUX, num_shards=NUM_SHARDS, batch_tokens=batch_tokens, progress=False)
        extract_all(model, str(corpus), root / name, settings, target_fingerprint=target_fingerprint(target))
    return root


def config(root: Path, name: str, **changes) -> TrainConfig:
    settings = dict(
        shard_dirs=(str(root / "shards-single"),),
        vocab_mapping=str(root / "vocab_mapping.safetensors"),
        target=str(root / "target"),
        out_dir=str(root / name),
        corpus_dir=str(root / "corpus"),
        num_shards=NUM_SHARDS,
        aux_layer_ids=AUX,
        ttt_steps=3,
        micro_batch_tokens=None,
        micro_batch_samples=1,
        grad_accum=2,
        max_steps=STEPS,
        lr=3e-3,
        warmup_steps=2,
        val_fraction=0.2,
        val_interval=0,
        checkpoint_every=4,
        log_every=1,
        export_engines=(),
        precision="fp32",
    )
    settings.update(changes)
    return TrainConfig(**settings)


def rows(out_dir: str) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(out_dir) if "loss" in r}


def final_weights(cfg: TrainConfig) -> dict[str, torch.Tensor]:
    last = ckpt.latest_checkpoint(cfg.checkpoint_dir)
    assert last is not None and last.name == ckpt.checkpoint_name(STEPS)
    return load_file(str(last / ckpt.MODEL_FILE))


@pytest.fixture(scope="module")
def shard_run(tiny_world, one_thread):
    """The reference: trained from the one-sample-per-forward shards."""
    from eagle_assets.drafter.train import train

    cfg = config(tiny_world, "from-shards")
    summary = train(cfg)
    assert summary["hidden_states"] == "shards"
    return cfg, rows(cfg.out_dir), final_weights(cfg), summary


def test_online_source_numbers_the_samples_as_the_shards_store_them(tiny_world):
    shards = open_training_data(config(tiny_world, "x"), torch.device("cpu"))
    online = CorpusSamples(str(tiny_world / "corpus"), NUM_SHARDS, 2048, VOCAB, target_fingerprint(tiny_world / "target"))
    assert [s.sample_id for s in online.samples] == [s.sample_id for s in shards.samples]
    assert [s.num_tokens for s in online.samples] == [s.num_tokens for s in shards.samples]
    cut = CorpusSamples(str(tiny_world / "corpus"), NUM_SHARDS, 20, VOCAB, None)
    assert max(s.num_tokens for s in cut.samples) == 20 and all(len(x) == s.num_tokens for x, s in zip(cut.input_ids, cut.samples))


def test_online_training_from_the_target_equals_shard_training(tiny_world, shard_run, one_thread):
    """One sample per forward on both paths: the same bits, so every logged number and weight is equal."""
    from eagle_assets.drafter.train import train

    ref_cfg, ref_rows, ref_weights, ref_summary = shard_run
    cfg = config(tiny_world, "from-target", hidden_states="target", shard_dirs=())
    summary = train(cfg)
    assert summary["hidden_states"] == "target" and "online from target" in summary["hidden_states_origin"]
    assert not (Path(cfg.out_dir) / "hidden_states").exists() and not list(Path(cfg.out_dir).glob("**/*shard*"))
    got = rows(cfg.out_dir)
    assert sorted(got) == sorted(ref_rows) == list(range(1, STEPS + 1))
    for s in got:
        assert {k: got[s][k] for k in COMPARED} == {k: ref_rows[s][k] for k in COMPARED}, s
    weights = final_weights(cfg)
    assert set(weights) == set(ref_weights) and all(torch.equal(weights[k], ref_weights[k]) for k in weights)
    assert summary["val_loss"] == ref_summary["val_loss"] and summary["val_al"] == ref_summary["val_al"]


def test_batched_online_states_differ_only_by_bf16_rounding(tiny_world, one_thread):
    """Micro-batches of 4 against shards extracted a whole shard per forward: the states agree
    to one bf16 step where they differ at all, and training stays within the module's tolerance,
    which training on unrounded states would exceed."""
    from eagle_assets.drafter.train import train

    shards_cfg = config(tiny_world, "padded-shards", shard_dirs=(str(tiny_world / "shards-padded"),), micro_batch_samples=4)
    online_cfg = shards_cfg.replace(out_dir=str(tiny_world / "padded-online"), hidden_states="target", shard_dirs=())
    shards = open_training_data(shards_cfg, torch.device("cpu"))
    online = open_training_data(online_cfg, torch.device("cpu"))
    assert isinstance(online, TargetStates)
    positions = list(range(len(shards)))
    a, b = shards.collate(positions), online.collate(positions)
    for name in ("input_ids", "loss_mask", "lengths", "positions"):
        assert torch.equal(a[name], b[name]), name
    for name in ("aux", "final"):
        differ = a[name] != b[name]
        step = a[name].abs() * 2**-8  # one bf16 step, relative to the value
        assert bool(((a[name] - b[name]).abs() <= step + 1e-30)[differ].all()), name
        assert differ.float().mean() < 1e-3, (name, differ.float().mean())
    online.close()

    train(shards_cfg)
    train(online_cfg)
    loss_gap, weight_gap = gaps(shards_cfg, online_cfg)
    print(f"batched: largest relative loss gap {loss_gap:.2e}, weight gap {weight_gap:.2e}")
    assert loss_gap <= 1e-4 and weight_gap <= 1e-4, (loss_gap, weight_gap)

    # The control: the same online run on states left in fp32 (not rounded as shards are) falls outside it.
    unrounded_cfg = online_cfg.replace(out_dir=str(tiny_world / "padded-unrounded"))
    UnroundedTrainer(unrounded_cfg).run()
    loss_gap, weight_gap = gaps(shards_cfg, unrounded_cfg)
    print(f"unrounded: largest relative loss gap {loss_gap:.2e}, weight gap {weight_gap:.2e}")
    assert loss_gap > 1e-4 or weight_gap > 1e-4, (loss_gap, weight_gap)


def gaps(a: TrainConfig, b: TrainConfig) -> tuple[float, float]:
    """The largest relative gap between two runs' per-step losses, and between their final weights
    (relative to each tensor's largest magnitude)."""
    ra, rb = rows(a.out_dir), rows(b.out_dir)
    assert sorted(ra) == sorted(rb)
    loss_gap = max(abs(ra[s]["loss"] - rb[s]["loss"]) / abs(ra[s]["loss"]) for s in ra)
    wa, wb = final_weights(a), final_weights(b)
    weight_gap = max(float((wa[k] - wb[k]).abs().max() / wa[k].abs().max().clamp(min=1e-30)) for k in wa if wa[k].is_floating_point())
    return loss_gap, weight_gap


class UnroundedStates(TargetStates):
    """The target's states kept in fp32: what training would see without the shards' rounding."""

    state_dtype = torch.float32


class UnroundedTrainer:
    """The trainer with its online source swapped for `UnroundedStates` (same target, corpus, ids)."""

    def __init__(self, cfg: TrainConfig):
        from eagle_assets.drafter.train import Trainer, setup_distributed

        class _Trainer(Trainer):
            def setup(self):
                super().setup()
                ds = self.ds
                self.ds = UnroundedStates(ds.model, ds.corpus, ds.aux_layer_ids)
                ds.close()

        self.trainer = _Trainer(cfg, setup_distributed())

    def run(self):
        try:
            return self.trainer.run()
        finally:
            self.trainer.close()


def test_a_run_killed_mid_epoch_resumes_onto_the_shard_trajectory(tiny_world, shard_run, one_thread):
    """SIGKILL after a checkpoint mid-epoch; the rerun resumes from it and its place in the data,
    and ends with the weights shard training reached."""
    from eagle_assets.drafter.train import train

    ref_cfg, ref_rows, ref_weights, _ = shard_run
    cfg = config(tiny_world, "killed-online", hidden_states="target", shard_dirs=())
    config_path = cfg.save(tiny_world / "killed-online.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with open(tiny_world / "killed-online.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "eagle_assets.drafter.train", "--config", str(config_path)], stdout=log, stderr=subprocess.STDOUT, env=env
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if any(s >= 4 for s, _ in ckpt.list_checkpoints(cfg.checkpoint_dir)):
                os.kill(proc.pid, signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (tiny_world / "killed-online.log").read_text()[-2000:]
    killed_at = ckpt.list_checkpoints(cfg.checkpoint_dir)[-1][0]
    assert 4 <= killed_at < STEPS
    sampler = json.loads((ckpt.latest_checkpoint(cfg.checkpoint_dir) / ckpt.STATE_FILE).read_text())["sampler"]
    assert sampler["step"] > 0, sampler  # mid-epoch

    summary = train(cfg)
    assert summary["resumed_from_step"] == killed_at and summary["steps"] == STEPS
    got = rows(cfg.out_dir)
    for s in range(1, STEPS + 1):
        assert {k: got[s][k] for k in COMPARED} == {k: ref_rows[s][k] for k in COMPARED}, s
    weights = final_weights(cfg)
    assert all(torch.equal(weights[k], ref_weights[k]) for k in ref_weights)
