"""Every rename that commits data is preceded by an fsync of those data and followed by an fsync
of the folder that holds the new name: after a power loss, a committed name never points at data
that were not on disk (a complete-looking shard or checkpoint of zeros).

The writers run in a child process under strace (fsync and rename system calls, with the paths
of the file descriptors), so the order is the kernel's own record, not a stand-in.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_assets.paths import PROJECT_ROOT

STRACE = shutil.which("strace")
CALL = re.compile(r"^\d+\s+(fsync|fdatasync|rename|renameat|renameat2)\((.*)\)\s+=\s+0$")


def syscalls(log: Path) -> list[tuple[str, tuple[str, ...]]]:
    """(call, paths) in order: fsync(3</a/b>) -> ("fsync", ("/a/b",)); rename("/a", "/b") -> ("rename", ("/a", "/b"))."""
    out = []
    for line in log.read_text().splitlines():
        m = CALL.match(line)
        if m:
            name, args = m.groups()
            paths = re.findall(r"<([^>]*)>", args) if name.startswith(("fsync", "fdatasync")) else re.findall(r'"([^"]*)"', args)
            out.append(("rename" if name.startswith("rename") else "fsync", tuple(paths)))
    return out


@pytest.mark.skipif(STRACE is None, reason="strace is not installed (apt-get install strace)")
def test_every_committing_rename_is_fsynced_before_and_after(tmp_path):
    out, log = tmp_path / "out", tmp_path / "strace.log"
    cmd = [
        STRACE,
        "-f",
        "-qq",
        "-y",
        "-e",
        "trace=fsync,fdatasync,rename,renameat,renameat2",
        "-o",
        str(log),
        sys.executable,
        "-m",
        "eagle_assets_tests.durable_writes_child",
        str(out),
    ]
    done = subprocess.run(cmd, cwd=PROJECT_ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    calls = syscalls(log)
    # A commit publishes a temporary name under its final one; renames inside a temporary folder
    # (safetensors writes through one of its own) are covered by the fsyncs before the folder's.
    commits = [
        (i, paths[0], paths[1])
        for i, (call, paths) in enumerate(calls)
        if call == "rename" and ".tmp" in Path(paths[0]).name and ".tmp" not in paths[1]
    ]
    committed = {Path(dst).relative_to(out).parts[0] for _, _, dst in commits}
    # Each writer committed something: the store, the shard writer, the checkpoint, the export, metrics.
    assert committed == {"corpus", "hs", "checkpoints", "drafter-vllm", "metrics.jsonl"}, committed
    for i, src, dst in commits:
        synced_before = {p for call, paths in calls[:i] if call == "fsync" for p in paths}
        files = [p for p in Path(dst).rglob("*") if p.is_file()] if Path(dst).is_dir() else [Path(dst)]
        assert files, dst
        for f in files:  # the data, under their temporary name (or an earlier one), before the rename
            before = src if f == Path(dst) else os.path.join(src, f.relative_to(dst))
            assert names_of(before, calls[:i]) & synced_before, f"{before} renamed to {dst} without an fsync first"
        synced_after = [p for call, paths in calls[i + 1 :] if call == "fsync" for p in paths]
        assert str(Path(dst).parent) in synced_after, f"rename to {dst}: its folder is never fsynced after it"


def names_of(path: str, calls) -> set[str]:
    """`path` and the names it was renamed from earlier in `calls`."""
    names = {path}
    for call, paths in reversed(calls):
        if call == "rename" and paths[1] in names:
            names.add(paths[0])
    return names
