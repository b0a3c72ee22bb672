"""Which launched servers the resource keeps warm, and which request names which server."""

from eagle_assets.engines.vllm_launch import ngram_config, speculative_config
from eagle_assets.resources.inference_server import InferenceServerResource, server_key


def test_a_drafter_folder_and_k_name_the_server_of_the_config_they_expand_to(tmp_path, monkeypatch):
    drafter = tmp_path / "drafter-vllm"
    # The drafter's check passes the folder and K, the benchmark the speculative config: one server.
    assert server_key(drafter, 3, None) == server_key(None, 3, speculative_config(drafter, 3))
    monkeypatch.chdir(tmp_path)
    assert server_key("drafter-vllm", 3, None) == server_key(drafter, 3, None)  # a relative folder is resolved
    keys = {server_key(None, 3, None), server_key(drafter, 3, None), server_key(drafter, 2, None), server_key(None, 3, ngram_config(3))}
    assert len(keys) == 4  # plain, each K, n-gram: each its own server


def test_two_warm_servers_on_a_cpu_host_one_on_a_gpu():
    assert InferenceServerResource(device="cpu")._warm_capacity() == 2
    assert InferenceServerResource(device="cuda")._warm_capacity() == 1  # each vLLM takes most of the GPU's memory
