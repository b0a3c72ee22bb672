"""Which launched servers the resource keeps warm, which request names which server, and how a CPU server runs the models."""

import json
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from eagle_assets.defs.resources import default_resources
from eagle_assets.engines.host_memory import ENGINE_OVERHEAD_BYTES, HEADROOM_BYTES
from eagle_assets.engines.vllm_launch import VllmLaunch, ngram_config, speculative_config
from eagle_assets.resources import inference_server
from eagle_assets.resources.inference_server import InferenceServerResource, WarmServer, server_key
from eagle_assets.targets import EMBEDDED_TARGET, get_preset


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


def test_warm_servers_are_stopped_oldest_first_until_the_next_one_fits(monkeypatch):
    # The two things this cannot have for real: a host short of memory (this one has plenty), so
    # MemAvailable is read from a counter that each stop raises; and warm vLLM servers, stood in
    # for by what the resource holds of one (its URL, and the ExitStack that stops it), since two
    # real ones would take minutes and ~7 GB without being short of anything.
    resource = InferenceServerResource(device="cpu")
    available = {"bytes": 3 << 30}
    stopped = []

    def warm(name: str, frees_gib: int) -> None:
        stack = ExitStack()

        def stop():
            stopped.append(name)
            available["bytes"] += frees_gib << 30

        stack.callback(stop)
        resource._warm[name] = WarmServer(SimpleNamespace(base_url=f"http://{name}"), stack, None)

    warm("older", 2)
    warm("newer", 2)
    monkeypatch.setattr(inference_server, "available_memory_bytes", lambda: available["bytes"])
    lines = []
    resource._make_room(3 << 30, lines.append)  # 3 GiB + 1 GiB headroom against 3 available: one must go
    assert stopped == ["older"] and list(resource._warm) == ["newer"]
    assert "3.0 GiB available" in lines[0] and "needs ~3.0 GiB" in lines[0]
    resource._make_room(3 << 30, lines.append)  # 5 GiB available now: the newer one stays
    assert stopped == ["older"]
    resource._make_room(64 << 30, lines.append)  # nothing fits: every warm server goes, none is left to stop
    assert stopped == ["older", "newer"] and not resource._warm


def _stand_in_launches(monkeypatch, folder: Path, name_of) -> tuple[list, list]:
    """Launched servers stood in for by a context manager recording the name `name_of(spec,
    number of starts so far)` of each start and stop (its URL is http://NAME); the lists it fills."""
    started, stopped = [], []

    @contextmanager
    def launch(target_folder, speculative=None, **_):
        name = name_of(speculative, len(started))
        started.append(name)
        try:
            yield SimpleNamespace(base_url=f"http://{name}", problem=lambda timeout_s=10: None)  # alive
        finally:
            stopped.append(name)

    monkeypatch.setattr(inference_server, "launch_vllm", launch)
    monkeypatch.setattr(inference_server, "resolve_target", lambda target, log: (None, folder))
    return started, stopped


def test_servers_in_use_together_are_never_stopped_and_the_warm_ones_trimmed_after(tmp_path, monkeypatch):
    # What is checked is the resource's bookkeeping when a benchmark interleaving its
    # configurations holds several servers at once; a launched server is stood in for by a
    # context manager recording its start and stop (real ones: test_pipeline_e2e.py).
    (tmp_path / "config.json").write_text("{}")
    started, stopped = _stand_in_launches(monkeypatch, tmp_path, lambda spec, n: (spec or {}).get("num_speculative_tokens", "plain"))
    available = {"bytes": 64 << 30}
    monkeypatch.setattr(inference_server, "available_memory_bytes", lambda: available["bytes"])
    resource = InferenceServerResource(device="cpu")
    specs = [None, ngram_config(2), ngram_config(3)]
    with ExitStack() as stack:
        servers = [stack.enter_context(resource.serve(speculative=s, log=lambda m: None)) for s in specs]
        assert started == ["plain", 2, 3] and stopped == []  # three at once, over the warm limit of two
        assert [s.base_url for s in servers] == ["http://plain", "http://2", "http://3"]
    assert stopped == ["plain"] and len(resource._warm) == 2  # back to two warm, the oldest gone

    # Short of memory with servers in use: the idle one goes, then the start is refused, saying what to change.
    available["bytes"] = 1 << 30
    with resource.serve(speculative=specs[2], log=lambda m: None):
        with pytest.raises(MemoryError, match="interleave_rounds: 0"):
            with resource.serve(speculative=ngram_config(4), log=lambda m: None):
                pass
        assert stopped == ["plain", 2] and started == ["plain", 2, 3]
    resource.stop_warm()
    assert stopped == ["plain", 2, 3]

    gpu = InferenceServerResource(device="cuda")
    with gpu.serve(log=lambda m: None):
        with pytest.raises(RuntimeError, match="one after another"):
            with gpu.serve(speculative=specs[1], log=lambda m: None):
                pass
    gpu.stop_warm()


def test_a_replica_of_a_configuration_is_a_server_of_its_own(tmp_path, monkeypatch):
    # An A/A control asks for a second server without speculation beside the first; stood in
    # for as above by a context manager recording starts and stops.
    started, stopped = _stand_in_launches(monkeypatch, tmp_path, lambda spec, n: n)
    monkeypatch.setattr(inference_server, "available_memory_bytes", lambda: 64 << 30)
    resource = InferenceServerResource(device="cpu")
    with resource.serve(log=lambda m: None) as first, resource.serve(replica=1, log=lambda m: None) as second:
        assert (first.base_url, second.base_url) == ("http://0", "http://1")
    with resource.serve(replica=1, log=lambda m: None) as again:  # kept warm under its own key
        assert again.base_url == "http://1" and len(started) == 2
    assert list(resource._warm) == [server_key(None, 0, None), server_key(None, 0, None, replica=1)]
    resource.stop_warm()
    assert sorted(stopped) == [0, 1]


