"""The `InferenceServerResource`: connect to a server, or launch vLLM and own it.

Two real implementations behind one resource, chosen by configuration: with `url` set, the
stages talk to an existing OpenAI-compatible server (the API key comes from the environment
variable named by `api_key_env`, never from config, never logged); without it, vLLM is launched
from the target preset in its own environment and torn down when the stage ends.

A launched server is never handed out dead: before a warm one is reused its process must live
and its /health answer, else it is stopped (its shared memory removed) and started again, once;
a server of a configuration that dies again is a `ServerFailed` naming its log. A server that
dies while a stage uses it is reported as such, with the last lines of its log, not as the
refused connection the stage saw.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import OrderedDict
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, NamedTuple, Optional, Sequence

import dagster as dg
from pydantic import PrivateAttr

from eagle_assets.engines.envs import host_device
from eagle_assets.engines.host_memory import HEADROOM_BYTES, available_memory_bytes, config_footprint_bytes, why_not_at_once
from eagle_assets.engines.process import ServerFailed
from eagle_assets.engines.serving import InferenceServer, api_key_from_env, connect, launch_vllm, replica_numbers
from eagle_assets.engines.vllm_launch import (
    DEFAULT_KV_CACHE_GIB,
    extraction_config,
    hidden_states_transfer,
    served_dtype,
    serving_mode_note,
    speculative_config,
)
from eagle_assets.paths import runs_dir
from eagle_assets.targets import EMBEDDED_TARGET
from eagle_assets.targets.embedded import resolve_target

# The drafter's check serves plain and speculative, then the benchmark serves both again: two
# warm servers save a vLLM start-up in every run of the graph (docs/serving.md, "Warm servers and memory").
WARM_SERVERS_ON_CPU = 2


class WarmServer(NamedTuple):
    """A launched server the resource holds: what it serves, and the stack that stops it."""

    server: InferenceServer
    stack: ExitStack
    speculative: dict | None


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
    speculative_url: Optional[str] = None
    """With `url`: an existing server of the same target serving the drafter (started with the
    exported `drafter-vllm/`, e.g. `eagle-assets serve --drafter DIR`), for the drafter's checks
    and the benchmark; a server of yours cannot load the drafter the pipeline trains."""
    extraction_url: Optional[str] = None
    """An existing extraction server (vLLM with the `extract_hidden_states` method and our
    hidden-state connector, `eagle-assets serve --extract`) that writes into a folder this host
    reads at the same path; nothing is launched for the hidden states when set."""
    port: int = 0
    """Port for a launched server; 0 picks a free one."""
    device: Optional[str] = None
    """cpu or cuda; default: this host's."""
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB
    max_num_seqs: Optional[int] = None
    compiled: bool = False
    """CPU only: serve compiled (torch.compile), as a deployment does, instead of eagerly (the
    default: a server starts several times sooner); see VllmLaunch.compiled."""
    startup_timeout_s: Optional[float] = None
    """Seconds to wait for a launched server to answer; default: 10 minutes plus the weights'
    read time at a slow rate (`engines/vllm_launch.startup_timeout_for`)."""
    keep_warm: bool = True
    """Keep launched servers for the next asset of the same run that asks for the same
    configuration: on a CPU host the last two (the drafter's check and the benchmark both want
    the plain and the speculative server), on a GPU the last one (each vLLM takes most of its
    memory). A server only ever serves one stage at a time; an idle one keeps its memory and
    a sliver of a core. A benchmark interleaving its configurations holds all of their servers at
    once; none is stopped while a block still uses it, and the warm ones are trimmed back to
    the limit after."""

    _warm: "OrderedDict[str, WarmServer]" = PrivateAttr(default_factory=OrderedDict)
    _in_use: "dict[str, int]" = PrivateAttr(default_factory=dict)
    _deaths: "dict[str, str]" = PrivateAttr(default_factory=dict)
    """Configurations whose launched server died in this run: how, and its log."""

    @property
    def connected(self) -> bool:
        """Whether the target is served by servers of the user's (`url`, `speculative_url`): no
        target server is launched then, and a configuration with no server given is not served."""
        return bool(self.url or self.speculative_url)

    def teardown_after_execution(self, context) -> None:
        self.stop_warm()

    def stop_warm(self, keep_extraction: Sequence[int] | None = None) -> None:
        """Stop every warm server; with `keep_extraction`, all but the extraction server of those
        layer ids (the next step streams from it: stopping it would load the target again)."""
        keep = server_key(None, 0, extraction_config(keep_extraction)) if keep_extraction is not None else None
        for key in [key for key in self._warm if key != keep]:
            self._stop(key)

    def _stop_oldest(self) -> None:
        self._warm.popitem(last=False)[1].stack.close()

    def _oldest_idle(self) -> str | None:
        """The key of the oldest warm server no block is using; None when every one is in use."""
        return next((key for key in self._warm if not self._in_use.get(key)), None)

    def _stop_oldest_idle(self) -> bool:
        """Stop the oldest warm server no block is using; False when every one is in use."""
        idle = self._oldest_idle()
        if idle is None:
            return False
        self._stop(idle)
        return True

    @contextmanager
    def _using(self, key: str) -> Iterator[None]:
        self._in_use[key] = self._in_use.get(key, 0) + 1
        try:
            yield
        finally:
            self._in_use[key] -= 1
            if not self._in_use[key]:
                del self._in_use[key]

    def _stop(self, key: str) -> None:
        held = self._warm.pop(key, None)
        if held is not None:
            held.stack.close()

    def _make_room(self, needed_bytes: int, log: Callable[[str], None]) -> None:
        """Stop idle warm servers, oldest first, until a new one of `needed_bytes` fits in the
        memory this host has available: a warm server saves a start-up, never worth the kernel's
        out-of-memory killer taking a server or the run itself. Refuses the start when servers
        in use leave too little."""
        while True:
            available = available_memory_bytes()
            if available is None or available >= needed_bytes + HEADROOM_BYTES:
                return
            idle = self._oldest_idle()
            if idle is None:
                break
            log(
                f"stopping the warm server at {self._warm[idle].server.base_url} to make room: {available / 2**30:.1f} GiB available, "
                f"the next server needs ~{needed_bytes / 2**30:.1f} GiB and {HEADROOM_BYTES / 2**30:.0f} GiB stay free"
            )
            self._stop(idle)
        if self._in_use:
            raise MemoryError(
                f"{len(self._in_use)} servers in use leave {available / 2**30:.1f} GiB available; one more needs "
                f"~{(needed_bytes + HEADROOM_BYTES) / 2**30:.1f} GiB with headroom. Serve the configurations one after "
                "another (the benchmark's interleave_rounds: 0), serve fewer (also_k, ngram) or lower kv_cache_gib."
            )

    def served_dtype(self) -> str:
        """The dtype a launched server computes in (`vllm_launch.served_dtype`: fp32 on most CPU
        hosts, else bf16); a server of yours is taken to serve bf16."""
        if self.connected:
            return "bfloat16"
        return served_dtype(resolve_target(self.target, log=lambda m: None)[1], self.device or host_device())

    def serving_note(self) -> str | None:
        """How a launched server runs the models, for a report (None for a server of yours)."""
        return None if self.connected else serving_mode_note(self.device or host_device(), self.compiled)

    def why_not_at_once(self, specs: "list[dict | None]") -> str | None:
        """Why the servers of these speculative configs (None: no speculation) cannot all be up
        together here, or None when they can. A warm server of one of them is counted as up
        already; the idle warm others as memory that stopping them would give back."""
        if self.connected:
            return "the resource points at existing servers of the user's, one per configuration"
        device = self.device or host_device()
        if device != "cpu":
            return why_not_at_once([], None, device)
        wanted = dict(zip(replica_keys(specs), specs))
        folder = resolve_target(self.target, log=lambda m: None)[1]
        starts = [config_footprint_bytes(folder, spec, self.kv_cache_gib) for key, spec in wanted.items() if key not in self._warm]
        available = available_memory_bytes()
        if available is not None:
            idle = [key for key in self._warm if key not in wanted and not self._in_use.get(key)]
            available += sum(config_footprint_bytes(folder, self._warm[key].speculative, self.kv_cache_gib) for key in idle)
        return why_not_at_once(starts, available, device)

    def _warm_capacity(self) -> int:
        return WARM_SERVERS_ON_CPU if (self.device or host_device()) == "cpu" else 1

    @contextmanager
    def serve(
        self,
        drafter: str | Path | None = None,
        k: int = 3,
        speculative: dict | None = None,
        log: Callable[[str], None] = print,
        replica: int = 0,
        kv_transfer: dict | None = None,
        max_model_len: int | None = None,
        launch: bool = False,
    ) -> Iterator[InferenceServer]:
        """A server for the duration of the block: the configured URL, or a vLLM we launch.
        `replica` n > 0 is a further server of the same configuration (an A/A control), not the first again.
        `kv_transfer` and `max_model_len` go to the launch as they are (`extraction_server` uses them,
        with `launch`: a vLLM is launched even where servers of the user's are given)."""
        if self.connected and not launch:
            if drafter or speculative:
                if not self.speculative_url:
                    raise ValueError(NEEDS_DRAFTER_SERVER)
                yield connect(self.speculative_url, self.model, api_key_from_env(self.api_key_env))
                return
            if not self.url:
                raise ValueError(NEEDS_TARGET_SERVER)
            yield connect(self.url, self.model, api_key_from_env(self.api_key_env))
            return
        served = served_config(drafter, k, speculative)
        key = server_key(None, k, served, replica)
        if self.keep_warm and key in self._warm and self._usable(key, log):
            self._warm.move_to_end(key)
            server = self._warm[key].server
            log(f"reusing the running server at {server.base_url}")
            with self._serving(key, server, lambda: self._stop(key)):
                yield server
            self._trim()
            return
        if self._in_use and (self.device or host_device()) != "cpu":
            raise RuntimeError(
                "a second vLLM cannot start beside one in use on this accelerator: each takes most of its memory. "
                "Serve the benchmark's configurations one after another (interleave_rounds: 0)."
            )
        capacity = self._warm_capacity() if self.keep_warm else 0
        while len(self._warm) >= max(capacity, 1) and self._stop_oldest_idle():
            pass
        # Resolved (and, for the embedded target, checksummed) once: the launch is given the folder.
        folder = resolve_target(self.target, log=log)[1]
        if self._warm and (self.device or host_device()) == "cpu":
            self._make_room(config_footprint_bytes(folder, served, self.kv_cache_gib), log)
        stack = ExitStack()
        try:
            server = stack.enter_context(
                launch_vllm(
                    folder,
                    drafter=drafter,
                    k=k,
                    speculative=speculative,
                    kv_transfer=kv_transfer,
                    max_model_len=max_model_len,
                    port=self.port or None,
                    device=self.device,
                    kv_cache_gib=self.kv_cache_gib,
                    max_num_seqs=self.max_num_seqs,
                    compiled=self.compiled,
                    startup_timeout_s=self.startup_timeout_s,
                    log=log,
                )
            )
        except BaseException as exc:
            stack.close()
            if key in self._deaths and isinstance(exc, ServerFailed):  # the one restart failed
                raise ServerFailed(f"the server died ({self._deaths[key]}), and starting it again failed too: {exc}", exc.log_path, exc.tail) from exc
            raise
        if not self.keep_warm:
            with self._serving(key, server, stack.close):
                yield server
            stack.close()
            return
        self._warm[key] = WarmServer(server, stack, served)
        with self._serving(key, server, lambda: self._stop(key)):
            yield server
        self._trim()

    def _usable(self, key: str, log: Callable[[str], None]) -> bool:
        """Whether the warm server of `key` still lives and answers /health: a dead one is never
        handed out. It is stopped (its record and shared memory removed) and left to be started
        again, once: a server of a configuration that died before already is a failure that
        names its log."""
        server = self._warm[key].server
        if self._in_use.get(key):
            return True  # a block uses it now: that block's failure, if any, is the one to report
        problem = server.problem()
        if problem is None:
            return True
        failure = server.failure(problem)
        self._stop(key)
        if key in self._deaths:
            raise ServerFailed(
                f"{failure}\n(it had been started again once already after it died: {self._deaths[key]})", failure.log_path, failure.tail
            ) from None
        self._deaths[key] = f"{problem}; log {server.log_path}"
        log(f"not reusing the warm server at {server.base_url}: {problem} (log {server.log_path}); starting it again")
        return False

    @contextmanager
    def _serving(self, key: str, server: InferenceServer, stop: Callable[[], None]) -> Iterator[None]:
        """A block using the launched server of `key`. A failure inside it may leave the server in
        any state, so it is stopped (`stop`); where it died, the failure says so, with the last
        lines of its log, instead of a refused connection."""
        try:
            with self._using(key):
                yield
        except Exception as exc:
            problem = server.problem(timeout_s=5)
            failure = server.failure(f"{problem} while serving") if problem else None
            stop()
            if failure is None:
                raise
            self._deaths[key] = f"{problem}; log {server.log_path}"
            if isinstance(exc, ServerFailed):  # said already, by whoever used the server
                raise
            raise ServerFailed(f"{failure}\nwhat failed with it: {exc}", failure.log_path, failure.tail) from exc
        except BaseException:
            stop()
            raise

    @contextmanager
    def extraction_server(self, layer_ids: Sequence[int], max_model_len: int, log: Callable[[str], None] = print) -> Iterator[InferenceServer]:
        """A server that captures the residual stream after each of `layer_ids` decoder layers for
        every prompt token (`hidden_states/engine_extract.py` reads it): `extraction_url`, or a
        vLLM we launch with a spool folder of its own under the runs folder, kept warm like any
        other launched server. `max_model_len` must take the longest sample plus one token."""
        if self.extraction_url:
            yield connect(self.extraction_url, self.model, api_key_from_env(self.api_key_env))
            return
        # A server of the user's for serving (`url`) is no extraction server: one is launched here
        # all the same (where one host holds one target server, the user stops theirs first).
        spec = extraction_config(layer_ids)
        key = server_key(None, 0, spec)
        if key in self._warm and self._usable(key, log):
            with self.serve(speculative=spec, log=log, launch=True) as server:
                yield server
            return
        spool_root = runs_dir() / "hidden-states"
        spool_root.mkdir(parents=True, exist_ok=True)
        spool = Path(tempfile.mkdtemp(prefix="spool-", dir=spool_root))
        owned_by_server = False
        try:
            with self.serve(speculative=spec, kv_transfer=hidden_states_transfer(spool), max_model_len=max_model_len, log=log, launch=True) as server:
                if key in self._warm:  # kept warm: the folder goes with the server, whenever the resource stops it
                    self._warm[key].stack.callback(shutil.rmtree, spool, True)
                    owned_by_server = True
                yield server
        finally:
            if not owned_by_server:
                shutil.rmtree(spool, ignore_errors=True)

    def _trim(self) -> None:
        """Back to the warm limit, oldest first, once a block holding several servers at once
        has let go of all of them (trimmed earlier, the first it lets go of would go, newest or not)."""
        while not self._in_use and len(self._warm) > self._warm_capacity():
            self._stop_oldest()


