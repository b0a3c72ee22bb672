"""One served run on this CPU host: a fresh vLLM server of the embedded target, the sweep, torn down."""

from __future__ import annotations

from eagle_assets.bench.served import ServedRun, SweepSettings, run_served
from eagle_assets.engines.serving import launch_vllm
from eagle_assets.targets import EMBEDDED_TARGET


def served_on_cpu(label: str, spec: dict | None, prompts, sweep: SweepSettings, compiled: bool = False) -> ServedRun:
    """`spec` is the speculative config (None: no speculation); the server's log stays in its file."""
    with launch_vllm(EMBEDDED_TARGET, speculative=spec, device="cpu", compiled=compiled, log=lambda m: None) as server:
        return run_served(label, server.base_url, server.model, prompts, sweep, api_key=server.api_key, config={"speculative": spec})
