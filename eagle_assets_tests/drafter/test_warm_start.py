"""Warm start keeps the parent's vocabulary and weights, and refuses parents that do not fit."""

from __future__ import annotations

import json

import pytest
import torch

from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.export import export_sglang, export_vllm
from eagle_assets.drafter.warm_start import warm_start
from eagle_assets_tests.drafter.test_export import mapped_drafter

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


TARGET = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 256, "num_attention_heads": 4}


@pytest.fixture()
def parent(tmp_path):
    cfg = tiny_config()
    model = mapped_drafter(cfg)
    return model, export_vllm(model, cfg, tmp_path / "parent", dtype=torch.float32)


def test_keeps_parent_weights_and_vocab_mapping(parent, tmp_path):
    model, folder = parent
    embedding = torch.randn(256, 64)
    child = warm_start(folder, TARGET, target_embedding=embedding)
    assert torch.equal(child.d2t, model.d2t) and torch.equal(child.t2d, model.t2d)
    for name, value in model.trainable_state_dict().items():
        assert torch.equal(child.state_dict()[name], value), name
    assert torch.equal(child.embed_tokens.weight, embedding)
    assert not child.embed_tokens.weight.requires_grad
    assert child.config.aux_layer_ids == (1, 2, 3)
    assert (child.config.target_num_layers, child.config.target_model_type) == (4, "llama")
    # A parent exported for SGLang (ids minus one) comes back with the same ids, from its folder path.
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(TARGET))
    sg = export_sglang(model, model.config, tmp_path / "parent-sg", dtype=torch.float32)
    assert warm_start(sg, tmp_path / "target").config.aux_layer_ids == (1, 2, 3)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"hidden_size": 128}, "target_hidden_size=64, the target's hidden_size is 128"),
        ({"vocab_size": 300}, "vocabulary of 256 .* vocab_size is 300"),
        ({"num_hidden_layers": 2}, "2 layers"),
    ],
)
def test_refuses_a_parent_that_does_not_fit(parent, change, message):
    _, folder = parent
    with pytest.raises(ValueError, match=message):
        warm_start(folder, {**TARGET, **change})


def test_refuses_hidden_size_mismatch(tmp_path):
    """A parent whose own width differs from the target's (fc reads the right width, attention does not)."""
    cfg = tiny_config(hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1)
    folder = export_vllm(mapped_drafter(cfg), cfg, tmp_path / "narrow")
    with pytest.raises(ValueError, match="hidden_size=32, the target's is 64"):
        warm_start(folder, TARGET)
