"""The corpus client's interface served by a transformers model in this process, batched.

For a host with a GPU and no serving engine (a training node, the GPU benchmarks): the
corpus and Magpie code await `chat` and `complete` one request at a time from many workers,
and this client decodes them together, so that a small target answers hundreds of requests
per forward pass. Two engines:

  * `slots` (Llama-family targets, the default where it applies): continuous batching over a
    preallocated KV cache (`benchmarks/slot_decoder.py`) in a background thread; a finished
    request frees its slot for the next one at once.
  * `generate`: what is waiting is gathered into one batched `model.generate` call, which
    runs until its longest answer ends; for any other architecture.

Requests are rendered as vLLM renders
them (the chat template with the generation prompt, no extra special tokens; a raw prompt
tokenised with or without them as `add_special_tokens` says), stop at the end-of-sequence
ids of the generation config or the request's `stop_token_ids`, and come back decoded
without special tokens and without the stop token, with vLLM's finish reasons.

    model, tokenizer = load_generation_model("/models/smollm2", device="cuda")
    async with LocalGenerationClient(model, tokenizer, max_batch=512) as client:
        stats = await generate_corpus_async(prompts, client, store, ChatTemplate(tokenizer), target=...)

Greedy requests are deterministic. Sampled ones (Magpie's user turns) share one torch
generator seeded at start, so their per-request `seed` is not honoured: a rerun reproduces
a run only when the requests arrive in the same order and batches.

The served engine stays the reference: this client is for hosts where it cannot run.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.slot_decoder import SlotDecoder, unsupported_reason
from eagle_assets.corpus.client import Completion, RequestRejected
from eagle_assets.precision import use_exact_fp32

ENGINES = ("auto", "slots", "generate")


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
    loop: asyncio.AbstractEventLoop | None = None
    started: float = 0.0


def load_generation_model(path: str, device: str = "cuda", dtype: torch.dtype = torch.float32):
    """The target for generation. fp32 by default: the CPU engine serves fp32, so greedy answers
    are the ones it gives. bf16 decodes faster on a GPU (benchmarks/slot_decoder_step.py)
    at the cost of an answer drifting from the fp32 one now and then."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    use_exact_fp32(device)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    return model, tokenizer


