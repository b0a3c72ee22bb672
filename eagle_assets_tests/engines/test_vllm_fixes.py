"""The vLLM plugin our servers load (engines/engine_site): its torch `expand` keeps the Triton
kernel's contract, and the engine's environment finds the plugin and nothing else of ours."""

import importlib.metadata

import torch

from eagle_assets.engines.vllm_launch import ENGINE_SITE, engine_environment
from eagle_assets_tests.scripts import load_script


def load_fixes():
    return load_script(ENGINE_SITE / "eagle_assets_vllm_fixes.py")


def test_expand_spreads_each_requests_value_over_its_positions_in_the_outputs_dtype():
    expand = load_fixes().expand
    temperature = torch.tensor([0.5, 1.0, 0.7])
    out = torch.full((7,), -1.0)
    expand(out, temperature, torch.tensor([3, 4, 7], dtype=torch.int32), 0, 0)
    assert torch.equal(out, torch.tensor([0.5, 0.5, 0.5, 1.0, 0.7, 0.7, 0.7]))
    # int32, as top_k is, with the kernel's replacement; a request of no positions takes none.
    top_k = torch.tensor([0, 20, 5], dtype=torch.int32)
    out_k = torch.full((5,), -1, dtype=torch.int32)
    expand(out_k, top_k, torch.tensor([2, 2, 5], dtype=torch.int32), 0, 49152)
    assert out_k.tolist() == [49152, 49152, 5, 5, 5]
    # Positions past the last request's are left as they were; an empty batch writes nothing.
    tail = torch.full((4,), 9.0)
    expand(tail, torch.tensor([0.25]), torch.tensor([2], dtype=torch.int32), 0, 0)
    assert tail.tolist() == [0.25, 0.25, 9.0, 9.0]
    expand(tail, torch.tensor([]), torch.tensor([], dtype=torch.int32), 0, 0)
    assert tail.tolist() == [0.25, 0.25, 9.0, 9.0]


def test_the_engine_sees_our_plugin_and_nothing_else_of_the_pipeline(tmp_path):
    env = engine_environment(tmp_path, base={"PYTHONPATH": "/somewhere/the/pipeline/lives"})
    assert env["PYTHONPATH"] == str(ENGINE_SITE)
    assert sorted(p.name for p in ENGINE_SITE.iterdir() if p.name != "__pycache__") == [
        "eagle_assets_hidden_states.py",
        "eagle_assets_tokenizer_compat.py",
        "eagle_assets_vllm_fixes-1.0.dist-info",
        "eagle_assets_vllm_fixes.py",
        "sitecustomize.py",
    ]
    (dist,) = importlib.metadata.distributions(path=[str(ENGINE_SITE)])
    assert sorted((e.group, e.value) for e in dist.entry_points) == [
        ("vllm.general_plugins", "eagle_assets_tokenizer_compat:register"),
        ("vllm.general_plugins", "eagle_assets_vllm_fixes:register"),
    ]


def test_the_engine_inherits_an_allow_list_of_the_environment_and_no_secret(tmp_path):
    needed = {
        "PATH": "/usr/bin",
        "HOME": "/home/eagle",
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "TZ": "UTC",
        "HTTPS_PROXY": "http://proxy:3128",
        "no_proxy": "localhost",
        "CUDA_VISIBLE_DEVICES": "0,1",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NCCL_DEBUG": "INFO",
        "VLLM_LOGGING_LEVEL": "DEBUG",
        "VLLM_PLUGINS": "",
        "HF_HOME": "/hf",
        "OMP_NUM_THREADS": "2",
        "KMP_AFFINITY": "compact",
        "NUMBA_THREADING_LAYER": "omp",
        "TORCHINDUCTOR_CACHE_DIR": "/tmp/inductor",
    }
    secrets = {
        "DAGSTER_POSTGRES_PASSWORD": "pg",
        "AWS_SECRET_ACCESS_KEY": "aws",
        "EAGLE_ASSETS_SERVER_API_KEY": "ours",
        "OPENAI_API_KEY": "openai",
        "HF_TOKEN": "hf_token",
        "HUGGING_FACE_HUB_TOKEN": "hf_token2",
        "VLLM_API_KEY": "stray",
    }
    unrelated = {"PYTHONHOME": "/elsewhere", "DAGSTER_HOME": "/dagster", "EAGLE_ASSETS_DATA": "/data", "GOOGLE_APPLICATION_CREDENTIALS": "/k.json"}
    env = engine_environment(tmp_path, base={**needed, **secrets, **unrelated})
    assert {k: env[k] for k in needed if k != "PATH"} == {k: v for k, v in needed.items() if k != "PATH"}
    assert env["PATH"] == f"{tmp_path / 'bin'}:/usr/bin"
    assert not set(env) & (set(secrets) | set(unrelated)), sorted(set(env) & (set(secrets) | set(unrelated)))
    # What the launch adds stands as before: offline hub, our plugin alone on the path, CPU settings.
    assert (env["HF_HUB_OFFLINE"], env["TRANSFORMERS_OFFLINE"], env["PYTHONPATH"]) == ("1", "1", str(ENGINE_SITE))
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1" and env["VIRTUAL_ENV"] == str(tmp_path)
    # The key reaches the engine in its environment, and only when given.
    assert engine_environment(tmp_path, base=needed, api_key="k3y")["VLLM_API_KEY"] == "k3y"
