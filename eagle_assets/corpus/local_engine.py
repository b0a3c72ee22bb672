"""The corpus client's interface served by a transformers model in this process, batched.

For a host with a GPU and no serving engine (a training node, the GPU benchmarks): the
corpus and Magpie code await `chat` and `complete` one request at a time from many workers,
and this client gathers what is waiting into one batched `generate` call, so that a small
target answers hundreds of requests per forward pass. Requests are rendered as vLLM renders
them (the chat template with the generation prompt, no extra special tokens; a raw prompt
tokenised with or without them as `add_special_tokens` says), stop at the end-of-sequence
ids of the generation config or the request's `stop_token_ids`, and come back decoded
without special tokens and without the stop token, with vLLM's finish reasons.

    model, tokenizer = load_generation_model("/models/smollm2", device="cuda")
    async with LocalGenerationClient(model, tokenizer, max_batch=512) as client:
        stats = await generate_corpus_async(prompts, client, store, ChatTemplate(tokenizer), target=...)

Greedy requests are deterministic. Sampled ones (Magpie's user turns) share one torch
generator seeded at start, so their per-request `seed` is not honoured: a rerun reproduces
a run only when the requests arrive in the same batches.

The served engine stays the reference: this client is for hosts where it cannot run.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch

from eagle_assets.corpus.client import Completion, RequestRejected


@dataclass(frozen=True)
class LocalSettings:
    """What the corpus code reads of a client's settings."""

    concurrency: int
    """Requests the workers keep in flight: the largest batch one `generate` call gets."""
    base_url: str = "local://transformers"
    model: str = "local"


@dataclass
class _Request:
    ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop_ids: tuple[int, ...]
    future: asyncio.Future


def load_generation_model(path: str, device: str = "cuda", dtype: torch.dtype = torch.float32):
    """The target for generation. fp32 by default: the CPU engine serves fp32, and on a GPU
    a 135M model's decode is launch-bound, so fp32 costs little and keeps greedy paths close."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if device.startswith("cuda"):
        # TF32 would round the matmuls to 10-bit mantissas: no longer the fp32 function.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tokenizer


class LocalGenerationClient:
    """`InferenceClient`'s `chat`/`complete`/`check_server` over a local model; an async context manager."""

    def __init__(self, model, tokenizer, *, max_batch: int = 256, gather_s: float = 0.05, seed: int = 0):
        self.model = model
        self.tokenizer = tokenizer
        self.settings = LocalSettings(concurrency=max_batch, model=getattr(model, "name_or_path", "local"))
        self.gather_s = gather_s
        self.generator_seed = seed
        eos = model.generation_config.eos_token_id
        self.eos_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos_ids or (0,))[0]
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        self._queue: asyncio.Queue[_Request] | None = None
        self._task: asyncio.Task | None = None
        self.generated_tokens = 0
        self.batches = 0

    async def __aenter__(self) -> "LocalGenerationClient":
        torch.manual_seed(self.generator_seed)
        self._queue = asyncio.Queue()
        self._task = asyncio.create_task(self._serve())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._task = self._queue = None

    async def check_server(self) -> list[str]:
        return [self.settings.model]

    async def chat(self, messages: list[dict], params: dict[str, Any]) -> Completion:
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return await self._submit(list(ids), params)

    async def complete(self, prompt: str, params: dict[str, Any]) -> Completion:
        ids = self.tokenizer(prompt, add_special_tokens=params.get("add_special_tokens", True))["input_ids"]
        return await self._submit(list(ids), params)

    async def _submit(self, ids: list[int], params: dict[str, Any]) -> Completion:
        if self._queue is None:
            raise RuntimeError("use the client inside `async with LocalGenerationClient(...) as client:`")
        max_tokens = int(params.get("max_tokens") or 256)
        if self.max_positions and len(ids) + max_tokens > self.max_positions:
            raise RequestRejected(self.settings.base_url, 400, f"{len(ids)} prompt + {max_tokens} new tokens exceed the model's {self.max_positions} positions")
        stop = tuple(dict.fromkeys([*self.eos_ids, *params.get("stop_token_ids", [])]))
        future = asyncio.get_running_loop().create_future()
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0)) if temperature > 0 else 1.0
        await self._queue.put(_Request(ids, max_tokens, temperature, top_p, stop, future))
        return await future

    async def _serve(self) -> None:
        assert self._queue is not None
        while True:
            first = await self._queue.get()
            await asyncio.sleep(self.gather_s)  # let the other workers' requests arrive
            waiting = [first]
            while not self._queue.empty() and len(waiting) < self.settings.concurrency:
                waiting.append(self._queue.get_nowait())
            groups: dict[tuple, list[_Request]] = defaultdict(list)
            for r in waiting:
                groups[(r.max_tokens, r.temperature, r.top_p, r.stop_ids)].append(r)
            for group in groups.values():
                start = time.perf_counter()
                try:
                    # The forward runs in a thread: the event loop keeps taking new requests.
                    outputs = await asyncio.to_thread(self._generate, group)
                except Exception as exc:  # every request of the batch learns why
                    for r in group:
                        if not r.future.done():
                            r.future.set_exception(exc)
                    continue
                latency = time.perf_counter() - start
                for r, (text, finish, n) in zip(group, outputs):
                    if not r.future.done():
                        r.future.set_result(Completion(text, None, finish, len(r.ids), n, latency, 1))

    @torch.inference_mode()
    def _generate(self, group: list[_Request]) -> list[tuple[str, str, int]]:
        r0 = group[0]
        device = next(self.model.parameters()).device
        width = max(len(r.ids) for r in group)
        input_ids = torch.full((len(group), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(group), width), dtype=torch.long)
        for i, r in enumerate(group):  # left padding: every prompt ends where generation starts
            input_ids[i, width - len(r.ids):] = torch.tensor(r.ids)
            attention[i, width - len(r.ids):] = 1
        sampling = {"do_sample": True, "temperature": r0.temperature, "top_p": r0.top_p, "top_k": 0} if r0.temperature > 0 else {"do_sample": False}
        out = self.model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=r0.max_tokens,
            eos_token_id=list(r0.stop_ids) or None,
            pad_token_id=self.pad_id,
            **sampling,
        )
        self.batches += 1
        results = []
        for row in out[:, width:].tolist():
            end = next((j for j, t in enumerate(row) if t in r0.stop_ids), None)
            kept = row if end is None else row[:end]
            self.generated_tokens += len(kept) + (end is not None)
            text = self.tokenizer.decode(kept, skip_special_tokens=True)
            results.append((text, "length" if end is None else "stop", len(kept) + (end is not None)))
        return results