NEEDS_DRAFTER_SERVER = (
    "the pipeline is connected to an existing server (EAGLE_ASSETS_SERVER_URL), which cannot load the drafter it trained. "
    "Serve the target with the drafter's export yourself (`eagle-assets serve --drafter data/<target>/drafter/drafter-vllm -k 3`, "
    "or your engine's --speculative-config on that folder) and give its URL in EAGLE_ASSETS_SPECULATIVE_URL, then run the "
    "drafter's checks and the benchmark again (they do not retrain); or leave EAGLE_ASSETS_SERVER_URL empty so the pipeline "
    "launches vLLM itself."
)


NEEDS_TARGET_SERVER = (
    "the pipeline is connected to your servers and names none of the target alone (EAGLE_ASSETS_SERVER_URL is unset, "
    "EAGLE_ASSETS_SPECULATIVE_URL set): give the target's server in EAGLE_ASSETS_SERVER_URL, or unset both so that the "
    "pipeline launches vLLM itself."
)


def served_config(drafter: str | Path | None, k: int, speculative: dict | None) -> dict | None:
    """What a server serves, as one speculative config: a drafter folder and K name the same
    server as the config they expand to, so the drafter's check and the benchmark share one."""
    return speculative if drafter is None else speculative_config(Path(drafter).expanduser().resolve(), k)


def server_key(drafter: str | Path | None, k: int, speculative: dict | None, replica: int = 0) -> str:
    """One key per served configuration (`served_config`); a `replica` n > 0 names the n-th
    further server of it."""
    return json.dumps(served_config(drafter, k, speculative), sort_keys=True) + (f"#{replica}" if replica else "")


def replica_keys(specs: "list[dict | None]") -> list[str]:
    """The server key of each speculative config, a config given again naming a further server."""
    return [server_key(None, 0, spec, n) for spec, n in zip(specs, replica_numbers(specs))]
