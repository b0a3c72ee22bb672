"""Which /dev/shm files a dead server's clean-up removes: those it was seen to use, still the same
files (same inode) and used by no live process; never another's.

The files are real ones this test makes in /dev/shm under names of its own; the servers of a
real engine are in test_liveness.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from eagle_assets.engines.process import ServerProcess, free_port, remove_shm

SHM = Path("/dev/shm")


@pytest.fixture
def shm_files():
    """make(name) creates /dev/shm/<unique prefix>-<name> and returns (path, (dev, inode)); every
    file made is gone after the test."""
    prefix = f"eagle-assets-test-{uuid.uuid4().hex[:8]}"

    def make(name: str) -> tuple[str, tuple[int, int]]:
        path = SHM / f"{prefix}-{name}"
        path.write_bytes(b"\0" * 64)
        st = path.stat()
        return str(path), (st.st_dev, st.st_ino)

    yield make
    for path in SHM.glob(f"{prefix}-*"):
        path.unlink()


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_only_the_same_files_used_by_no_one_are_removed(shm_files):
    gone, gone_key = shm_files("gone")
    renamed, renamed_key = shm_files("made-again")
    os.unlink(renamed)
    shm_files("made-again")  # the same name, another file: someone else's now
    held, held_key = shm_files("held")
    with open(held, "rb"):  # a live process (this one) still uses it
        removed = remove_shm({gone: gone_key, renamed: renamed_key, held: held_key})
    assert removed == [gone]
    assert not os.path.exists(gone) and os.path.exists(renamed) and os.path.exists(held)


def test_an_openmp_registration_of_a_live_process_stays(shm_files):
    # Intel OpenMP names its file after the process; it is neither held nor mapped.
    mine = SHM / f"__KMP_REGISTERED_LIB_{os.getpid()}_0"
    if mine.exists():
        pytest.skip("this process's own registration exists already")
    mine.write_bytes(b"x")
    try:
        st = mine.stat()
        assert remove_shm({str(mine): (st.st_dev, st.st_ino)}) == []
        assert mine.exists()
    finally:
        mine.unlink()


def test_a_server_started_on_the_port_of_a_dead_one_removes_what_that_one_left(shm_files, tmp_path):
    left, key = shm_files("left")
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]
    record = tmp_path / f"port-{port}.json"
    record.write_text(
        json.dumps({"pid": dead_pid(), "pgid": 4242, "port": port, "command": command, "shm": [{"path": left, "dev": key[0], "ino": key[1]}]})
    )
    with ServerProcess(command, dict(os.environ), tmp_path / "server.log", port, name="test server", record_dir=tmp_path) as server:
        server.start()
        server.wait_ready([f"http://127.0.0.1:{port}/"], 30)
        assert not os.path.exists(left)
        assert json.loads(record.read_text())["pid"] == server.proc.pid  # the record is this server's now
    assert not record.exists()
