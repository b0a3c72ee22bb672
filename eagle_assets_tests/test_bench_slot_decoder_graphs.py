"""The slot decoder's CUDA-graph steps emit exactly the eager steps' tokens.

Self-contained (a random-weight Llama, no fixtures), so that it runs on a GPU host with
`pytest --noconftest`; the CUDA test is skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from benchmarks.slot_decoder import SlotDecoder


def _tiny_llama() -> LlamaForCausalLM:
    cfg = LlamaConfig(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1000,
        max_position_embeddings=512,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def test_graphs_need_cuda():
    with pytest.raises(ValueError, match="CUDA device"):
        SlotDecoder(_tiny_llama(), slots=2, max_len=16, cuda_graphs=True)
    assert SlotDecoder(_tiny_llama(), slots=2, max_len=16).cuda_graphs is False  # on only where the model is on CUDA


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graph_steps_equal_eager_steps_token_for_token():
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model = _tiny_llama().cuda()
    eager = SlotDecoder(model, slots=6, max_len=128, cuda_graphs=False)
    graphs = SlotDecoder(model, slots=6, max_len=128, cuda_graphs=True)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (n,), generator=g).tolist() for n in (5, 9, 17, 30, 12)]
    greedy = [0.0] * len(prompts), [1.0] * len(prompts)
    slots = list(range(len(prompts)))  # slot 5 stays free: its junk must not disturb the others
    assert eager.prefill(slots, prompts, *greedy) == graphs.prefill(slots, prompts, *greedy)
    for step in range(80):  # the longest slot grows from 30 to 110 tokens: spans 32, 64 and 128
        live = [s for s in slots if eager.host_lengths[s]]
        a, b = eager.step(), graphs.step()
        assert [a[s] for s in live] == [b[s] for s in live], f"step {step}"
        if step == 20:  # a freed slot refilled mid-run: the graphs read the new cache contents
            for d in (eager, graphs):
                d.release(1)
            refill = [torch.randint(0, 1000, (7,), generator=g).tolist()]
            assert eager.prefill([1], refill, [0.0], [1.0]) == graphs.prefill([1], refill, [0.0], [1.0])
    assert sorted(graphs._graphs) == [32, 64, 128]
