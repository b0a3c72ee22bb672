"""Writes that survive a power loss: fsync the data before the rename that commits it, then
the folder that holds the rename.

A rename is a metadata operation: after a crash the new name can be on disk while the file's
data are not (ext4 and XFS make no promise for a plain rename), leaving a complete-looking file
of zeros or of nothing. So the bytes are flushed first (`fsync_file`), then renamed
(`os.replace`), then the folder is flushed so that the rename itself is kept (`fsync_dir`).

    write_durably(path, data)          # temporary file, fsync, rename, fsync of the folder
    replace_durably(tmp, path)         # the same for a file or folder already written at `tmp`

A write that finds the disk full (or the quota spent) raises `DiskFull`, an OSError whose
message names the path, what was being written and the room left, after removing its temporary
file: the final name keeps its old content or stays absent, never half of the new one.
`no_room(exc, path, what)` turns such an error from any other writer into the same message.

Local filesystems only; fsspec stores elsewhere do what they allow (see corpus/store.py).
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""What a full disk, a spent quota or a file-size limit raise."""


class DiskFull(OSError):
    """A write that found no room; the message names where, what and how much room is left."""

    def __init__(self, code: int, message: str, path: str):
        super().__init__(code, message, path)
        self.message = message

    def __str__(self) -> str:
        return self.message


def free_bytes(path: str | os.PathLike) -> int | None:
    """Bytes free on the filesystem holding `path` (its nearest existing folder); None when unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def no_room(exc: BaseException, path: str | os.PathLike, what: str, kept: str = "nothing was half-written") -> DiskFull | None:
    """`exc` as a `DiskFull` naming `path`, `what` was being written and `kept`, when it says the
    disk is full (or the quota spent); else None. Already one: itself."""
    if isinstance(exc, DiskFull):
        return exc
    if not isinstance(exc, OSError) or exc.errno not in NO_ROOM:
        return None
    free = free_bytes(path)
    room = "free space unknown" if free is None else f"{free / 1e6:.1f} MB free" if free >= 1e6 else f"{free / 1e3:.0f} kB free"
    return DiskFull(
        exc.errno,
        f"no space left on the device holding {path} ({room}; {os.strerror(exc.errno)}) while writing {what}: "
        f"{kept}. Free space there, or write elsewhere, and rerun",
        str(path),
    )


@contextmanager
def room_named(path: str | os.PathLike, what: str, kept: str = "nothing was half-written") -> Iterator[None]:
    """A block whose full-disk error becomes a `DiskFull` naming `path`, `what` and `kept` (`no_room`)."""
    try:
        yield
    except OSError as exc:
        full = no_room(exc, path, what, kept)
        if full is None or full is exc:
            raise
        raise full from None


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file's bytes, read in large blocks (hashlib releases the GIL meanwhile): what
    a committed file's record holds and what a reader checks it against."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def fsync_file(path: str | os.PathLike) -> None:
    """Flush a file's data and size to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Errors that mean "this filesystem cannot fsync a folder" (Windows, some network filesystems),
# not "the data were lost": nothing more can be done there. EIO and ENOSPC are raised.
_CANNOT_FSYNC_DIRS = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EACCES, errno.EPERM, errno.EISDIR}


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (names created, renamed or removed in it) to disk."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in _CANNOT_FSYNC_DIRS:
            return
        raise
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _CANNOT_FSYNC_DIRS:
            raise
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike) -> None:
    """fsync every file under `path`, then every folder, deepest first (a folder about to be renamed)."""
    path = Path(path)
    if path.is_file():
        fsync_file(path)
        return
    folders = [path]
    for p in path.rglob("*"):
        if p.is_dir():
            folders.append(p)
        elif p.is_file():
            fsync_file(p)
    for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(folder)


def replace_durably(tmp: str | os.PathLike, final: str | os.PathLike) -> None:
    """Rename `tmp` (a file or a folder, written and closed) onto `final`, its data flushed
    before and the rename after."""
    try:
        fsync_tree(tmp)
    except OSError as exc:
        raise no_room(exc, final, f"{final}'s data") or exc from None
    os.replace(tmp, final)
    fsync_dir(Path(final).parent)


def write_durably(path: str | os.PathLike, data: bytes) -> None:
    """Replace `path` with `data` atomically and durably (a temporary file beside it)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        full = no_room(exc, path, f"{path.name} ({len(data)} bytes)", f"{path} keeps what it held before")
        if full is not None:
            raise full from None
        raise
    fsync_dir(path.parent)
