"""`eagle-assets serve --stop`: only a live server of ours is signalled, never what a stale record
points at now (pids and process groups are reused, and records outlive reboots)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle_assets.engines.process import PortBusy, ServerProcess, _alive, descendants, free_port, stop_recorded

CLI = str(Path(__file__).resolve().parents[2] / ".venv" / "bin" / "eagle-assets")


def start_unrelated(command: list[str]) -> subprocess.Popen:
    """A process in a group of its own, standing in for someone else's process."""
    return subprocess.Popen(command, start_new_session=True, stdin=subprocess.DEVNULL)


def end(proc: subprocess.Popen) -> None:
    """Nothing a test started outlives it, whatever the test did."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


@pytest.fixture
def unrelated():
    """Someone else's process, in a group of its own, running `sleep 300`; never outlives the test."""
    proc = start_unrelated(["sleep", "300"])
    yield proc
    end(proc)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def write_record(records: Path, port: int, **fields) -> Path:
    records.mkdir(parents=True, exist_ok=True)
    record = records / f"port-{port}.json"
    record.write_text(json.dumps({"port": port, "log": "/nowhere.log", "started": "2020-01-01 00:00:00", **fields}))
    return record


def test_a_record_with_a_dead_pid_leaves_the_recorded_process_group_alone(tmp_path, unrelated):
    record = write_record(tmp_path, 18999, pid=dead_pid(), pgid=unrelated.pid, command=["python", "-m", "vllm"])
    message = stop_recorded(tmp_path, 18999)
    assert "no server of ours was running" in message and "stale" in message
    assert not record.exists()
    time.sleep(0.2)
    assert unrelated.poll() is None, "an unrelated process group was signalled"


def test_the_cli_reports_a_stale_record_and_signals_nothing(tmp_path, unrelated):
    # The same stale record, through the command line.
    write_record(tmp_path / "servers", 18999, pid=dead_pid(), pgid=unrelated.pid, command=["python", "-m", "vllm"])
    env = {**os.environ, "EAGLE_ASSETS_RUNS": str(tmp_path)}
    proc = subprocess.run([CLI, "serve", "--stop", "--port", "18999"], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "stale" in proc.stdout and "stopped" not in proc.stdout
    assert unrelated.poll() is None, "an unrelated process group was signalled"


def test_a_live_pid_running_another_command_is_left_alone(tmp_path, unrelated):
    server_command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--port", "18999"]
    record = write_record(tmp_path, 18999, pid=unrelated.pid, pgid=unrelated.pid, command=server_command)
    message = stop_recorded(tmp_path, 18999)
    assert f"pid {unrelated.pid} now belongs to another process" in message and "left alone" in message
    assert "sleep 300" in message
    assert not record.exists()
    time.sleep(0.2)
    assert unrelated.poll() is None, "a process that is not our server was signalled"


def test_a_live_server_matching_its_record_is_stopped_with_its_group(tmp_path):
    # A shell with a child in its group, as a server with its workers.
    command = ["sh", "-c", "sleep 300 & wait"]
    server = start_unrelated(command)
    try:
        deadline = time.monotonic() + 10
        while not descendants(server.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = descendants(server.pid)
        assert workers, "the stand-in server started no child"
        record = write_record(tmp_path, 18999, pid=server.pid, pgid=server.pid, command=command)
        message = stop_recorded(tmp_path, 18999)
        assert message == f"stopped the server of ours on port 18999 (pid {server.pid}) and the record was removed"
        assert not record.exists()
        server.wait(timeout=10)
        assert not any(_alive(p) for p in workers)
    finally:
        end(server)


@pytest.mark.parametrize(
    "content, named",
    [
        ("{not json", "unreadable"),
        ("[1, 2]", "no JSON object"),
        (json.dumps({"pid": 12345, "command": ["sleep", "300"]}), "'pgid'"),
        (json.dumps({"pid": 12345, "pgid": 12345}), "'command'"),
        # 0 and -1 would reach our own group or every process of this user: refused as data.
        (json.dumps({"pid": -1, "pgid": 12345, "command": ["sleep"]}), "'pid'"),
        (json.dumps({"pid": 12345, "pgid": 0, "command": ["sleep"]}), "'pgid'"),
    ],
)
def test_a_corrupt_record_is_named_and_removed_without_signalling(tmp_path, monkeypatch, content, named):
    # Signals are stood in for here: a corrupt record names no process whose survival could show
    # a wrong signal, and a real one sent to pid -1 would reach every process of this user.
    def refuse(*args):
        raise AssertionError(f"a corrupt record led to a signal: {args}")

    record = tmp_path / "port-18999.json"
    record.write_text(content)
    monkeypatch.setattr(os, "kill", refuse)
    monkeypatch.setattr(os, "killpg", refuse)
    message = stop_recorded(tmp_path, 18999)
    assert str(record) in message and named in message
    assert "the record was removed" in message
    assert not record.exists()


def test_a_corrupt_record_does_not_hide_who_holds_a_busy_port(tmp_path):
    port = free_port()
    write_record(tmp_path, port, pid="not a pid")
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(PortBusy, match=rf"port {port} is already in use by pid {os.getpid()}"):
            ServerProcess(["true"], dict(os.environ), tmp_path / "x.log", port, record_dir=tmp_path).check_port()
