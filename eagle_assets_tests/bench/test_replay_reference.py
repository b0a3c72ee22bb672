"""The offline reference replayed over the engine's states equals the reference decoder's counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from eagle_assets.bench.reference_decoder import greedy_generate, speculative_generate
from eagle_assets.bench.replay_reference import replay_reference, replay_rounds
from eagle_assets.bench.served import mt_bench_prompts
from eagle_assets.drafter.export import load_drafter
from eagle_assets.drafter.target_head import read_target_embedding
from eagle_assets.hidden_states.engine_extract import EngineStateClient
from eagle_assets_tests.conftest import SMOLLM2_EXTRACTED_IDS


def oracle_leads(prompt_len: int, stream_len: int, k: int, wrong: set[int]) -> list[int]:
    """Leads of a drafter that drafts the stream itself except at output indices in `wrong`."""
    leads = [0] * (prompt_len + stream_len)
    for c in range(1, stream_len):
        lead = 0
        while lead < k and c + lead < stream_len and (c + lead) not in wrong:
            lead += 1
        leads[prompt_len + c - 2] = lead
    return leads


def test_rounds_are_walked_as_the_reference_decoder_walks_them():
    # The reference decoder's oracle case (test_reference_decoder.py): SmolLM2's greedy stream,
    # drafts wrong at output indices 5, 6 and 13, K=3, 24 tokens: [3, 0, 0, 3, 2, 3, 3, 3].
    stream = list(range(100, 127))
    res = replay_rounds(oracle_leads(7, len(stream), 3, {5, 6, 13}), 7, stream, 24, 3)
    assert res.accepted_per_step == [3, 0, 0, 3, 2, 3, 3, 3]
    assert res.tokens == stream[:24] and res.al == 1 + 17 / 8
    # Every draft right: one round of K+1 tokens after the prefill's, the last cut at the length.
    assert replay_rounds(oracle_leads(4, 30, 3, set()), 4, list(range(30)), 9, 3).accepted_per_step == [3, 3]
    with pytest.raises(ValueError, match="needs 27"):
        replay_rounds([0] * 40, 4, list(range(26)), 24, 3)


@pytest.mark.engine
def test_replayed_over_engine_states_the_counts_equal_the_reference_decoders(materialized_graph, smollm2_path, smollm2_extraction_server):
    """The graph's own trained drafter on four MT-Bench turns at K=3: the reference decoder (the
    target in fp32 here) and the replay over the vLLM extraction server's states, along the same
    greedy stream, accept the same drafts at every round."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    _, data, _ = materialized_graph
    drafter, config = load_drafter(Path(data) / "smollm2-135m-instruct" / "drafter" / "drafter-vllm")
    drafter.load_target_embedding(read_target_embedding(smollm2_path, torch.float32))
    drafter.eval()
    tok = AutoTokenizer.from_pretrained(smollm2_path)
    target = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()
    server, _ = smollm2_extraction_server
    client = EngineStateClient(server.base_url, server.model, SMOLLM2_EXTRACTED_IDS)
    cols = [client.column(k) for k in config.aux_layer_ids]
    output_len, k = 32, 3
    prompts, streams, expected = [], [], []
    for messages in mt_bench_prompts(4):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
        with torch.inference_mode():
            expected.append(speculative_generate(target, drafter, ids, output_len, k, eos_token_id=None))
            streams.append(greedy_generate(target, ids, output_len + k))
        prompts.append(ids[0].tolist())

    def states_of(seq: list[int]) -> torch.Tensor:
        states = client.one(torch.tensor(seq).numpy())  # (T, 4, 576) fp32
        return states[:, cols].reshape(len(seq), -1)

    got = replay_reference(drafter, prompts, streams, states_of, output_len, k, log=lambda m: None)
    assert [r.tokens for r in got] == [r.tokens for r in expected]
    assert [r.accepted_per_step for r in got] == [r.accepted_per_step for r in expected]
    assert sum(sum(r.accepted_per_step) for r in got) > 0, "the trained drafter accepts drafts: the comparison is not vacuous"
