"""The drafted-argmax mask, computed once per sample and looked up afterwards, trains the same."""

from __future__ import annotations

import pytest
import torch

from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.draftable import DraftableCache
from eagle_assets.drafter.parallelize import TrainObjective
from eagle_assets.drafter.ttt import ttt_loss
from eagle_assets_tests.drafter.test_model import random_drafter
from eagle_assets_tests.drafter.test_ttt import make_batch

CFG = tiny_config(vocab_size=80, draft_vocab_size=40)


def heads(seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lm_head = torch.randn(80, CFG.target_hidden_size, generator=g)
    return lm_head[:40], lm_head[40:]


def grads(model) -> list[torch.Tensor]:
    out = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return out


def test_a_known_mask_trains_exactly_as_the_outside_head():
    model = random_drafter(CFG)
    batch = make_batch(CFG, B=3, T=12, lengths=(12, 9, 5))
    head, outside = heads()
    fresh = ttt_loss(model, batch, head, 3, outside_head=outside)
    fresh.loss_sum.backward()
    fresh_grads = grads(model)
    plain = ttt_loss(model, batch, head, 3)
    assert not fresh.in_draft.all() and fresh.step_tokens[0] < plain.step_tokens[0]  # the mask drops positions

    known = ttt_loss(model, batch, head, 3, in_draft=fresh.in_draft)
    known.loss_sum.backward()
    assert torch.equal(known.loss_sum, fresh.loss_sum)
    for field in ("step_loss_sum", "step_tokens", "step_correct"):
        assert torch.equal(getattr(known, field), getattr(fresh, field)), field
    for a, b in zip(grads(model), fresh_grads):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="not both"):
        ttt_loss(model, batch, head, 3, outside_head=outside, in_draft=fresh.in_draft)


def with_positions(batch: dict, positions: list[int]) -> dict:
    return {**batch, "positions": torch.tensor(positions)}


def pad_to(batch: dict, width: int) -> dict:
    """The same samples right-padded to `width` tokens, as a longer batch would hold them."""
    out = dict(batch)
    for key in ("aux", "final", "input_ids", "loss_mask"):
        t = batch[key]
        pad = torch.zeros(t.shape[0], width - t.shape[1], *t.shape[2:], dtype=t.dtype)
        out[key] = torch.cat([t, pad], dim=1)
    return out


def test_the_objective_computes_each_samples_mask_once_and_reuses_it():
    objective = TrainObjective(random_drafter(CFG), ttt_steps=3)
    head, outside = heads()
    batch = with_positions(make_batch(CFG, B=2, T=10, lengths=(10, 7)), [3, 8])
    first = objective(batch, head, outside)
    assert len(objective.draftable) == 2

    # A later epoch: the mask comes from the cache, so a different outside head changes nothing
    # (computed afresh, this one would drop every position).
    swamping = outside * 1000.0
    assert ttt_loss(objective.drafter, batch, head, 3, outside_head=swamping).step_tokens[0] == 0
    again = objective(batch, head, swamping)
    assert torch.equal(again.loss_sum, first.loss_sum)
    assert torch.equal(again.step_tokens, first.step_tokens)

    # The same samples in another order and padded wider: the looked-up mask lines up with them.
    flipped = {k: v.flip(0) for k, v in batch.items()}
    wider = pad_to(flipped, 14)
    looked_up = objective(wider, head, outside)
    afresh = ttt_loss(objective.drafter, wider, head, 3, outside_head=outside)
    for row, n in enumerate(wider["lengths"].tolist()):  # padding never trains, whatever its mask
        assert torch.equal(looked_up.in_draft[row, :n], afresh.in_draft[row, :n])
    assert torch.equal(looked_up.loss_sum, afresh.loss_sum)
    assert torch.equal(looked_up.step_tokens, afresh.step_tokens)

    # A batch with one sample not seen yet is computed whole, and that sample is kept.
    other = with_positions(make_batch(CFG, B=2, T=10, seed=5, lengths=(10, 7)), [3, 11])
    other = {**other, **{k: torch.stack([batch[k][0], other[k][1]]) for k in ("aux", "final", "input_ids", "loss_mask")}}
    mixed = objective(other, head, swamping)
    assert mixed.in_draft.sum() == 0  # computed with the swamping head, not looked up
    assert len(objective.draftable) == 3


def test_a_sample_whose_length_changed_is_refused():
    cache = DraftableCache()
    cache.store(torch.tensor([4]), torch.tensor([6]), torch.ones(1, 8, dtype=torch.bool))
    assert cache.lookup(torch.tensor([4]), torch.tensor([6]), 8).tolist() == [[True] * 6 + [False] * 2]
    assert cache.lookup(torch.tensor([4, 5]), torch.tensor([6, 6]), 8) is None
    with pytest.raises(ValueError, match="position 4 has 7 tokens now but 6"):
        cache.lookup(torch.tensor([4]), torch.tensor([7]), 8)
