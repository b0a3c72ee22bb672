"""What a test sees of a real engine server from outside: its processes, the /dev/shm files they
use, and a SIGKILL to its whole process group (what the kernel's OOM killer or `kill -9` does).

Read from /proc as the kernel shows it, independently of `engines/process.py`, so that a test of
that module's clean-up does not take its own word for what the server held.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import psutil

from eagle_assets.engines.process import port_holder

SHM = Path("/dev/shm")


def engine_tree(port: int) -> list[psutil.Process]:
    """The process listening on `port` and every process below it."""
    holder = port_holder(port)
    assert holder is not None, f"nothing listens on port {port}"
    root = psutil.Process(holder[0])
    return [root, *root.children(recursive=True)]


def shm_held_by(procs: list[psutil.Process]) -> dict[str, int]:
    """path -> inode of the /dev/shm files these processes map or hold open (a semaphore's map
    shows the temporary name it was created under: the inode says which file it is now), and
    of Intel OpenMP's registration file of each (named after its pid)."""
    inodes = set()
    for p in procs:
        try:
            for row in Path(f"/proc/{p.pid}/maps").read_text().splitlines():
                if "/dev/shm/" in row:
                    inodes.add(int(row.split()[4]))
            for fd in Path(f"/proc/{p.pid}/fd").iterdir():
                if os.readlink(fd).startswith("/dev/shm/"):
                    inodes.add(os.stat(fd).st_ino)
        except OSError:
            continue
    pids = {p.pid for p in procs}
    out = {}
    for entry in SHM.iterdir():
        ino = entry.stat().st_ino
        registered = entry.name.startswith("__KMP_REGISTERED_LIB_") and int(entry.name.split("_")[5]) in pids
        if ino in inodes or registered:
            out[str(entry)] = ino
    return out


def still_there(files: dict[str, int]) -> list[str]:
    """Those of `files` still in /dev/shm as the same file."""
    left = []
    for path, ino in files.items():
        try:
            if os.stat(path).st_ino == ino:
                left.append(path)
        except FileNotFoundError:
            continue
    return left


def kill_group(proc: psutil.Process) -> float:
    """SIGKILL to `proc`'s whole process group; the monotonic time it was sent."""
    os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
    return time.monotonic()


def wait_gone(procs: list[psutil.Process], timeout_s: float = 10) -> None:
    """Wait until none of `procs` runs (a zombie waiting for its parent counts as gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in procs if _exists(p)):
            return
        time.sleep(0.1)
    raise AssertionError(f"still running: {[p.pid for p in procs if _exists(p) and p.is_running()]}")


def _exists(p: psutil.Process) -> bool:
    try:
        p.status()
        return True
    except psutil.NoSuchProcess:
        return False
