"""`connect()`: attaching to an OpenAI-compatible server someone else runs.

The server is a real HTTP server on a free local port in a thread (`http_stub.py`); it serves
a given model list on /v1/models, or a given error status, and records the path and
Authorization header of every request it gets.
"""

from __future__ import annotations

import json
import re

import pytest

from eagle_assets.engines.process import free_port
from eagle_assets.engines.serving import connect
from eagle_assets_tests.http_stub import JsonHandler, StubServer


class ModelsServer(StubServer):
    """Answers GET /v1/models with `models` (or with `status` when it is not 200); 404 elsewhere."""

    def __init__(self, models: list[str], status: int = 200):
        self.requests: list[dict] = []
        outer = self

        class Handler(JsonHandler):
            def do_GET(self):
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization")})
                if self.path != "/v1/models":
                    self.send_json(404, {"error": {"message": f"no route {self.path}"}})
                elif status != 200:
                    self.send_json(status, {"error": {"message": f"scripted {status}"}})
                else:
                    self.send_json(200, {"object": "list", "data": [{"id": m, "object": "model"} for m in models]})

        super().__init__(Handler)


@pytest.fixture
def serve():
    servers = []

    def start(models, status=200):
        servers.append(ModelsServer(models, status))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/", "//"])
def test_base_url_is_normalised_to_the_root_without_v1(serve, suffix):
    server = serve(["m"])
    result = connect(server.url + suffix, timeout_s=2)
    assert result.base_url == server.url  # no trailing "/", no "/v1"
    assert result.metrics_url == f"{server.url}/metrics"
    assert [r["path"] for r in server.requests] == ["/v1/models"]  # not //v1/models nor /v1/v1/models


def test_no_model_given_picks_the_first_served_and_sends_no_key(serve):
    server = serve(["first/model", "second/model"])
    result = connect(server.url, timeout_s=2)
    assert result.model == "first/model"
    assert result.api_key is None and result.headers == {}
    assert server.requests == [{"path": "/v1/models", "auth": None}]  # no Authorization header without a key


def test_a_named_served_model_is_used(serve):
    server = serve(["first/model", "second/model"])
    assert connect(server.url, model="second/model", timeout_s=2).model == "second/model"


def test_an_unknown_model_is_refused_listing_the_served_ones(serve):
    server = serve(["first/model", "second/model"])
    expected = f"server at {server.url} serves ['first/model', 'second/model'], not 'other/model'"
    with pytest.raises(ValueError, match=f"^{re.escape(expected)}$"):
        connect(server.url + "/v1/", model="other/model", timeout_s=2)


def test_the_key_is_sent_as_a_bearer_token_and_kept_out_of_repr(serve):
    server = serve(["m"])
    secret = "sk-do-not-print-me"
    result = connect(server.url, api_key=secret, timeout_s=2)
    assert server.requests == [{"path": "/v1/models", "auth": f"Bearer {secret}"}]
    assert result.api_key == secret and result.headers == {"Authorization": f"Bearer {secret}"}
    assert secret not in repr(result) and secret not in json.dumps(result.describe())


def test_http_401_is_a_connection_error_pointing_at_the_api_key(serve):
    server = serve(["m"], status=401)
    secret = "sk-wrong-key"
    expected = f"server at {server.url} answered 401 on /v1/models: check the URL and the API key variable"
    with pytest.raises(ConnectionError, match=f"^{re.escape(expected)}$") as err:
        connect(server.url + "/v1", api_key=secret, timeout_s=2)
    assert server.requests == [{"path": "/v1/models", "auth": f"Bearer {secret}"}]  # the key did reach the server
    assert secret not in str(err.value)
    assert err.value.__cause__ is None and err.value.__suppress_context__  # `from None`: no httpx traceback


def test_nothing_listening_is_a_connection_error_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    pattern = (
        rf"^no OpenAI-compatible server answers at {re.escape(url)} "
        r"\(\[Errno \d+\] Connection refused\): start one or fix the URL$"
    )
    with pytest.raises(ConnectionError, match=pattern):
        connect(url + "/v1/", timeout_s=2)


def test_a_server_serving_no_model_yet_is_a_connection_error(serve):
    server = serve([])
    with pytest.raises(ConnectionError, match=r"serves no model yet: wait for it to finish loading, or fix the URL"):
        connect(server.url, timeout_s=2)


def test_a_url_without_a_scheme_is_a_connection_error_naming_it():
    with pytest.raises(
        ConnectionError, match=r"^no OpenAI-compatible server answers at localhost:8000 \(Request URL is missing an 'http://' or 'https://' protocol"
    ):
        connect("localhost:8000", timeout_s=2)
