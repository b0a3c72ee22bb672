"""The pipeline's HTTP clients and its one retry policy.

Every client of a server (the corpus's, the hidden-state extraction's, the benchmark's, the
greedy check's) is made by `client()`: the bearer token where a key is given, a connect timeout
apart from the read timeout (a long prefill may take minutes; connecting should not). Every retry
waits `retry_delay_s()`: doubling from `first_s` up to `max_s`, jittered to [d/2, d] so requests
that failed together do not come back together, and never sooner than the server's
`Retry-After` (capped at `retry_after_max_s`), since a retry sooner would be shed again.
"""

from __future__ import annotations

import datetime
import email.utils
import random
from typing import Any

import httpx

CONNECT_TIMEOUT_S = 30.0
RETRY_AFTER_MAX_S = 300.0


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The bearer header for `api_key`; none without one."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def client(
    api_key: str | None = None, timeout_s: float | None = None, connect_s: float = CONNECT_TIMEOUT_S, asynchronous: bool = False, **kwargs: Any
) -> httpx.Client | httpx.AsyncClient:
    """An httpx client (AsyncClient with `asynchronous`) with the key's header and the timeouts;
    `kwargs` go to httpx (limits, follow_redirects)."""
    timeout = httpx.Timeout(timeout_s, connect=connect_s)
    kind = httpx.AsyncClient if asynchronous else httpx.Client
    return kind(headers=auth_headers(api_key), timeout=timeout, **kwargs)


def retryable_status(status: int) -> bool:
    """Whether a retry may cure this answer: a server error, a timeout (408) or shedding (429)."""
    return status >= 500 or status in (408, 429)


def retry_after_s(value: str | None) -> float | None:
    """Seconds a `Retry-After` header asks to wait (a number of seconds, or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def retry_delay_s(
    attempt: int,
    first_s: float = 1.0,
    max_s: float = 30.0,
    retry_after: float | None = None,
    retry_after_max_s: float = RETRY_AFTER_MAX_S,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before retrying after failed attempt number `attempt` (1 for the first)."""
    delay = min(max_s, first_s * 2 ** (attempt - 1)) * (rng or random).uniform(0.5, 1.0)
    if retry_after is not None:
        delay = max(delay, min(retry_after, retry_after_max_s))
    return delay
