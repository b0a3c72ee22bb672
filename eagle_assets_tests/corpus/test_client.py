"""The inference client against a real local HTTP server that fails on purpose.

The server is a real socket server in a thread with a script of answers per request
(500, dropped connection, slow answer, 400, success), so retries, timeouts and backoff are
exercised over real connections. The real vLLM server's own 4xx is checked in test_generate.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from eagle_assets.corpus.client import (
    ClientSettings,
    InferenceClient,
    RequestRejected,
    RetriesExhausted,
    ServerUnreachable,
)
from eagle_assets.engines.process import free_port
from eagle_assets_tests.http_stub import JsonHandler, StubServer

OK = {
    "choices": [{"message": {"role": "assistant", "content": "4", "reasoning": "2+2"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 7, "completion_tokens": 1},
}


class ScriptedServer(StubServer):
    """Answers request n with script[n] (the last entry repeats); records what it received."""

    def __init__(self, script: list[str]):
        self.script = script
        self.requests: list[dict] = []
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                self.send_json(200, {"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"body": body, "auth": self.headers.get("Authorization")})
                action = outer.script[min(len(outer.requests), len(outer.script)) - 1]
                if action == "drop":
                    self.connection.shutdown(2)  # close without an answer: a dropped connection
                    self.close_connection = True
                elif action == "slow":
                    time.sleep(0.5)
                    self.send_json(200, OK)
                elif action.isdigit():
                    self.send_json(int(action), {"error": {"message": f"scripted {action}"}})
                else:
                    self.send_json(200, OK)

        super().__init__(Handler)


@pytest.fixture
def serve():
    servers = []

    def start(script):
        servers.append(ScriptedServer(script))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def chat(settings: ClientSettings):
    async def run():
        async with InferenceClient(settings) as client:
            return await client.chat([{"role": "user", "content": "2+2?"}], {"max_tokens": 4})

    return asyncio.run(run())


def settings(url, **kw) -> ClientSettings:
    return ClientSettings(url, "m", **{"backoff_s": 0.05, "backoff_max_s": 0.1, **kw})


def test_server_errors_and_dropped_connections_are_retried(serve):
    server = serve(["500", "drop", "503", "ok"])
    result = chat(settings(server.url, max_retries=3))
    assert (result.content, result.reasoning_content, result.finish_reason) == ("4", "2+2", "stop")
    assert (result.prompt_tokens, result.completion_tokens, result.attempts) == (7, 1, 4)
    assert len(server.requests) == 4


def test_timeouts_are_retried_and_retries_run_out(serve):
    server = serve(["slow"])
    with pytest.raises(RetriesExhausted, match=r"gave up after 3 attempts; last error: .*ReadTimeout"):
        chat(settings(server.url, max_retries=2, timeout_s=0.3))
    assert len(server.requests) == 3


def test_client_errors_are_not_retried_and_the_key_never_shows(serve):
    server = serve(["400", "ok"])
    secret = "sk-do-not-print-me"
    s = settings(server.url, api_key=secret, max_retries=3)
    with pytest.raises(RequestRejected, match="rejected the request with HTTP 400: .*scripted 400") as err:
        chat(s)
    assert len(server.requests) == 1  # no retry
    assert server.requests[0]["auth"] == f"Bearer {secret}"  # sent to the server ...
    assert secret not in str(err.value) and secret not in repr(s) and secret not in repr(InferenceClient(s))  # ... and nowhere else


def test_unreachable_server_names_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there

    async def run():
        async with InferenceClient(settings(url)) as client:
            await client.check_server()

    with pytest.raises(ServerUnreachable, match=f"cannot reach the inference server at {url}/v1/models"):
        asyncio.run(run())


def test_concurrency_is_bounded(serve):
    server = serve(["slow"])

    async def run():
        async with InferenceClient(settings(server.url, concurrency=2)) as client:
            start = time.perf_counter()
            await asyncio.gather(*(client.chat([], {}) for _ in range(4)))
            return time.perf_counter() - start

    # Four half-second answers, two at a time: two rounds (not one, not four).
    assert 0.95 <= asyncio.run(run()) < 1.9
