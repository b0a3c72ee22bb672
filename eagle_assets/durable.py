"""Writes that survive a power loss: fsync the data before the rename that commits it, then
the folder that holds the rename.

A rename is a metadata operation: after a crash the new name can be on disk while the file's
data are not (ext4 and XFS make no promise for a plain rename), leaving a complete-looking file
of zeros or of nothing. So the bytes are flushed first (`fsync_file`), then renamed
(`os.replace`), then the folder is flushed so that the rename itself is kept (`fsync_dir`).

    write_durably(path, data)          # temporary file, fsync, rename, fsync of the folder
    replace_durably(tmp, path)         # the same for a file or folder already written at `tmp`

Local filesystems only; fsspec stores elsewhere do what they allow (see corpus/store.py).
"""

from __future__ import annotations

import errno
import os
import uuid
from pathlib import Path


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
    fsync_tree(tmp)
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
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
