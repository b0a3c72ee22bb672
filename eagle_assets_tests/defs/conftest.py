"""Real Dagster instances for the defs tests: a blank instance made once and copied (creating a
SQLite instance costs seconds, copying one a fraction of that), and the toy graph as a code
location (`toy_location`)."""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import psutil
import pytest

from eagle_assets.paths import PROJECT_ROOT
from eagle_assets_tests.defs.toy_graph import persistent_instance


def _open(src: Path, dest: Path) -> dg.DagsterInstance:
    shutil.copytree(src, dest)
    # The copied dagster.yaml still names the source folder: point it at the copy.
    yaml = dest / "dagster.yaml"
    yaml.write_text(yaml.read_text().replace(str(src), str(dest)))
    return dg.DagsterInstance.from_config(str(dest))


@pytest.fixture(scope="session")
def _blank_home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("blank") / "home"
    persistent_instance(home).dispose()
    return home


@pytest.fixture
def instance(tmp_path, _blank_home):
    """An empty on-disk instance of this test's own."""
    with _open(_blank_home, tmp_path / "home") as inst:
        yield inst


@dataclass
class ToyLocation:
    """A real instance with the project's own dagster.yaml (its run queue and run launcher) and a
    workspace file whose code location is the toy graph (toy_location.py)."""

    instance: dg.DagsterInstance
    home: Path
    data: Path
    workspace: Path


def _processes_of(data: Path) -> list[psutil.Process]:
    """Processes started for the toy location of `data` (they inherit EAGLE_TOY_DATA)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and proc.environ().get("EAGLE_TOY_DATA") == str(data):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def live_group_members(pgid: int, wait_s: float = 15.0) -> list[psutil.Process]:
    """Processes of the process group `pgid` still running after up to `wait_s` (zombies do not count)."""
    deadline = time.monotonic() + wait_s
    while True:
        members = []
        for proc in psutil.process_iter():
            try:
                if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                    members.append(proc)
            except (psutil.NoSuchProcess, ProcessLookupError, psutil.AccessDenied):
                continue
        if not members or time.monotonic() > deadline:
            return members
        time.sleep(0.5)


@pytest.fixture
def toy_location(tmp_path, monkeypatch):
    """A ToyLocation of this test's own. The environment set here is what the daemon, the code
    server, the run workers and Celery's workers inherit. Afterwards no process started for it may
    be left running."""
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    shutil.copyfile(PROJECT_ROOT / "dagster.yaml", home / "dagster.yaml")
    workspace = tmp_path / "workspace.yaml"
    workspace.write_text(
        "load_from:\n  - python_module:\n      module_name: eagle_assets_tests.defs.toy_location\n"
        f"      working_directory: {PROJECT_ROOT}\n      location_name: toy\n"
    )
    monkeypatch.setenv("DAGSTER_HOME", str(home))
    monkeypatch.setenv("EAGLE_TOY_DATA", str(data))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(PROJECT_ROOT), os.environ.get("PYTHONPATH")) if p))
    # dagster-celery starts `celery` by name: the interpreter's own scripts come first.
    monkeypatch.setenv("PATH", os.pathsep.join((str(Path(sys.executable).parent), os.environ.get("PATH", ""))))
    for name in ("EAGLE_ASSETS_EXECUTOR", "EAGLE_TOY_C_SECONDS"):
        monkeypatch.delenv(name, raising=False)
    with dg.DagsterInstance.from_config(str(home)) as instance:
        yield ToyLocation(instance, home, data, workspace)
    deadline = time.monotonic() + 30
    while (left := _processes_of(data)) and time.monotonic() < deadline:
        time.sleep(0.5)
    for proc in left:
        proc.kill()
    assert not left, f"processes left running: {[' '.join(p.cmdline()[:6]) for p in left if p.is_running()]}"
