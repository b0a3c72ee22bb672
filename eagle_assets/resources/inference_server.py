"""The `InferenceServerResource`: connect to a server, or launch vLLM and own it.

Two real implementations behind one resource, chosen by configuration: with `url` set, the
stages talk to an existing OpenAI-compatible server (the API key comes from the environment
variable named by `api_key_env`, never from config, never logged); without it, vLLM is launched
from the target preset in its own environment and torn down when the stage ends.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

import dagster as dg
from pydantic import PrivateAttr

from eagle_assets.engines.envs import host_device
from eagle_assets.engines.serving import InferenceServer, api_key_from_env, connect, launch_vllm
from eagle_assets.engines.vllm_launch import speculative_config
from eagle_assets.targets import EMBEDDED_TARGET

# The drafter's check serves plain and speculative, then the benchmark serves both again: two
# warm servers save a vLLM start-up (~50 s on 2 cores) in every run of the graph.
WARM_SERVERS_ON_CPU = 2


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
    """Keep launched servers for the next asset of the same run that asks for the same
    configuration: on a CPU host the last two (the drafter's check and the benchmark both want
    the plain and the speculative server), on a GPU the last one (each vLLM takes most of its
    memory). A server only ever serves one stage at a time; an idle one keeps its memory and
    ~1.5% of a core."""

    _warm: "OrderedDict[str, tuple[InferenceServer, ExitStack]]" = PrivateAttr(default_factory=OrderedDict)

    def teardown_after_execution(self, context) -> None:
        self.stop_warm()

    def stop_warm(self) -> None:
        while self._warm:
            self._stop_oldest()

    def _stop_oldest(self) -> None:
        _, (_, stack) = self._warm.popitem(last=False)
        stack.close()

    def _stop(self, key: str) -> None:
        held = self._warm.pop(key, None)
        if held is not None:
            held[1].close()

    def _warm_capacity(self) -> int:
        return WARM_SERVERS_ON_CPU if (self.device or host_device()) == "cpu" else 1

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
        key = server_key(drafter, k, speculative)
        if self.keep_warm and key in self._warm:
            self._warm.move_to_end(key)
            server, _ = self._warm[key]
            log(f"reusing the running server at {server.base_url}")
            try:
                yield server
            except BaseException:
                self._stop(key)  # a failure inside may have left the server in any state
                raise
            return
        capacity = self._warm_capacity() if self.keep_warm else 0
        while self._warm and len(self._warm) >= max(capacity, 1):
            self._stop_oldest()
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
        self._warm[key] = (server, stack)
        try:
            yield server
        except BaseException:
            self._stop(key)
            raise


def server_key(drafter: str | Path | None, k: int, speculative: dict | None) -> str:
    """One key per served configuration: a drafter folder and K name the same server as the
    speculative config they expand to, so the drafter's check and the benchmark share one."""
    if drafter is not None:
        speculative = speculative_config(Path(drafter).expanduser().resolve(), k)
    return json.dumps(speculative, sort_keys=True)
