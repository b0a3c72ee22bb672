"""A real vLLM server killed with SIGKILL after it started: `eagle-assets serve` notices within
seconds and exits 1 with the engine's last log lines, and no /dev/shm file of the dead server
is left, whether `serve` cleans up or `serve --stop` does it later from another process.

Each test starts one SmolLM2 server through the command line (about a minute on two cores) and
kills it; nothing it started outlives it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from eagle_assets.engines.process import free_port, port_in_use
from eagle_assets_tests.engines.server_probe import engine_tree, kill_group, shm_held_by, still_there, wait_gone

pytestmark = pytest.mark.engine
ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / ".venv" / "bin" / "eagle-assets")


def start_serve(port: int, runs: Path) -> subprocess.Popen:
    env = {**os.environ, "EAGLE_ASSETS_RUNS": str(runs)}
    return subprocess.Popen(
        [CLI, "serve", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )


def wait_serving(proc: subprocess.Popen) -> None:
    for line in proc.stdout:
        if "Ctrl-C stops it" in line:
            return
    raise AssertionError(f"serve ended before serving: {proc.stderr.read()[-3000:]}")


def end(proc: subprocess.Popen, port: int) -> None:
    """Nothing a test started outlives it: the command (SIGTERM tears its server down), then
    whatever still listens on the port."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    if port_in_use(port):
        kill_group(engine_tree(port)[0])


def test_serve_exits_within_seconds_when_its_engine_is_killed_and_leaves_no_shared_memory(smollm2_path, engine_python, tmp_path):
    port = free_port()
    proc = start_serve(port, tmp_path)
    try:
        wait_serving(proc)
        time.sleep(1.5)  # the watcher's first notes of the ready server
        tree = engine_tree(port)
        files = shm_held_by(tree)
        assert files, "a vLLM CPU server uses shared memory: the test must see some"
        killed_at = kill_group(tree[0])
        code = proc.wait(timeout=30)
        noticed = time.monotonic() - killed_at
        stderr = proc.stderr.read()
    finally:
        end(proc, port)
    assert code == 1, stderr
    assert noticed < 5, f"serve exited {noticed:.1f} s after its engine was killed"
    assert f"the server stopped serving: vLLM server on port {port} was killed by SIGKILL (" in stderr
    assert "last lines of its log:" in stderr and "full log: " in stderr and "Traceback" not in stderr
    log = Path(stderr.split("full log: ")[1].split()[0])
    last_line = [line for line in log.read_text().splitlines() if line.strip()][-1]
    assert last_line.split(") ", 1)[-1].strip() in stderr  # the engine's own last words
    wait_gone(tree)
    assert still_there(files) == [], "the killed server's shared memory was left in /dev/shm"
    assert not (tmp_path / "servers" / f"port-{port}.json").exists()


def test_serve_stop_removes_the_shared_memory_a_killed_server_left(smollm2_path, engine_python, tmp_path):
    port = free_port()
    proc = start_serve(port, tmp_path)
    try:
        wait_serving(proc)
        time.sleep(1.5)
        tree = engine_tree(port)
        files = shm_held_by(tree)
        # The command first, so that nothing cleans up after the server, then the server itself.
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        kill_group(tree[0])
        wait_gone(tree)
        left = still_there(files)
        assert left, "a SIGKILLed server leaves its shared memory: nothing would show the clean-up"
        record = json.loads((tmp_path / "servers" / f"port-{port}.json").read_text())
        env = {**os.environ, "EAGLE_ASSETS_RUNS": str(tmp_path)}
        stop = subprocess.run([CLI, "serve", "--stop", "--port", str(port)], capture_output=True, text=True, timeout=120, env=env)
    finally:
        end(proc, port)
    assert stop.returncode == 0, stop.stderr
    assert f"the record was stale (pid {record['pid']} is gone)" in stop.stdout
    assert f"removed {len(left)} shared-memory file" in stop.stdout
    assert still_there(files) == []
    assert not (tmp_path / "servers" / f"port-{port}.json").exists()
