"""The inference client against a real local HTTP server that fails on purpose.

The server is a real socket server in a thread with a script of answers per request
(500, dropped connection, slow answer, 400, success), so retries, timeouts and backoff are
exercised over real connections. The real vLLM server's own 4xx is checked in test_generate.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import time

import pytest

from eagle_assets.corpus.client import ClientSettings, InferenceClient, RequestRejected, ServerStalled, ServerUnreachable
from eagle_assets.engines.process import free_port
from eagle_assets.http_client import retry_after_s
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
                elif action == "late":
                    time.sleep(0.2)
                    self.send_json(200, OK)
                elif action == "stall":  # takes the request and writes nothing for longer than any deadline here
                    time.sleep(5)
                    self.send_json(200, OK)
                elif action.startswith("429 after "):  # shed, asking for a wait: seconds, or an HTTP date
                    self.send_response(429)
                    self.send_header("Retry-After", action.removeprefix("429 after "))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
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


def test_a_stalled_attempt_is_tried_once_more_while_other_requests_finish(serve):
    # The first request to arrive stalls; the second finishes within its deadline, so the server
    # works and the stalled one is tried again (request 3), once. Which of the two coroutines
    # arrives first is the event loop's and the socket's choice, so the attempts are compared as a set.
    server = serve(["stall", "late", "ok"])

    async def run():
        async with InferenceClient(settings(server.url, concurrency=2, timeout_s=0.6)) as client:
            return await asyncio.gather(*(client.chat([{"role": "user", "content": "2+2?"}], {}) for _ in range(2)))

    first, second = asyncio.run(run())
    assert (sorted((first.attempts, second.attempts)), len(server.requests)) == ([1, 2], 3)


def test_a_server_that_takes_requests_and_finishes_none_is_named_within_one_deadline(serve):
    server = serve(["stall"])
    said: list[str] = []

    async def run():
        async with InferenceClient(settings(server.url, concurrency=3, timeout_s=0.6), log=said.append) as client:
            return await asyncio.gather(*(client.chat([], {"max_tokens": 8}) for _ in range(3)), return_exceptions=True)

    started = time.monotonic()
    outcomes = asyncio.run(run())
    took = time.monotonic() - started
    assert all(isinstance(o, ServerStalled) for o in outcomes), outcomes
    assert f"the server at {server.url} finished no request in 1 s" in str(outcomes[0])
    assert 0.55 <= took < 1.5, took  # one deadline, not a retry, not timeout_s x attempts
    assert len(server.requests) == 3
    assert said and f"no request to {server.url} has finished" in said[0], said


def test_a_deadline_fits_the_answer_asked_for():
    s = ClientSettings("http://h", "m")
    assert (s.deadline_s(256), s.deadline_s(2048), s.deadline_s(None)) == (120 + 128, 600, 600)
    assert ClientSettings("http://h", "m", timeout_s=2).deadline_s(256) == 2
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        ClientSettings("http://h", "m", timeout_s=0)


@pytest.mark.parametrize("wait", ["1", "date"])
def test_retry_after_is_honoured(serve, wait):
    when = email.utils.formatdate(time.time() + 2, usegmt=True) if wait == "date" else wait
    server = serve([f"429 after {when}", "ok"])
    started = time.monotonic()
    result = chat(settings(server.url, max_retries=2))
    took = time.monotonic() - started
    assert result.attempts == 2
    assert took >= 0.9, took  # the backoff alone would wait 0.05 s
    assert retry_after_s("120") == 120 and retry_after_s("soon") is None and retry_after_s(None) is None


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
