"""A real OpenAI-compatible HTTP server that answers its first requests, then takes the rest and stalls.

It listens on a free local port in a thread (`http_stub.StubServer`). `/v1/models`, `/health`
and `/metrics` always answer, as a server whose engine hangs still does. The first `answer`
POSTs get a well-formed answer: a chat completion (JSON, or an SSE stream of exactly
`max_tokens` tokens when `stream` is set, with `prompt_token_ids` and `token_ids` when
`return_token_ids` is), or, for a completion whose prompt is token ids, the states an
extraction server writes (`spool`: a safetensors file of `hidden_states` (T, n_ids, H) and
`token_ids`, its path in `kv_transfer_params`). Every later POST is read and then held open
with nothing written until the server closes: a stall, which a real engine gives only at random.
`stalled_at` is when the first stall began (monotonic), for the bound a client must keep.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

from eagle_assets_tests.http_stub import JsonHandler, StubServer


class StallingServer(StubServer):
    """See the module docstring; `answer=None` answers everything (a healthy server)."""

    def __init__(self, answer: int | None = 0, spool: Path | None = None, n_ids: int = 3, hidden: int = 8):
        self.answer, self.spool, self.n_ids, self.hidden = answer, spool, n_ids, hidden
        self.posts = 0
        self.answered = 0
        self.stalled_at: float | None = None
        self.closing = threading.Event()
        lock = threading.Lock()
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                self.answer_get()

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    outer.posts += 1
                    stall = outer.answer is not None and outer.posts > outer.answer
                    if stall and outer.stalled_at is None:
                        outer.stalled_at = time.monotonic()
                if stall:
                    outer.closing.wait(120)  # the request is taken; nothing is ever written
                    return
                try:
                    if self.path.endswith("/completions") and not self.path.endswith("/chat/completions"):
                        self.completion(body)
                    elif body.get("stream"):
                        self.stream(body)
                    else:
                        self.chat(body)
                except (BrokenPipeError, ConnectionResetError):
                    return
                with lock:
                    outer.answered += 1

            def chat(self, body):
                n = int(body.get("max_tokens") or 4)
                answer = {"role": "assistant", "content": " ".join(["word"] * min(n, 4))}
                payload = {
                    "choices": [{"message": answer, "finish_reason": "stop", "token_ids": list(range(100, 100 + n))}],
                    "usage": {"prompt_tokens": 5, "completion_tokens": min(n, 4)},
                    "prompt_token_ids": [1, 2, 3],
                }
                self.send_json(200, payload)

            def stream(self, body):
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i in range(1, int(body["max_tokens"]) + 1):
                    chunk = {"choices": [{"index": 0, "delta": {"content": "x"}}], "usage": {"completion_tokens": i}}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
                self.close_connection = True

            def completion(self, body):
                ids = body["prompt"]
                if not isinstance(ids, list) or outer.spool is None:
                    return self.send_json(200, {"choices": [{"text": "x", "finish_reason": "length"}], "usage": {}})
                import torch
                from safetensors.torch import save_file

                path = outer.spool / f"{uuid.uuid4().hex}.safetensors"
                token_ids = torch.tensor(ids, dtype=torch.int64)
                # Each token's states are its id spread over the width: distinct, finite, checkable.
                states = token_ids.float()[:, None, None] / 1000 + torch.arange(outer.n_ids * outer.hidden).view(1, outer.n_ids, outer.hidden)
                save_file({"hidden_states": states.contiguous(), "token_ids": token_ids}, str(path))
                self.send_json(200, {"choices": [{"text": "x"}], "kv_transfer_params": {"hidden_states_path": str(path)}})

        super().__init__(Handler)

    def close(self) -> None:
        self.closing.set()
        super().close()