class LocalGenerationClient:
    """`InferenceClient`'s `chat`/`complete`/`check_server` over a local model; an async context manager."""

    def __init__(
        self,
        model,
        tokenizer,
        *,
        max_batch: int = 256,
        gather_s: float = 0.05,
        seed: int = 0,
        engine: str = "auto",
        max_len: int | None = None,
        cuda_graphs: bool | None = None,
    ):
        """`max_batch`: requests decoded together (the slots). `max_len`: longest prompt plus
        answer in tokens for the `slots` engine, which preallocates its KV cache for
        max_batch x max_len tokens (default: the model's positions, at most 2,048).
        `cuda_graphs`: the `slots` engine replays its decode steps as CUDA graphs (`SlotDecoder`;
        None = on CUDA)."""
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}: choose one of {', '.join(ENGINES)}")
        reason = unsupported_reason(model)
        if engine == "slots" and reason:
            raise ValueError(f"engine 'slots' cannot run this model ({reason}); use engine='generate'")
        self.engine = "generate" if engine == "generate" or reason else "slots"
        self.model = model
        self.tokenizer = tokenizer
        self.settings = LocalSettings(concurrency=max_batch, model=getattr(model, "name_or_path", "local"))
        self.gather_s = gather_s
        self.generator_seed = seed
        self.cuda_graphs = cuda_graphs
        eos = model.generation_config.eos_token_id
        self.eos_ids = tuple(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos_ids or (0,))[0]
        self.max_positions = getattr(model.config, "max_position_embeddings", None)
        if self.engine == "slots":
            self.max_positions = max_len or min(self.max_positions or 2048, 2048)
        self._queue: asyncio.Queue[_Request] | None = None
        self._task: asyncio.Task | None = None
        self._inbox: queue.Queue[_Request] = queue.Queue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.generated_tokens = 0
        self.batches = 0
        """`generate` calls, or prefills for the `slots` engine."""

    async def __aenter__(self) -> "LocalGenerationClient":
        torch.manual_seed(self.generator_seed)
        if self.engine == "slots":
            decoder = SlotDecoder(
                self.model, slots=self.settings.concurrency, max_len=self.max_positions, seed=self.generator_seed, cuda_graphs=self.cuda_graphs
            )
            self._stop.clear()
            self._thread = threading.Thread(target=self._run_slots, args=(decoder,), name="slot-decoder", daemon=True)
            self._thread.start()
        else:
            self._queue = asyncio.Queue()
            self._task = asyncio.create_task(self._serve())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            await asyncio.to_thread(self._thread.join)
            self._thread = None
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
        if self._queue is None and self._thread is None:
            raise RuntimeError("use the client inside `async with LocalGenerationClient(...) as client:`")
        max_tokens = int(params.get("max_tokens") or 256)
        if self.max_positions and len(ids) + max_tokens > self.max_positions:
            what = "the model's" if self.engine == "generate" else "the client's max_len of"
            raise RequestRejected(
                self.settings.base_url, 400, f"{len(ids)} prompt + {max_tokens} new tokens exceed {what} {self.max_positions} positions"
            )
        stop = tuple(dict.fromkeys([*self.eos_ids, *params.get("stop_token_ids", [])]))
        future = asyncio.get_running_loop().create_future()
        temperature = float(params.get("temperature", 1.0))
        top_p = float(params.get("top_p", 1.0)) if temperature > 0 else 1.0
        request = _Request(ids, max_tokens, temperature, top_p, stop, future, asyncio.get_running_loop())
        if self._thread is not None:
            self._inbox.put(request)
        else:
            await self._queue.put(request)
        return await future

    # ---------------------------------------------------------------- engine `slots`
    def _run_slots(self, decoder: SlotDecoder) -> None:
        """The decode loop (its own thread): admit waiting requests into free slots, step, finish."""
        pending: deque[_Request] = deque()
        active: dict[int, tuple[_Request, list[int]]] = {}
        free = list(range(decoder.slots))[::-1]
        # A prefill costs about what a step does: admit in groups rather than one per step.
        admit_at = max(1, decoder.slots // 8)
        while not self._stop.is_set():
            try:
                if not active and not pending:
                    pending.append(self._inbox.get(timeout=0.05))
                while True:
                    pending.append(self._inbox.get_nowait())
            except queue.Empty:
                pass
            try:
                if pending and free and (len(free) >= admit_at or not active):
                    admitted = []
                    while pending and free:
                        admitted.append((free.pop(), pending.popleft()))
                    for chunk in _token_chunks(admitted, budget=32768):
                        firsts = decoder.prefill(
                            [s for s, _ in chunk],
                            [r.ids for _, r in chunk],
                            [r.temperature for _, r in chunk],
                            [r.top_p for _, r in chunk],
                        )
                        self.batches += 1
                        for (slot, r), token in zip(chunk, firsts):
                            r.started = time.perf_counter()
                            active[slot] = (r, [])
                            self._advance(decoder, active, free, slot, token)
                if active:
                    tokens = decoder.step()
                    for slot in list(active):
                        self._advance(decoder, active, free, slot, tokens[slot])
            except Exception as exc:  # every request in flight learns why; the loop goes on
                for slot, (r, _) in list(active.items()):
                    _resolve(r, exc=exc)
                    decoder.release(slot)
                    free.append(slot)
                active.clear()
        for r in [*pending, *(r for r, _ in active.values())]:
            _resolve(r, exc=RuntimeError("the local generation client was closed"))

    def _advance(self, decoder: SlotDecoder, active: dict, free: list[int], slot: int, token: int) -> None:
        r, out = active[slot]
        stopped = token in r.stop_ids
        if not stopped:
            out.append(token)
        if stopped or len(out) >= r.max_tokens:
            text, finish, n = self._finished(out, stopped)
            _resolve(r, result=Completion(text, None, finish, len(r.ids), n, time.perf_counter() - r.started, 1))
            del active[slot]
            decoder.release(slot)
            free.append(slot)

    # ---------------------------------------------------------------- engine `generate`

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
            input_ids[i, width - len(r.ids) :] = torch.tensor(r.ids)
            attention[i, width - len(r.ids) :] = 1
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
            results.append(self._finished(row if end is None else row[:end], stopped=end is not None))
        return results

    def _finished(self, kept: list[int], stopped: bool) -> tuple[str, str, int]:
        """An answer's (text, finish reason, completion tokens) from its tokens before any stop
        token; the stop token counts as generated, as the engine counts it."""
        n = len(kept) + stopped
        self.generated_tokens += n
        return self.tokenizer.decode(kept, skip_special_tokens=True), "stop" if stopped else "length", n


def _resolve(r: _Request, result: Completion | None = None, exc: BaseException | None = None) -> None:
    """Complete a request's future from the decode thread, on its event loop."""

    def settle() -> None:
        if not r.future.done():
            r.future.set_exception(exc) if exc is not None else r.future.set_result(result)

    assert r.loop is not None
    r.loop.call_soon_threadsafe(settle)


def _token_chunks(admitted: list[tuple[int, _Request]], budget: int) -> list[list[tuple[int, _Request]]]:
    """Split a prefill so that rows x longest prompt stays within `budget` tokens."""
    chunks: list[list[tuple[int, _Request]]] = [[]]
    width = 0
    for item in sorted(admitted, key=lambda a: len(a[1].ids)):
        width = max(width, len(item[1].ids))
        if chunks[-1] and width * (len(chunks[-1]) + 1) > budget:
            chunks.append([])
            width = len(item[1].ids)
        chunks[-1].append(item)
    return chunks
