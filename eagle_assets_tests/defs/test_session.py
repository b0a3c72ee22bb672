"""The session `eagle-assets run` and `eagle-assets ui` hold (defs/session.py), with real processes.

One command (`session_child.py`) holds a session over the toy location: `dagster dev` under the
supervisor, a run of the toy graph launched through the UI's GraphQL API and launched by the
daemon. While it runs, a second session on the same instance and data folder is refused, naming
the first; its run worker is SIGKILLed and the command hears that the worker was killed; then the
command itself is SIGKILLed mid-run, and the supervisor cancels that run and stops every process
of the session. The toy location's fixture then checks that none is left.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time

import dagster as dg
import pytest

from eagle_assets.defs.session import DagsterSession, SessionBusy, SessionLock, worker_pid
from eagle_assets.paths import PROJECT_ROOT

WAIT_S = 300  # a loaded 2-core host: the session's start, a run worker's start


def _lines(proc: subprocess.Popen) -> queue.Queue:
    out: queue.Queue = queue.Queue()

    def pump():
        for line in proc.stdout:
            out.put(line.strip())

    threading.Thread(target=pump, daemon=True).start()
    return out


def _next(lines: queue.Queue, prefix: str, proc: subprocess.Popen) -> str:
    try:
        line = lines.get(timeout=WAIT_S)
    except queue.Empty:
        pytest.fail(f"no {prefix} line from the command in {WAIT_S} s (exit {proc.poll()})")
    assert line.startswith(prefix), line
    return line[len(prefix) :].strip()


def _started(instance: dg.DagsterInstance, run_id: str) -> int:
    """Wait until the run's step c0 is going; its worker's pid."""
    deadline = time.monotonic() + WAIT_S
    while True:
        steps = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_START)
        if any(e.step_key == "c0" for e in steps):
            return worker_pid(instance, run_id)
        assert time.monotonic() < deadline, f"run {run_id} did not reach c0 in {WAIT_S} s: {instance.get_run_by_id(run_id).status}"
        time.sleep(1)


def test_one_session_per_folder_a_killed_worker_is_named_and_a_killed_command_leaves_nothing(toy_location, monkeypatch):
    monkeypatch.setenv("EAGLE_TOY_C_SECONDS", "600")
    instance, home, data = toy_location.instance, toy_location.home, toy_location.data
    proc = subprocess.Popen(
        [sys.executable, "-m", "eagle_assets_tests.defs.session_child", str(toy_location.workspace)],
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ),
    )
    try:
        lines = _lines(proc)
        first = _next(lines, "RUN", proc)
        worker = _started(instance, first)

        # A second session on the same folders is refused, naming the first.
        with pytest.raises(
            SessionBusy, match=rf"in use by another eagle-assets session: pid {proc.pid} \(`session_child`, since .*its UI at http://127"
        ):
            DagsterSession(home, data, workspace=toy_location.workspace, log=lambda m: None).__enter__()

        # The run worker is killed: the command is told so, in those words.
        os.kill(worker, signal.SIGKILL)
        failed = _next(lines, "FAILED", proc)
        assert f"(run {first}) failed: its run worker (pid {worker}) was killed" in failed, failed
        assert instance.get_run_by_id(first).status == dg.DagsterRunStatus.FAILURE

        # The command is killed mid-run: its run is cancelled, not left STARTED.
        second = _next(lines, "RUN", proc)
        _started(instance, second)
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 180
        while instance.get_run_by_id(second).status not in (dg.DagsterRunStatus.CANCELED, dg.DagsterRunStatus.FAILURE):
            assert time.monotonic() < deadline, instance.get_run_by_id(second).status
            time.sleep(1)
        assert instance.get_run_by_id(second).status == dg.DagsterRunStatus.CANCELED
        # The folders are free again (the kernel released the lock with the command).
        deadline = time.monotonic() + 60
        lock = SessionLock((home, data))
        while True:
            try:
                lock.acquire({"pid": os.getpid()})
                break
            except SessionBusy:
                assert time.monotonic() < deadline, "the session's lock outlived its command"
                time.sleep(1)
        lock.release()
    finally:
        if proc.poll() is None:
            proc.kill()
    # The toy_location fixture checks that no webserver, daemon, code server or run worker is left.
