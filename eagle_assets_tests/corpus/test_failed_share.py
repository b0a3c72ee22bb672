"""A corpus run whose samples fail beyond the share allowed fails, saying how many and why.

The server is a real HTTP server on a local port in a thread (`http_stub.py`) that refuses the
prompts it is told to (HTTP 400) or answers every chat with 503 while it still lists its model:
what a real server does with a bad prompt or an overloaded engine, on demand. A real vLLM that
dies mid-run is in test_generate_served.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from eagle_assets.corpus.client import ClientSettings
from eagle_assets.corpus.generate import GenerationAborted, GenerationFailed, generate_corpus
from eagle_assets.corpus.prompt_record import Prompt
from eagle_assets.corpus.prompts import write_prompts
from eagle_assets.corpus.store import CorpusStore
from eagle_assets_tests.http_stub import JsonHandler, StubServer

ROOT = Path(__file__).resolve().parents[2]
OK = {
    "choices": [{"message": {"role": "assistant", "content": "Paris."}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 3},
}


class Server(StubServer):
    """Lists model "m"; answers a chat whose last user turn contains "refuse" with HTTP 400,
    every chat with 503 when `overloaded`, and any other with `OK`."""

    def __init__(self, overloaded: bool = False):
        outer = self
        self.chats = 0

        class Handler(JsonHandler):
            def do_GET(self):
                self.send_json(200, {"data": [{"id": "m"}]})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.chats += 1
                if overloaded:
                    self.send_json(503, {"error": {"message": "the engine is overloaded"}})
                elif "refuse" in body["messages"][-1]["content"]:
                    self.send_json(400, {"error": {"message": "This model's maximum context length is 2048 tokens"}})
                else:
                    self.send_json(200, OK)

        super().__init__(Handler)


@pytest.fixture
def server():
    stub = Server()
    yield stub
    stub.close()


def prompts(n: int, refused: int) -> list[Prompt]:
    return [Prompt.make([f"question {i}" + (" refuse" if i < refused else "")]) for i in range(n)]


def test_a_failed_share_above_the_limit_fails_the_run_and_keeps_the_rest(server, tokenizer, target, tmp_path):
    settings = ClientSettings(server.url, "m", concurrency=4, max_retries=1, backoff_s=0.01)
    with CorpusStore(str(tmp_path / "a"), shard_size=4) as store, pytest.raises(GenerationFailed) as failed:
        generate_corpus(prompts(20, refused=2), store, settings, tokenizer, target=target, show_progress_bar=False)
    message = str(failed.value)
    assert message.startswith(
        f"2 of 20 samples failed (10%, above the 5% allowed); commonest errors: RequestRejected x2 (e.g. {server.url}/v1/chat/completions rejected the request with HTTP 400: "
    )
    assert "maximum context length" in message
    assert "18 samples are stored and the failed ones are listed in" in message and "max_failed_share" in message
    stats = failed.value.stats
    assert (stats.succeeded, stats.failed) == (18, 2)
    stored = CorpusStore(str(tmp_path / "a"), mode="r")
    assert stored.num_rows == 18 and len(stored.failures()) == 2

    # The same share within a limit that allows it: the run passes, the failures still recorded.
    with CorpusStore(str(tmp_path / "b"), shard_size=4) as store:
        stats = generate_corpus(prompts(20, refused=2), store, settings, tokenizer, target=target, show_progress_bar=False, max_failed_share=0.1)
    assert (stats.succeeded, stats.failed) == (18, 2)


def test_an_engine_failing_every_request_while_its_server_answers_stops_after_a_streak(tokenizer, target, tmp_path):
    stub = Server(overloaded=True)
    try:
        settings = ClientSettings(stub.url, "m", concurrency=1, max_retries=1, backoff_s=0.01)
        with CorpusStore(str(tmp_path), shard_size=4) as store, pytest.raises(GenerationAborted) as aborted:
            generate_corpus(prompts(30, refused=0), store, settings, tokenizer, target=target, show_progress_bar=False, max_consecutive_failures=4)
    finally:
        stub.close()
    assert f"4 samples in a row failed after retries against {stub.url}" in str(aborted.value)
    assert "HTTP 503" in str(aborted.value) and aborted.value.stats.failed == 4
    assert stub.chats == 8  # 4 samples x 2 attempts, then it stopped


def test_the_generator_command_exits_1_naming_the_failed_share(server, smollm2_path, tmp_path):
    # The review's case: most samples failed, and the command still said success.
    write_prompts(prompts(12, refused=8), str(tmp_path / "prompts.jsonl"))
    cmd = [
        sys.executable,
        "-m",
        "eagle_assets.cli",
        "corpus",
        "generate",
        "--prompts",
        str(tmp_path / "prompts.jsonl"),
        "--out",
        str(tmp_path / "corpus"),
        "--server",
        server.url,
        "--model",
        "m",
        "--tokenizer",
        str(smollm2_path),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "corpus generation failed: 8 of 12 samples failed (67%, above the 5% allowed)" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["failed"] == 8  # the run's figures, as a successful run prints them
