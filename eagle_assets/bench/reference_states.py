"""The target's side of the offline reference, captured once by an extraction server.

The offline reference replayed over the engine's states (`replay_reference.py`) needs, for
each benchmark prompt, the target's greedy answer and the states the engine computes along
prompt + answer. An extraction server gives both: it writes greedy text as a plain server does
(its one drafted token is verified like any draft, so the tokens are the target's), and it
captures the states of any sequence sent as a prompt. So the extraction server that the
hidden-state stage starts anyway captures them too, and the benchmark needs no extraction
server of its own: where one host holds one target server at a time (Kimi-K2.5 on 8 GPUs), the
benchmark then serves the target alone and with the drafter, one after the other, and nothing
else (docs/kimi-k2.5.md).

    ref = capture(server, prompts, new_tokens=67, layer_ids=(2, 4, 5, 8), out=folder, log=print)
    ref = load(folder)                     # None when nothing was captured there
    ref.mismatch(prompts, 67, (2, 4, 5))   # None when it serves a benchmark of these
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import torch
from safetensors.torch import load_file, save_file

from eagle_assets.durable import replace_durably
from eagle_assets.hidden_states.engine_extract import EngineStateClient, EngineStateError, take_spooled

STATES_FILE = "reference.safetensors"
MANIFEST_FILE = "reference.json"


@dataclass(frozen=True)
class BenchmarkReference:
    """Per prompt: its messages, its ids as the server templated them, the target's greedy
    tokens after it, and the engine's states along both (T, n_ids, H) at `layer_ids`."""

    prompts: list[list[dict]]
    prompt_ids: list[list[int]]
    streams: list[list[int]]
    layer_ids: tuple[int, ...]
    states: list[torch.Tensor]

    def mismatch(self, prompts: Sequence[Sequence[Mapping]], tokens: int, aux_ids: Sequence[int]) -> str | None:
        """Why this capture cannot serve a benchmark of `prompts` needing `tokens` greedy tokens
        each at the drafter's `aux_ids`; None when it can."""
        wanted = [list(map(dict, p)) for p in prompts]
        if self.prompts[: len(wanted)] != wanted:
            return f"it holds {len(self.prompts)} other prompts (the benchmark's prompts or their number changed)"
        short = min((len(s) for s in self.streams[: len(wanted)]), default=0)
        if short < tokens:
            return f"its greedy answers hold {short} tokens, the benchmark needs {tokens} (output_len and K changed)"
        if not set(aux_ids) <= set(self.layer_ids):
            return f"it holds layers {list(self.layer_ids)}, the drafter reads {list(aux_ids)}"
        return None

    def states_of(self, index: int, aux_ids: Sequence[int], tokens: int) -> torch.Tensor:
        """The drafter's aux states along prompt `index` and its first `tokens` greedy tokens:
        (T, n_aux * H) fp32, in the order of `aux_ids` (the order vLLM concatenates them)."""
        cols = [self.layer_ids.index(k) for k in aux_ids]
        length = len(self.prompt_ids[index]) + tokens
        states = self.states[index][:length, cols]
        return states.reshape(length, -1).float()


def capture(
    base_url: str,
    model: str,
    api_key: str | None,
    prompts: Sequence[Sequence[Mapping]],
    new_tokens: int,
    layer_ids: Sequence[int],
    out: Path,
    log: Callable[[str], None] = print,
    concurrency: int = 8,
) -> BenchmarkReference:
    """Ask an extraction server for each prompt's greedy answer (`new_tokens` tokens, EOS
    ignored, as the served benchmark asks) and then for its states along prompt + answer;
    written to `out` (replaced whole, atomically) and returned."""
    client = EngineStateClient(base_url, model, layer_ids, api_key=api_key, concurrency=concurrency)

    def one(messages: Sequence[Mapping]) -> tuple[list[int], list[int], torch.Tensor]:
        prompt_ids, stream = _greedy(base_url, model, api_key, messages, new_tokens)
        return prompt_ids, stream, client.one(np.asarray(prompt_ids + stream))

    try:
        with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="reference") as pool:
            rows = list(pool.map(one, prompts))
    finally:
        client.close()
    reference = BenchmarkReference(
        prompts=[list(map(dict, p)) for p in prompts],
        prompt_ids=[r[0] for r in rows],
        streams=[r[1] for r in rows],
        layer_ids=tuple(client.layer_ids),
        states=[r[2] for r in rows],
    )
    save(reference, out)
    log(f"benchmark reference: {len(rows)} prompts x {new_tokens} greedy tokens and their states at layers {list(client.layer_ids)} -> {out}")
    return reference


def _greedy(base_url: str, model: str, api_key: str | None, messages: Sequence[Mapping], n: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy tokens) from the extraction server; the states file the server wrote
    for this request's prompt is taken and dropped (the states wanted are those of prompt + answer)."""
    body = {
        "model": model,
        "messages": list(messages),
        "max_tokens": n,
        "min_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    resp = httpx.post(f"{base_url.rstrip('/')}/v1/chat/completions", json=body, headers=headers, timeout=httpx.Timeout(1800.0, connect=30.0))
    if resp.status_code != 200:
        raise EngineStateError(f"the extraction server at {base_url} answered {resp.status_code} to a greedy request: {resp.text[:300]}")
    out = resp.json()
    spooled = (out.get("kv_transfer_params") or {}).get("hidden_states_path")
    if spooled:
        take_spooled(Path(spooled))
    prompt_ids, tokens = out.get("prompt_token_ids"), out["choices"][0].get("token_ids")
    if prompt_ids is None or tokens is None:
        raise EngineStateError(f"the server at {base_url} returned no token ids (`return_token_ids`): it is not a vLLM of 0.11 or later")
    if len(tokens) != n:
        raise EngineStateError(f"the server at {base_url} wrote {len(tokens)} greedy tokens, {n} were asked for")
    return list(prompt_ids), list(tokens)


def save(reference: BenchmarkReference, out: Path) -> None:
    """Write `reference` to the folder `out`, replacing what is there only once it is whole."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = out.with_name(f".{out.name}.tmp-{uuid.uuid4().hex[:8]}")
    staging.mkdir()
    try:
        save_file({f"states.{i}": s.contiguous() for i, s in enumerate(reference.states)}, str(staging / STATES_FILE))
        manifest = {
            "prompts": reference.prompts,
            "prompt_ids": reference.prompt_ids,
            "streams": reference.streams,
            "layer_ids": list(reference.layer_ids),
        }
        (staging / MANIFEST_FILE).write_text(json.dumps(manifest))
        if out.exists():
            shutil.rmtree(out)
        replace_durably(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def load(folder: Path) -> BenchmarkReference | None:
    """The capture in `folder`, or None where there is none (or an unreadable one: captured anew)."""
    folder = Path(folder)
    if not (folder / MANIFEST_FILE).is_file() or not (folder / STATES_FILE).is_file():
        return None
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        tensors = load_file(str(folder / STATES_FILE))
        states = [tensors[f"states.{i}"] for i in range(len(manifest["prompts"]))]
    except (OSError, ValueError, KeyError):
        return None
    return BenchmarkReference(manifest["prompts"], manifest["prompt_ids"], manifest["streams"], tuple(manifest["layer_ids"]), states)