def test_servers_already_warm_count_as_up_and_idle_others_as_memory_to_free(tmp_path, monkeypatch):
    # Whether a benchmark's servers fit at once, asked before it starts them. Warm servers are
    # stood in for by what the resource holds of one, as above.
    target, drafter = tmp_path / "target", tmp_path / "drafter"
    for folder in (target, drafter):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"torch_dtype": "float32"}))
        (folder / "model.safetensors").write_bytes(b"\0" * (1 << 20))
    monkeypatch.setattr(inference_server, "resolve_target", lambda target_name, log: (None, target))
    available = {"bytes": 0}
    monkeypatch.setattr(inference_server, "available_memory_bytes", lambda: available["bytes"])
    resource = InferenceServerResource(device="cpu", kv_cache_gib=1)
    one = (1 << 20) + (1 << 30) + ENGINE_OVERHEAD_BYTES  # the target's weights, the cache, the engine
    eagle, ngram = speculative_config(drafter, 3), ngram_config(3)
    specs = [None, eagle, ngram]
    available["bytes"] = 3 * one + (1 << 20) + HEADROOM_BYTES  # the drafter adds its 1 MiB of weights
    assert resource.why_not_at_once(specs) is None
    available["bytes"] -= 1
    assert resource.why_not_at_once(specs).startswith("3 more servers at once need ~")
    for spec in (None, eagle):  # the drafter check's two, left warm
        resource._warm[server_key(None, 3, spec)] = WarmServer(SimpleNamespace(base_url="http://warm"), ExitStack(), spec)
    available["bytes"] = one + HEADROOM_BYTES  # only n-gram's server is still to start
    assert resource.why_not_at_once(specs) is None
    assert resource.why_not_at_once([*specs, ngram_config(4)]).startswith("2 more servers")
    # An idle warm server the benchmark does not want would be stopped to make room.
    assert resource.why_not_at_once([ngram_config(4), ngram]) is None
    # An A/A control's second server without speculation is one more to start, the plain one warm or not.
    assert resource.why_not_at_once([None, None, eagle, ngram]).startswith("2 more servers")
    available["bytes"] += one
    assert resource.why_not_at_once([None, None, eagle, ngram]) is None
    assert "accelerator" in InferenceServerResource(device="cuda").why_not_at_once(specs)
    assert "existing servers of the user's" in InferenceServerResource(url="http://elsewhere:8000").why_not_at_once([None])


def test_a_cpu_server_runs_eagerly_unless_asked_to_compile_and_the_report_says_which(tmp_path, monkeypatch):
    def command(device: str, compiled: bool) -> list[str]:
        launch = VllmLaunch(tmp_path, EMBEDDED_TARGET, get_preset(EMBEDDED_TARGET), 8000, device=device, compiled=compiled)
        return launch.command(Path("python"))

    eager, compiled = command("cpu", False), command("cpu", True)
    assert "--enforce-eager" in eager and json.loads(eager[eager.index("--compilation-config") + 1]) == {"mode": 0}
    assert "--enforce-eager" not in compiled and "--compilation-config" not in compiled
    for cmd in (eager, compiled):  # fp32 either way: served and offline acceptance compare token for token
        assert cmd[cmd.index("--dtype") + 1] == "float32"
    assert "--enforce-eager" not in command("cuda", False)

    assert "--compiled" in InferenceServerResource(device="cpu").serving_note()
    assert InferenceServerResource(device="cpu", compiled=True).serving_note().startswith("served compiled")
    assert InferenceServerResource(device="cuda").serving_note() is None
    assert InferenceServerResource(device="cpu", url="http://127.0.0.1:1").serving_note() is None  # a server of yours: not ours to say

    monkeypatch.setenv("EAGLE_ASSETS_SERVE_COMPILED", "1")
    assert default_resources()["inference_server"].compiled
    monkeypatch.setenv("EAGLE_ASSETS_SERVE_COMPILED", "maybe")
    with pytest.raises(ValueError, match="EAGLE_ASSETS_SERVE_COMPILED='maybe' is neither on nor off: set it to 1"):
        default_resources()


def test_the_drafter_keeps_only_the_warm_extraction_server_it_streams_from():
    """Before training, every warm server stops (their memory is the trainer's), except the
    extraction server of the layers an online training streams from: `benchmark_reference`
    left it warm, and stopping it would load the target again."""
    from contextlib import ExitStack
    from types import SimpleNamespace

    from eagle_assets.engines.vllm_launch import extraction_config
    from eagle_assets.resources.inference_server import WarmServer, server_key

    resource = InferenceServerResource()
    stopped = []
    for name, spec in [("plain", None), ("extraction", extraction_config([2, 4, 5, 8]))]:
        stack = ExitStack()
        stack.callback(stopped.append, name)
        resource._warm[server_key(None, 0, spec)] = WarmServer(SimpleNamespace(base_url=f"http://{name}"), stack, spec)
    resource.stop_warm(keep_extraction=[2, 4, 5, 8])
    assert stopped == ["plain"] and list(resource._warm) == [server_key(None, 0, extraction_config([2, 4, 5, 8]))]
    resource.stop_warm(keep_extraction=[2, 4, 8])  # other layers: another server, this one goes
    assert stopped == ["plain", "extraction"] and not resource._warm
