"""A real HTTP server that streams chat completions as vLLM does, and fails on demand.

It listens on a free local port in a thread (`http_stub.StubServer`) and answers
`/v1/chat/completions` with an SSE stream of exactly `max_tokens` tokens, one per chunk, each
with its running usage (`continuous_usage_stats`), then `[DONE]`; `/health` and `/metrics`
(no speculation counters) as a server without speculation does. `fail` scripts a failure for a
request's first attempt; `die_after` makes it stop answering anything, /health included, once
it has answered that many chats: the tests of retries, of a server that dies mid-sweep and of
resuming need those on cue, which a real engine gives only at random.
"""

from __future__ import annotations

import json
import threading
import time

from eagle_assets_tests.http_stub import JsonHandler, StubServer


class StreamingServer(StubServer):
    """See the module docstring. `fail` maps a prompt's text to "503" or "drop" for its first
    attempt; `chats` counts the chat requests it received, by prompt text."""

    def __init__(self, fail: dict[str, str] | None = None, die_after: int | None = None, token_s: float = 0.002):
        self.fail = dict(fail or {})
        self.die_after = die_after
        self.chats: list[str] = []
        self.dead = False
        lock = threading.Lock()
        outer = self

        class Handler(JsonHandler):
            def drop(self) -> None:
                self.connection.shutdown(2)  # no answer at all: a dead server's refused or reset connection
                self.close_connection = True

            def do_GET(self):
                if outer.dead:
                    return self.drop()
                self.answer_get()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                prompt = body["messages"][-1]["content"]
                with lock:
                    if outer.dead:
                        return self.drop()
                    first = prompt not in outer.chats
                    outer.chats.append(prompt)
                    if outer.die_after is not None and len(outer.chats) > outer.die_after:
                        outer.dead = True
                        return self.drop()
                action = outer.fail.get(prompt) if first else None
                if action == "drop":
                    return self.drop()
                if action == "503":
                    return self.send_json(503, {"error": {"message": "scripted 503"}})
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                try:
                    for i in range(1, body["max_tokens"] + 1):
                        time.sleep(token_s)
                        chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"completion_tokens": i}}
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                        self.wfile.flush()
                    self.wfile.write(b"data: [DONE]\n\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

        super().__init__(Handler)
