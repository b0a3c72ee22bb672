"""Extraction on CUDA: pinned buffers, events, and a target split across two GPUs."""

from __future__ import annotations

import pytest
import torch

from eagle_assets.hidden_states.extract import extract_all
from eagle_assets.hidden_states.reader import open_shards

from .conftest import tiny_llama
from .test_extract import AUX, H, settings

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_gpu_states_equal_a_direct_transformers_forward(corpus_dir, fingerprint, tmp_path):
    model = tiny_llama().cuda()
    extract_all(model, str(corpus_dir), tmp_path, settings(batch_tokens=1), target_fingerprint=fingerprint)
    shards = open_shards(tmp_path)
    assert sum(len(s) for s in shards) == 8
    for shard in shards:
        for i in range(len(shard)):
            s = shard[i]
            with torch.inference_mode():
                hs = model(s["input_ids"][None].long().cuda(), output_hidden_states=True).hidden_states
            assert torch.equal(s["aux"][:, :H], hs[AUX[0]][0].cpu())
            assert torch.equal(s["aux"][:, H : 2 * H], hs[AUX[1]][0].cpu())
            assert torch.equal(s["final"], hs[-1][0].cpu())


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_layers_split_across_two_gpus_give_the_same_states(corpus_dir, fingerprint, tmp_path):
    from accelerate import dispatch_model

    one = tiny_llama().cuda()
    extract_all(one, str(corpus_dir), tmp_path / "one", settings(), target_fingerprint=fingerprint)
    device_map = {
        "model.embed_tokens": 0,
        "model.rotary_emb": 0,
        "lm_head": 0,
        "model.layers.0": 0,
        "model.layers.1": 0,
        "model.layers.2": 1,
        "model.layers.3": 1,
        "model.norm": 1,
    }
    split = dispatch_model(tiny_llama(), device_map=device_map)
    extract_all(split, str(corpus_dir), tmp_path / "split", settings(), target_fingerprint=fingerprint)
    for a, b in zip(open_shards(tmp_path / "one"), open_shards(tmp_path / "split"), strict=True):
        assert a.sample_ids == b.sample_ids
        for i in range(len(a)):
            for key in ("input_ids", "aux", "final"):
                assert torch.equal(a[i][key], b[i][key])  # same kernels, only the placement differs
