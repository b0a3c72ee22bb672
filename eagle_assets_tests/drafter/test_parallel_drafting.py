"""Parallel drafting (vLLM's `parallel_drafting`): trained, exported and decoded as vLLM serves it."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from eagle_assets.bench.reference_decoder import greedy_generate, speculative_generate
from eagle_assets.drafter.config import DrafterConfig, folder_drafts_in_parallel, tiny_config, vllm_only_reason
from eagle_assets.drafter.export import export_vllm, load_drafter
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.ttt import ttt_loss, ttt_loss_dense
from eagle_assets.engines.vllm_launch import speculative_config
from eagle_assets_tests.bench.test_reference_decoder import (
    assert_rounds_follow_the_semantics,
    drafter_for,
    oracle_generate,
    tiny_target,
)
from eagle_assets_tests.drafter.test_model import random_drafter
from eagle_assets_tests.drafter.test_ttt import make_batch

MASK_ID = 5
CFG = tiny_config(
    hidden_size=32,
    intermediate_size=48,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    target_hidden_size=24,
    vocab_size=80,
    draft_vocab_size=40,
    ptd_token_id=MASK_ID,
)


def served_logits(model: Eagle3Drafter, batch: dict, steps: int) -> torch.Tensor:
    """(K, B, T, N) draft logits as vLLM computes them, one round per row t: the first pass over
    slots 0..t (g_s, x_{s+1}) at positions 0..t through a KV cache, then K-1 mask slots at
    t+1..t+K-1 in one more forward, attending to the cache."""
    aux, ids = batch["aux"], batch["input_ids"]
    B, T = ids.shape
    out = torch.zeros(steps, B, T, model.config.draft_vocab_size, dtype=torch.float64)
    next_ids = torch.cat([ids[:, 1:], ids.new_zeros(B, 1)], dim=1)  # slot s reads x_{s+1}
    for b in range(B):
        for t in range(T):
            cache = model.new_kv_cache(1, T + steps)
            g = model.project_hidden_states(aux[b : b + 1, : t + 1])
            _, h_post = model(g, next_ids[b : b + 1, : t + 1], torch.arange(t + 1)[None], kv_cache=cache)
            out[0, b, t] = model.compute_logits(h_post[0, -1]).double()
            g_mask, mask_ids = model.mask_slots(1, steps - 1)
            _, h_post = model(g_mask, mask_ids, torch.arange(t + 1, t + steps)[None], kv_cache=cache)
            out[1:, b, t] = model.compute_logits(h_post[0]).double()
    return out


def loss_from_logits(logits: torch.Tensor, batch: dict, head: torch.Tensor, weights: list[float]) -> torch.Tensor:
    """The TTT loss's definition: step i at row t learns the target's distribution at t+1+i."""
    final, loss_mask, lengths = batch["final"], batch["loss_mask"], batch["lengths"]
    K, B, T, _ = logits.shape
    loss = torch.zeros((), dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            for i in range(K):
                j, pred = t + 1 + i, t + 2 + i
                if pred >= int(lengths[b]) or not loss_mask[b, pred]:
                    continue
                p = torch.softmax(final[b, j].double() @ head.double().T, dim=-1)
                loss = loss - weights[i] * (p * torch.log_softmax(logits[i, b, t], dim=-1)).sum()
    return loss


def test_the_unroll_trains_the_function_vllm_serves():
    model = random_drafter(CFG)
    batch = make_batch(CFG, T=9, lengths=(9, 6))
    head = torch.randn(40, 24) * 0.5
    steps, weights = 3, [1.0, 0.8, 0.64]
    out = ttt_loss(model, batch, head, steps, loss_chunk_rows=7)
    want = loss_from_logits(served_logits(model, batch, steps), batch, head, weights)
    torch.testing.assert_close(out.loss_sum.double(), want, rtol=1e-5, atol=1e-5)
    # the mask state learns: its gradient reaches mask_hidden (only steps after the first read it)
    (grad,) = torch.autograd.grad(out.loss_sum, [model.mask_hidden])
    assert grad.abs().sum() > 0
    # ... and a chain-drafting unroll of the same weights is another function
    chain = Eagle3Drafter(replace(CFG, ptd_token_id=None))
    chain.load_state_dict({k: v for k, v in model.state_dict().items() if k != "mask_hidden"})
    assert torch.equal(ttt_loss(chain, batch, head, 1).loss_sum, ttt_loss(model, batch, head, 1).loss_sum)  # step 0 alike
    assert not torch.allclose(ttt_loss(chain, batch, head, steps).loss_sum, out.loss_sum)
    with pytest.raises(ValueError, match="parallel-drafting drafter trains with ttt_loss"):
        ttt_loss_dense(model, batch, head, steps)


def test_export_round_trip_and_served_config(tmp_path):
    model = random_drafter(CFG)
    with pytest.raises(ValueError, match="serves in vLLM only"):
        CFG.to_sglang_config()
    folder = export_vllm(model, CFG, tmp_path / "drafter-vllm", dtype=torch.float32)
    written = json.loads((folder / "config.json").read_text())
    assert written["ptd_token_id"] == MASK_ID
    loaded, config = load_drafter(folder)
    assert config.ptd_token_id == MASK_ID
    assert torch.equal(loaded.mask_hidden, model.mask_hidden.detach())
    spec = speculative_config(folder, 3)
    assert spec["parallel_drafting"] is True
    chain = export_vllm(random_drafter(tiny_config()), tiny_config(), tmp_path / "chain", dtype=torch.float32)
    assert "parallel_drafting" not in speculative_config(chain, 3)
    with pytest.raises(ValueError, match="ptd_token_id=80 is not a token id"):
        replace(CFG, ptd_token_id=80)


def test_reference_decoder_drafts_from_mask_slots_and_equals_greedy(one_thread):
    target = tiny_target()
    chain = drafter_for(target, aux_layer_ids=(1, 2, 3), draft_vocab_size=48)
    config = DrafterConfig.from_dict({**chain.config.to_dict(), "ptd_token_id": 7})
    parallel = Eagle3Drafter(config)
    parallel.load_state_dict(chain.state_dict(), strict=False)  # the same weights, plus mask_hidden
    parallel.eval()
    prompt = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    greedy = greedy_generate(target, prompt, 24, eos_token_id=2)
    for k in (1, 3):
        res = speculative_generate(target, parallel, prompt, 24, k, eos_token_id=2)
        assert res.tokens == greedy
        first = speculative_generate(target, chain, prompt, 24, k, eos_token_id=2)
        if k == 1:  # one draft: no mask slot, so both drafters draft alike
            assert res.drafts == first.drafts
    # at K=3 the later drafts come from the mask slots: the same first drafts, other later ones
    res, first = (speculative_generate(target, d, prompt, 24, 3, eos_token_id=2) for d in (parallel, chain))
    assert res.drafts[0][0] == first.drafts[0][0] and res.drafts[0][1:] != first.drafts[0][1:]
    # This random drafter's drafts are all rejected (the reject path); the next test accepts them.
    assert res.accepted_per_step == [0] * 23


def test_mask_slot_drafts_stay_in_step_across_accepted_rounds(monkeypatch, one_thread):
    # The oracle proposes the target's greedy continuation (wrong at output indices 2, 9, 10) while
    # the parallel drafter drafts beside it through its KV cache: the mask slots' entries at p+1..p+K-1
    # are overwritten by the accepted slots of the next round. From 0: 1 accepted, 2 rejected;
    # from 2: 3-5; from 6: 7, 8 then 9 rejected; from 9: 10 rejected; from 10: 11-13; from 14:
    # 15-17; from 18: 19-21, cut from 23 tokens to 20.
    target = tiny_target()
    chain = drafter_for(target, aux_layer_ids=(1, 2, 3), draft_vocab_size=48)
    parallel = Eagle3Drafter(DrafterConfig.from_dict({**chain.config.to_dict(), "ptd_token_id": 7}))
    parallel.load_state_dict(chain.state_dict(), strict=False)
    parallel.eval()
    prompt = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    res, oracle, continuation = oracle_generate(monkeypatch, target, parallel, prompt, 20, 3, wrong={2, 9, 10})
    assert res.tokens == continuation[:20] == greedy_generate(target, prompt, 20)
    assert res.accepted_per_step == [1, 3, 2, 0, 3, 3, 3]
    # Every round's drafts (the first from the slots, the rest from the mask slots) equal a fresh
    # cache's over the whole prefix at once.
    assert_rounds_follow_the_semantics(oracle, target, parallel, prompt, continuation, 3)


def test_training_learns_mask_slots_and_exports_them_for_vllm_only(tmp_path, one_thread):
    from eagle_assets.drafter.train import train
    from eagle_assets_tests.drafter.test_train import read_metrics, write_tiny_run

    cfg = write_tiny_run(
        tmp_path,
        num_samples=4,
        num_shards=1,
        micro_batch_samples=4,
        max_steps=30,
        lr=1e-2,
        warmup_steps=3,
        export_engines=("vllm",),
        ptd_token_id=MASK_ID,
    )
    summary = train(cfg)
    losses = [r["loss"] for r in read_metrics(cfg.out_dir)]
    assert losses[-1] < losses[0] / 4, losses[::5]
    model, config = load_drafter(summary["exports"]["vllm"])
    assert config.ptd_token_id == MASK_ID and summary["drafter_config"]["ptd_token_id"] == MASK_ID
    assert model.mask_hidden.shape == (config.fc_in_features,)
    with pytest.raises(ValueError, match="serves in vLLM only.*leave sglang out of export_engines"):
        train(cfg.replace(out_dir=str(tmp_path / "both"), export_engines=("vllm", "sglang")))

    # What the asset reads to leave SGLang out, also for a child warm-started from this drafter
    parent = summary["exports"]["vllm"]
    assert folder_drafts_in_parallel(parent) and not folder_drafts_in_parallel(tmp_path / "no-such-parent")
    assert "parallel-drafting" in vllm_only_reason(1, config.aux_layer_ids, 4, parallel=True)
    assert vllm_only_reason(1, config.aux_layer_ids, 4, parallel=False) is None
    with pytest.raises(ValueError, match="ptd_token_id is set with warm_start.*train from scratch"):
        train(cfg.replace(out_dir=str(tmp_path / "child"), warm_start=parent))
    child = train(cfg.replace(out_dir=str(tmp_path / "child"), warm_start=parent, ptd_token_id=None, max_steps=2))
    child_model, child_config = load_drafter(child["exports"]["vllm"])
    assert child_config.ptd_token_id == MASK_ID and child_model.mask_hidden.shape == model.mask_hidden.shape
