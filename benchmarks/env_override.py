"""One environment variable set for the servers a benchmark starts inside a block, then restored."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def environment_variable(name: str, value: str | None) -> Iterator[None]:
    """Inside the block `name` is `value` (None: unset); afterwards it is what it was, even on error.

    `engine_environment` copies os.environ when a server starts, so a server started inside the
    block sees the value and the default that would otherwise apply stands aside for it."""
    saved = os.environ.get(name)
    _assign(name, value)
    try:
        yield
    finally:
        _assign(name, saved)


def _assign(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
