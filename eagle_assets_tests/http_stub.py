"""A real HTTP server on a free local port, in a thread, answering JSON: the stand-in for an
OpenAI-compatible server in tests of what talks to one over real connections."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class JsonHandler(BaseHTTPRequestHandler):
    """A request handler that answers with `send_json` and keeps the test output clean."""

    def log_message(self, *args):
        pass

    def send_json(self, status: int, payload) -> None:
        data = json.dumps(payload).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client timed out and left: what timeout tests want

    def answer_get(self) -> None:
        """What a vLLM server answers to the GETs its clients send: /metrics (no request running),
        /v1/models (one model, "m"), and an empty JSON object to anything else (/health)."""
        if self.path == "/metrics":
            body = b"# HELP vllm:num_requests_running Requests running.\nvllm:num_requests_running 0.0\n"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        elif self.path == "/v1/models":
            self.send_json(200, {"data": [{"id": "m"}]})
        else:
            self.send_json(200, {})


class StubServer:
    """Serves `handler` (a JsonHandler subclass) at `self.url` until `close()`."""

    def __init__(self, handler: type[JsonHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)  # the kernel picks a free port as it binds
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        # A short poll: shutdown() waits for it, once per test.
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
