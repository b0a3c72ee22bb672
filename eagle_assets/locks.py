"""One run at a time for work that two commands could start together (a target pull, the engine
environment's build): the second waits for the first, then finds the work done.

    with exclusive(targets_dir() / ".llama-3.1-8b-instruct.lock", "llama-3.1-8b-instruct"):
        ...  # check whether it is done, do it if not

The lock is an OS file lock (`filelock.FileLock`): the kernel releases it when its holder dies,
so a killed run never leaves the next one waiting forever.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout


@contextmanager
def exclusive(lock_file: Path, what: str, log: Callable[[str], None] = print) -> Iterator[None]:
    """Hold `lock_file` for the block; when another process holds it, say so (naming `what` and
    the lock file) and wait for it."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_file)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        log(f"{what}: waiting for another run that holds {lock_file} (it is doing the same work; this one then finds it done)")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()
