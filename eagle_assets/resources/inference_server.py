"""The `InferenceServerResource`: connect to a server, or launch vLLM and own it.

Two real implementations behind one resource, chosen by configuration: with `url` set, the
stages talk to an existing OpenAI-compatible server (the API key comes from the environment
variable named by `api_key_env`, never from config, never logged); without it, vLLM is launched
from the target preset in its own environment and torn down when the stage ends.
"""

from __future__ import annotations

import json
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import dagster as dg
from pydantic import PrivateAttr

from eagle_assets.engines.serving import InferenceServer, api_key_from_env, connect, launch_vllm
from eagle_assets.targets import EMBEDDED_TARGET


class InferenceServerResource(dg.ConfigurableResource):
    """Where the target is served. Leave `url` empty to launch vLLM for `target` here."""

    target: str = EMBEDDED_TARGET
    """Target preset name or model folder."""
    url: Optional[str] = None
    """An existing OpenAI-compatible server (vLLM or SGLang); nothing is launched when set."""
    api_key_env: Optional[str] = None
    """Name of the environment variable holding the server's API key."""
    model: Optional[str] = None
    """Model name on an existing server (default: the first it lists)."""
    port: int = 0
    """Port for a launched server; 0 picks a free one."""
    device: Optional[str] = None
    """cpu or cuda; default: this host's."""
    kv_cache_gib: int = 1
    max_num_seqs: Optional[int] = None
    startup_timeout_s: float = 600
    keep_warm: bool = True
    """Keep the last launched server for the next asset of the same run that asks for the same
    configuration (one server at a time: a different configuration stops it first)."""

    _warm_key: Optional[str] = PrivateAttr(default=None)
    _warm_server: Optional[InferenceServer] = PrivateAttr(default=None)
    _warm_stack: Optional[ExitStack] = PrivateAttr(default=None)

    def teardown_after_execution(self, context) -> None:
        self.stop_warm()

    def stop_warm(self) -> None:
        if self._warm_stack is not None:
            self._warm_stack.close()
        self._warm_stack = self._warm_server = self._warm_key = None

    @contextmanager
    def serve(
        self,
        drafter: str | Path | None = None,
        k: int = 3,
        speculative: dict | None = None,
        log: Callable[[str], None] = print,
    ) -> Iterator[InferenceServer]:
        """A server for the duration of the block: the configured URL, or a vLLM we launch."""
        if self.url:
            if drafter or speculative:
                raise ValueError(
                    "this resource points at an existing server (url is set): it cannot load a drafter. "
                    "Leave url empty to let the pipeline launch vLLM with the drafter."
                )
            yield connect(self.url, self.model, api_key_from_env(self.api_key_env))
            return
        key = json.dumps([str(drafter) if drafter else None, k if drafter else None, speculative], sort_keys=True)
        if self.keep_warm and key == self._warm_key and self._warm_server is not None:
            log(f"reusing the running server at {self._warm_server.base_url}")
            yield self._warm_server
            return
        self.stop_warm()  # one server at a time: two would share the CPU and the measurements
        stack = ExitStack()
        try:
            server = stack.enter_context(
                launch_vllm(
                    self.target,
                    drafter=drafter,
                    k=k,
                    speculative=speculative,
                    port=self.port or None,
                    device=self.device,
                    kv_cache_gib=self.kv_cache_gib,
                    max_num_seqs=self.max_num_seqs,
                    startup_timeout_s=self.startup_timeout_s,
                    log=log,
                )
            )
        except BaseException:
            stack.close()
            raise
        if not self.keep_warm:
            with stack:
                yield server
            return
        self._warm_key, self._warm_server, self._warm_stack = key, server, stack
        try:
            yield server
        except BaseException:
            self.stop_warm()  # a failure inside may have left the server in any state
            raise
