"""A graph fed by servers of the user's: the drafter comes from a second server of theirs, or the
pipeline says what to do; it never tries to load a drafter into a server it does not own."""

from __future__ import annotations

import pytest

from eagle_assets.resources.inference_server import NEEDS_DRAFTER_SERVER, InferenceServerResource

pytestmark = pytest.mark.engine


def test_a_drafter_comes_from_the_speculative_url_or_the_message_says_how(vllm_server, tmp_path):
    connected = InferenceServerResource(url=vllm_server.base_url)
    with connected.serve() as server:  # the target alone: the user's server
        assert server.base_url == vllm_server.base_url
    with pytest.raises(ValueError) as refused:
        with connected.serve(drafter=tmp_path / "drafter-vllm", k=3):
            pass
    assert str(refused.value) == NEEDS_DRAFTER_SERVER
    assert "EAGLE_ASSETS_SPECULATIVE_URL" in NEEDS_DRAFTER_SERVER and "eagle-assets serve --drafter" in NEEDS_DRAFTER_SERVER
    # With a server of the drafter given, speculation is served from there (here the same real
    # server stands for it: the resource only has to route the request to the right URL).
    both = InferenceServerResource(url="http://127.0.0.1:9", speculative_url=vllm_server.base_url)
    with both.serve(speculative={"method": "eagle3", "model": str(tmp_path), "num_speculative_tokens": 3}) as server:
        assert server.base_url == vllm_server.base_url and server.model == vllm_server.model
