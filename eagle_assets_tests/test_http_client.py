"""The one retry policy and client factory every server client uses (eagle_assets/http_client.py)."""

import asyncio
import random

import httpx

from eagle_assets.http_client import auth_headers, client, retry_delay_s, retryable_status


def test_the_delay_doubles_is_jittered_to_its_upper_half_and_capped():
    rng = random.Random(0)
    for attempt, full in ((1, 1.0), (2, 2.0), (3, 4.0), (7, 30.0), (20, 30.0)):
        waits = [retry_delay_s(attempt, 1.0, 30.0, rng=rng) for _ in range(200)]
        assert full / 2 <= min(waits) and max(waits) <= full
        assert max(waits) - min(waits) > full / 4  # jittered, not one value


def test_retry_after_is_a_floor_up_to_its_cap():
    assert retry_delay_s(1, 1.0, 30.0, retry_after=12.0) == 12.0
    assert retry_delay_s(1, 1.0, 30.0, retry_after=9999.0, retry_after_max_s=300.0) == 300.0
    assert retry_delay_s(5, 1.0, 30.0, retry_after=0.0, rng=random.Random(1)) >= 8.0  # a small ask does not shorten the backoff


def test_which_answers_a_retry_may_cure():
    assert [s for s in (200, 400, 401, 404, 408, 422, 429, 500, 503) if retryable_status(s)] == [408, 429, 500, 503]


def test_clients_carry_the_key_and_the_timeouts():
    assert auth_headers(None) == {} and auth_headers("k") == {"Authorization": "Bearer k"}
    with client("secret", 120.0) as http:
        assert http.headers["Authorization"] == "Bearer secret"
        assert (http.timeout.read, http.timeout.connect) == (120.0, 30.0)

    async def make():
        async with client(None, 5.0, asynchronous=True) as http:
            return isinstance(http, httpx.AsyncClient), "Authorization" in http.headers

    assert asyncio.run(make()) == (True, False)
