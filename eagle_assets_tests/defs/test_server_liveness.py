"""The inference-server resource never hands out a dead server: real vLLM servers killed with
SIGKILL while warm, while restarting and in the middle of the drafter's check.

Each test starts one or two SmolLM2 servers (about a minute each on two cores), one at a time,
through the resource as the assets do; the drafter check's calls are the asset's own
(`chat_once`, `cold_sampling_check`). Nothing started outlives a test.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import psutil
import pytest

from eagle_assets.engines.process import ServerFailed
from eagle_assets.engines.serving import SMOKE_PROMPTS, chat_once, cold_sampling_check
from eagle_assets.resources.inference_server import InferenceServerResource
from eagle_assets_tests.drafters import write_random_drafter
from eagle_assets_tests.engines.server_probe import engine_tree, kill_group, shm_held_by, still_there, wait_gone

pytestmark = pytest.mark.engine


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A runs folder of the test's own: the server records and logs it starts, and no other's."""
    monkeypatch.setenv("EAGLE_ASSETS_RUNS", str(tmp_path / "runs"))
    return tmp_path / "runs"


@pytest.fixture
def resource():
    made = InferenceServerResource(device="cpu")
    yield made
    made.stop_warm()


def port_of(server) -> int:
    return int(server.base_url.rsplit(":", 1)[1])


def kill(server) -> dict[str, int]:
    """SIGKILL to the server's whole engine; the /dev/shm files it held."""
    tree = engine_tree(port_of(server))
    files = shm_held_by(tree)
    kill_group(tree[0])
    wait_gone(tree)
    return files


def test_a_dead_warm_server_is_started_again_once_and_a_second_death_names_both_logs(smollm2_path, engine_python, runs, resource):
    logs = []
    with resource.serve(log=logs.append) as first:
        assert chat_once(first, SMOKE_PROMPTS[0])
    files = kill(first)  # dead while warm, between two assets
    with resource.serve(log=logs.append) as second:
        assert "Paris" in chat_once(second, SMOKE_PROMPTS[0])
    warned = [line for line in logs if line.startswith("not reusing")]
    assert warned == [
        f"not reusing the warm server at {first.base_url}: vLLM server on port {port_of(first)} was killed by "
        f"SIGKILL (log {first.log_path}); starting it again"
    ]
    assert not any(line.startswith("reusing the running server") for line in logs)
    assert still_there(files) == [], "the dead server's shared memory was left in /dev/shm"

    kill(second)  # the one restart died too: a failure, not a third server
    with pytest.raises(ServerFailed) as info:
        with resource.serve(log=logs.append):
            pass
    message = str(info.value)
    assert message.startswith(f"vLLM server on port {port_of(second)} was killed by SIGKILL (")
    assert f"full log: {second.log_path}" in message and "last lines of its log:" in message
    assert (
        f"it had been started again once already after it died: vLLM server on port {port_of(first)} was killed by SIGKILL; log {first.log_path}"
        in message
    )
    assert not resource._warm and len(list((runs / "servers").glob("vllm-*.log"))) == 2


def test_a_restart_that_fails_too_is_a_clear_failure_naming_both_logs(smollm2_path, engine_python, runs, resource):
    with resource.serve(log=lambda m: None) as first:
        first_pid = engine_tree(port_of(first))[0].pid
    kill(first)
    killed = []

    def kill_the_restart():
        # The restart's record appears as soon as its process does: kill it while it starts.
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for record in (runs / "servers").glob("port-*.json"):
                info = json.loads(record.read_text())
                if info["pid"] != first_pid and psutil.pid_exists(info["pid"]):
                    time.sleep(2)  # a few seconds into its start-up
                    killed.append(kill_group(psutil.Process(info["pid"])))
                    return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_restart, daemon=True)
    killer.start()
    with pytest.raises(ServerFailed) as info:
        with resource.serve(log=lambda m: None):
            pass
    noticed = time.monotonic() - killed[0]
    killer.join(timeout=5)
    message = str(info.value)
    assert noticed < 5, f"the killed restart was noticed {noticed:.1f} s after"
    assert message.startswith(
        f"the server died (vLLM server on port {port_of(first)} was killed by SIGKILL; log {first.log_path}), "
        "and starting it again failed too: vLLM server on port "
    )
    assert "was killed by SIGKILL during start-up" in message and message.count("full log: ") == 1
    restart_log = message.split("full log: ")[1].split()[0]
    assert restart_log != str(first.log_path) and restart_log.startswith(str(runs / "servers"))
    assert not resource._warm and not list((runs / "servers").glob("port-*.json"))


def requests_running(base_url: str) -> float:
    body = urllib.request.urlopen(f"{base_url}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if line.startswith("vllm:num_requests_running"))


def test_a_server_killed_during_the_drafter_check_is_named_with_its_log(smollm2_path, smollm2_config, engine_python, runs, resource, tmp_path):
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config)
    killed: dict[str, object] = {}

    def kill_mid_request(server):
        # Once a request of the check is in the engine, the whole engine goes.
        while not requests_running(server.base_url):
            time.sleep(0.02)
        tree = engine_tree(port_of(server))
        killed["files"] = shm_held_by(tree)
        killed["at"] = kill_group(tree[0])

    with pytest.raises(ServerFailed) as info:
        with resource.serve(drafter=drafter, k=3, log=lambda m: None) as spec:  # what the drafter's checks do
            greedy = [chat_once(spec, p) for p in SMOKE_PROMPTS]
            killer = threading.Thread(target=kill_mid_request, args=(spec,), daemon=True)
            killer.start()
            cold_sampling_check(spec, SMOKE_PROMPTS, greedy)
    noticed = time.monotonic() - killed["at"]
    message = str(info.value)
    assert noticed < 10, f"the killed server was noticed {noticed:.1f} s after"
    assert message.startswith(f"vLLM server on port {port_of(spec)} was killed by SIGKILL while serving (")
    assert f"full log: {spec.log_path}" in message and "last lines of its log:" in message
    assert "what failed with it: " in message  # the request's own error, after the cause
    assert not resource._warm  # never handed out again
    assert still_there(killed["files"]) == []


def test_a_dead_warm_extraction_server_is_started_again_with_a_spool_of_its_own(smollm2_path, engine_python, runs, resource):
    import numpy as np
    import torch

    from eagle_assets.hidden_states.engine_extract import EngineStateClient

    layers, ids = (2, 15, 27, 30), np.array([1, 504, 3458, 314, 4649, 2])
    logs = []
    with resource.extraction_server(layers, 64, log=logs.append) as first:
        before = EngineStateClient(first.base_url, first.model, layers).one(ids)
    (first_spool,) = (runs / "hidden-states").iterdir()  # kept with the warm server
    kill(first)
    with resource.extraction_server(layers, 64, log=logs.append) as second:
        after = EngineStateClient(second.base_url, second.model, layers).one(ids)
    assert any(line.startswith(f"not reusing the warm server at {first.base_url}: ") for line in logs)
    assert before.shape == (6, 4, 576) and torch.equal(before, after)  # the same states from the server started again
    (second_spool,) = (runs / "hidden-states").iterdir()  # the dead server's spool went with it
    assert second_spool != first_spool
