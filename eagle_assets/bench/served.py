"""Served benchmark: load a running OpenAI-compatible server and measure it per concurrency level.

Every request is the same kind of work in every engine configuration: the same chat prompts,
greedy (temperature 0), exactly `output_len` output tokens (`max_tokens` = `min_tokens` =
`output_len`, `ignore_eos`), streamed over SSE. Per concurrency level we measure

    TTFT            request sent -> first streamed output token (mean, p50, p90)
    ITL             gap between streamed chunks / tokens in the chunk, one sample per token
                    (a speculative step streams several tokens at once; this keeps ITL a
                    per-token latency comparable with and without speculation)
    tokens/s        total output tokens of the level / wall time of the level
    requests/s      requests of the level / wall time of the level
    SpecStats       vLLM: delta of `/metrics` spec-decode counters scraped before and after
                    the level; SGLang: per-request `spec_tokens_details` (see `metrics.py`)

Token counts come from the server's own usage numbers (`stream_options.continuous_usage_stats`,
supported by vLLM and SGLang), never from counting text chunks.

A request (or scrape) that fails in a way a retry may cure (a refused or dropped connection,
HTTP 5xx, 408 or 429) is sent again, up to `request_attempts` times with backoff (at least what
a `Retry-After` header asks); the level counts its `retried_requests`. When the server's /health
does not answer either, the server is down: `ServerGone` is raised at once, naming it, instead
of retrying. A request that streams nothing for `request_timeout_s`, or has not finished within
its deadline (`SweepSettings.deadline_s`, fitted to `output_len`), fails the sweep at once,
naming the server: a stalled server makes no progress for a retry either.

One engine configuration ("baseline", "eagle3", "ngram") gives one `ServedRun`; `eagle-assets
bench` runs one per configuration, against servers it launches or yours (EAGLE_ASSETS_SERVER_URL
and EAGLE_ASSETS_SPECULATIVE_URL, whose key is read from EAGLE_ASSETS_SERVER_API_KEY or the file
EAGLE_ASSETS_SERVER_API_KEY_FILE names, never from the command line, where `ps` shows it to every
user of the host). The key is sent as a bearer token and never logged or written to results.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx
import numpy as np
from tqdm import tqdm

from eagle_assets.bench.metrics import SpecCounters, SpecStats, scrape, spec_stats_between, spec_stats_from_sglang
from eagle_assets.corpus.prompt_record import MT_BENCH_PATH
from eagle_assets.durable import room_named, write_durably
from eagle_assets.engines.process import health_problem
from eagle_assets.http_client import auth_headers, client, retry_after_s, retry_delay_s, retryable_status

log = logging.getLogger(__name__)

ENGINES = ("vllm", "sglang")
OFFLINE_REFERENCES = ("auto", "hf", "engine")
"""Where a benchmark's offline reference comes from: "hf" (the reference decoder, the target
loaded here), "engine" (replayed over the states an extraction server captures,
`reference_states.py`) or "auto" (hf where the target fits this host)."""
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class SweepSettings:
    """How a served sweep loads the server."""

    output_len: int = 256
    """Output tokens per request, exact: max_tokens = min_tokens = output_len with ignore_eos."""
    concurrencies: tuple[int, ...] = (1, 4, 8)
    """Requests in flight at each level; every level sends every prompt once."""
    engine: str = "vllm"
    """"vllm" (spec stats from /metrics) or "sglang" (spec stats from per-request details)."""
    warmup_requests: int = 2
    """Unmeasured requests before the first level (first requests pay one-off setup costs)."""
    request_timeout_s: float = 180.0
    """A request that streams nothing for this long (no first token, or no next one) is
    abandoned and fails the level, naming the server: it made no progress."""
    min_tokens_per_s: float = 2.0
    """A request's whole deadline (`deadline_s`) is `request_timeout_s` for its first token and
    `output_len` at this rate, the slowest a working server is taken to stream one answer."""
    retry_after_max_s: float = 300.0
    """Cap on the wait a server's `Retry-After` asks for (it is honoured up to this)."""
    metrics_settle_s: float = 2.0
    """After a level, how long to wait for /metrics to stop moving (the engine records the last
    step's counters just after it streams the last token)."""
    progress: bool = True
    """Show a progress bar per level."""
    request_attempts: int = 3
    """Attempts per request (and per /metrics scrape) on a failure a retry can cure: a dropped or
    refused connection, a timeout, HTTP 5xx, 408 or 429. A retried request's wait stays in its
    level's wall time: the level's `retried_requests` says how many there were."""
    retry_backoff_s: float = 1.0
    """Wait before the first retry; doubled before each further one, with jitter."""

    def __post_init__(self) -> None:
        if self.request_attempts < 1:
            raise ValueError(f"request_attempts={self.request_attempts}: give at least 1")
        if self.output_len < 2:
            raise ValueError(f"output_len={self.output_len}: need at least 2 tokens to measure ITL")
        if not self.concurrencies or min(self.concurrencies) < 1:
            raise ValueError(f"concurrencies={self.concurrencies}: give one or more levels >= 1")
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}: choose one of {ENGINES}")
        for name in ("request_timeout_s", "min_tokens_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name}={value}: give a positive number")

    def deadline_s(self, output_len: int | None = None) -> float:
        """Seconds one request of `output_len` tokens (default the sweep's) may take in all."""
        return request_deadline_s(self.request_timeout_s, output_len or self.output_len, self.min_tokens_per_s)


def request_deadline_s(stall_s: float, tokens: int, min_tokens_per_s: float = 2.0) -> float:
    """The whole deadline of a request for `tokens` tokens: `stall_s` for the first, then the
    rest at `min_tokens_per_s`. A request not streamed shows no progress before it ends, so this
    is all that bounds it."""
    return stall_s + tokens / min_tokens_per_s


@dataclass(frozen=True)
class RequestResult:
    """One streamed request."""

    prompt_index: int
    output_tokens: int
    """Completion tokens the server reported (equals output_len, or the level fails)."""
    ttft_s: float
    e2e_s: float
    itl_s: tuple[float, ...]
    """One sample per output token after the first: chunk gap / tokens in the chunk."""
    chunks: int
    """Streamed chunks that carried tokens (fewer than tokens when speculation streams runs)."""
    spec_details: Mapping | None = None
    """SGLang's per-request `spec_tokens_details`, when the engine returns them."""
    attempts: int = 1
    """Attempts it took (more than 1 after a retried failure)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "RequestResult":
        return cls(**{**d, "itl_s": tuple(d["itl_s"])})


def _dist(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p90": math.nan}
    a = np.asarray(values, dtype=np.float64)
    return {"mean": float(a.mean()), "p50": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90))}


@dataclass(frozen=True)
class LevelResult:
    """One concurrency level of a sweep."""

    concurrency: int
    num_requests: int
    output_tokens: int
    """Sum of output tokens over the level's requests."""
    wall_s: float
    """First request sent to last request finished."""
    tokens_per_s: float
    """output_tokens / wall_s."""
    requests_per_s: float
    """num_requests / wall_s."""
    ttft_s: dict[str, float]
    """TTFT distribution over requests: mean, p50, p90 (seconds)."""
    itl_s: dict[str, float]
    """ITL distribution over tokens: mean, p50, p90 (seconds)."""
    tokens_per_chunk: float
    """Mean output tokens per streamed chunk (1 without speculation, about AL with it)."""
    spec: SpecStats | None = None
    """Speculation statistics of this level; None when the server runs without speculation."""
    round_tokens_per_s: tuple[float, ...] = ()
    """Tokens/s of each round when the level was served in rounds interleaved with other
    configurations (`bench/interleaved.py`); empty when it was served in one go."""
    retried_requests: int = 0
    """Requests that succeeded only on a later attempt; their retries' wait is in `wall_s`."""

    def to_dict(self) -> dict:
        d = asdict(self)
        d["spec"] = self.spec.to_dict() if self.spec else None
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "LevelResult":
        d = dict(d)
        d["spec"] = SpecStats.from_dict(d["spec"]) if d.get("spec") else None
        d["round_tokens_per_s"] = tuple(d.get("round_tokens_per_s", ()))
        return cls(**d)


@dataclass(frozen=True)
class ServedRun:
    """A sweep of one engine configuration: "baseline", "eagle3" or "ngram"."""

    label: str
    """Engine configuration: "baseline" (no speculation), "eagle3", "ngram", ..."""
    engine: str
    model: str
    """Served model name the requests asked for."""
    base_url: str
    output_len: int
    num_prompts: int
    levels: tuple[LevelResult, ...]
    started_at: float = 0.0
    """Unix time the sweep began."""
    config: dict = field(default_factory=dict)
    """Free-form description of the server (speculative config, engine version, ...)."""

    def level(self, concurrency: int) -> LevelResult | None:
        return next((lv for lv in self.levels if lv.concurrency == concurrency), None)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["levels"] = [lv.to_dict() for lv in self.levels]
        return d

    @classmethod
    def from_dict(cls, d: Mapping) -> "ServedRun":
        d = dict(d)
        d["levels"] = tuple(LevelResult.from_dict(lv) for lv in d["levels"])
        return cls(**d)


class ServedRequestError(RuntimeError):
    """A request or scrape that failed for good; the message names the server and the prompt."""

    def __init__(self, message: str, base_url: str):
        super().__init__(message)
        self.base_url = base_url


class ServerGone(ServedRequestError):
    """A request failed and the server's /health does not answer either: it is down, and
    retrying cannot help."""


class _RetryableStatus(Exception):
    """An HTTP status a retry may cure (5xx, 408, 429), with the wait its Retry-After asks (seconds)."""

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s


def _describe(exc: BaseException) -> str:
    # httpx messages are often empty for dropped connections: name the type too.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _down(base_url: str, headers: Mapping[str, str], error: str, what: str) -> ServerGone | None:
    """A `ServerGone` when the server's /health does not answer after `what` failed with `error`."""
    health = health_problem(base_url.rstrip("/") + "/health", 5.0, dict(headers))
    if health is None:
        return None
    return ServerGone(f"{what} to {base_url} failed ({error}) and {health}: the server is down", base_url)


# -- Prompts ---------------------------------------------------------------------------------


def as_messages(prompt: str | Sequence[Mapping]) -> Messages:
    """A prompt as chat messages: a plain string becomes one user turn."""
    if isinstance(prompt, str):
        return [{"role": "user", "content": prompt}]
    msgs = [dict(m) for m in prompt]
    if not msgs or any("role" not in m or "content" not in m for m in msgs):
        raise ValueError(f"a prompt must be a string or a list of {{role, content}} messages; got {prompt!r:.200}")
    return msgs


@dataclass(frozen=True)
class PromptSet:
    """The prompts a benchmark sends, the served sweep and the offline reference alike, and
    what the report calls them."""

    name: str
    messages: tuple[Messages, ...]
    categories: tuple[str, ...] | None = None
    """One per prompt (MT-Bench's), for the offline breakdown per category; None: no categories."""
    notes: tuple[str, ...] = ()
    """What the report should say about how they were chosen (prompts left out, and why)."""


def mt_bench_set(n: int | None = None) -> PromptSet:
    """`mt_bench_prompts(n)` with their categories: the benchmark's default prompt set."""
    messages = mt_bench_prompts(n)
    return PromptSet(
        f"MT-Bench first turns ({len(messages)} of {mt_bench_size()}, spread over its categories)", tuple(messages), tuple(mt_bench_categories(n))
    )


def user_prompt_set(
    url: str,
    num_prompts: int,
    format: str = "auto",
    fits: Callable[[Messages], bool] | None = None,
    storage_options: Mapping | None = None,
) -> PromptSet:
    """The first user turn (after the system message, when there is one) of the first
    `num_prompts` distinct prompts of a user's prompt file that `fits` the target's context, in
    file order: the traffic a drafter will serve, as single requests. The file is read whole
    and strictly (any format of corpus/prompt_formats.py), so a bad row fails here, naming its
    line, before anything is served; MT-Bench is allowed (evaluation). Raises ValueError when
    fewer than `num_prompts` prompts fit."""
    from eagle_assets.corpus.prompts import load_prompt_file

    chosen: list[Messages] = []
    seen, too_long = set(), 0
    for prompt in load_prompt_file(url, purpose="evaluation", format=format, storage_options=storage_options):
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system is not None else []) + [
            {"role": "user", "content": prompt.turns[0]}
        ]
        key = json.dumps(messages)
        if key in seen:
            continue
        seen.add(key)
        if fits is not None and not fits(messages):
            too_long += 1
            continue
        chosen.append(messages)
        if len(chosen) == num_prompts:
            break
    left_out = f"; {too_long} left out: their first turn and the answer do not fit the target's context" if too_long else ""
    if len(chosen) < num_prompts:
        raise ValueError(f"num_prompts={num_prompts}: {url} has {len(chosen)} distinct prompts{left_out}; give at most {len(chosen)}")
    notes = (f"prompts: {too_long} of {url}'s first prompts left out, too long for the target's context",) if too_long else ()
    return PromptSet(f"{url}: the first user turn of its first {len(chosen)} prompts", tuple(chosen), None, notes)


def context_fit(target_path: str | Path, max_model_len: int, new_tokens: int, trust_remote_code: bool = False) -> Callable[[Messages], bool]:
    """Whether a prompt, rendered with the target's chat template, and `new_tokens` more fit
    `max_model_len` (the server refuses a request that does not)."""
    from eagle_assets.corpus.target import load_tokenizer

    tokenizer = None  # loaded at the first prompt: a file that fails to read fails before it

    def fits(messages: Messages) -> bool:
        nonlocal tokenizer
        tokenizer = tokenizer or load_tokenizer(target_path, trust_remote_code=trust_remote_code)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return len(ids["input_ids"] if isinstance(ids, Mapping) else ids) + new_tokens <= max_model_len

    return fits


def mt_bench_prompts(n: int | None = None, path: str | Path | None = None) -> list[Messages]:
    """The first turns of `n` MT-Bench questions spread evenly over the 80 (evaluation only,
    never training): the file runs category by category (writing, roleplay, reasoning, math,
    coding, extraction, STEM, humanities), so the first `n` alone would test few of them."""
    return [as_messages(q["turns"][0]) for q in _mt_bench_spread(n, path)]


def mt_bench_categories(n: int | None = None, path: str | Path | None = None) -> list[str]:
    """The category of each prompt `mt_bench_prompts(n, path)` returns, in the same order."""
    return [q["category"] for q in _mt_bench_spread(n, path)]


def mt_bench_size(path: str | Path | None = None) -> int:
    """How many questions the MT-Bench file holds (80): the most prompts a benchmark can ask for."""
    return len(_mt_bench_spread(None, path))


def _mt_bench_spread(n: int | None, path: str | Path | None) -> list[dict]:
    path = Path(path) if path else MT_BENCH_PATH
    with open(path, encoding="utf-8") as f:
        out = [json.loads(line) for line in f if line.strip()]
    if not n or n >= len(out):
        return out
    return [out[i * len(out) // n] for i in range(n)]


# -- One request -----------------------------------------------------------------------------


def _payload(model: str, messages: Messages, output_len: int, engine: str) -> dict:
    body = {
        "model": model,
        "messages": messages,
        "temperature": 0.0,
        "max_tokens": output_len,
        "min_tokens": output_len,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if engine == "sglang":
        body["return_spec_tokens_details"] = True
    return body


async def _one_request(
    client: httpx.AsyncClient,
    url: str,
    headers: dict[str, str],
    body: dict,
    prompt_index: int,
) -> RequestResult:
    base = url.rsplit("/v1/", 1)[0]
    t0 = time.perf_counter()
    first = last = None
    tokens = chunks = 0
    itl: list[float] = []
    spec_details = None
    async with client.stream("POST", url, json=body, headers=headers) as resp:
        if retryable_status(resp.status_code):
            text = (await resp.aread()).decode(errors="replace")
            raise _RetryableStatus(f"HTTP {resp.status_code}: {text[:300]}", retry_after_s(resp.headers.get("Retry-After")))
        if resp.status_code != 200:
            text = (await resp.aread()).decode(errors="replace")
            raise ServedRequestError(
                f"prompt {prompt_index}: {url} answered HTTP {resp.status_code}: {text[:500]}. "
                "Check the model name and that the server accepts min_tokens/ignore_eos.",
                base,
            )
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise ServedRequestError(f"prompt {prompt_index}: the server streamed an error: {chunk['error']}", base)
            now = time.perf_counter()
            sglext = chunk.get("sglext") or {}
            if sglext.get("spec_tokens_details"):
                spec_details = sglext["spec_tokens_details"]
            usage = chunk.get("usage") or {}
            has_text = any(
                any((c.get("delta") or {}).get(k) for k in ("content", "reasoning_content", "reasoning")) for c in chunk.get("choices") or ()
            )
            if not chunk.get("choices"):
                # A usage-only chunk (the last one) carries no tokens; it fixes the count when the
                # server gave no per-chunk usage.
                tokens = max(tokens, int(usage.get("completion_tokens", 0)))
                continue
            if "completion_tokens" in usage:
                new = int(usage["completion_tokens"]) - tokens
            else:
                # No per-chunk usage: one token per text chunk, corrected by the final usage below.
                new = 1 if has_text else 0
            if new <= 0:
                continue
            tokens += new
            chunks += 1
            if first is None:
                first = now
            else:
                itl.extend([(now - last) / new] * new)
            last = now
    e2e = time.perf_counter() - t0
    if first is None:
        raise ServedRequestError(f"prompt {prompt_index}: the stream ended without any output token", base)
    return RequestResult(
        prompt_index=prompt_index,
        output_tokens=tokens,
        ttft_s=first - t0,
        e2e_s=e2e,
        itl_s=tuple(itl),
        chunks=chunks,
        spec_details=spec_details,
    )


async def _request_with_retries(
    client: httpx.AsyncClient,
    base_url: str,
    headers: dict[str, str],
    body: dict,
    prompt_index: int,
    settings: SweepSettings,
) -> RequestResult:
    """`_one_request`, retried (up to `settings.request_attempts`, with backoff) on what a retry
    may cure; at once `ServerGone` when the server's /health does not answer after a failure."""
    url = base_url.rstrip("/") + "/v1/chat/completions"
    deadline = settings.deadline_s(body.get("max_tokens"))
    for attempt in range(1, settings.request_attempts + 1):
        try:
            async with asyncio.timeout(deadline):  # the whole request: a stream may trickle forever
                result = await _one_request(client, url, headers, body, prompt_index)
            return replace(result, attempts=attempt)
        except (httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout) as exc:  # no progress: no passing fault
            raise ServedRequestError(
                f"prompt {prompt_index}: {url} streamed nothing for {settings.request_timeout_s:.0f} s "
                f"({_describe(exc)}; --stall-timeout, request_timeout_s): the server at {base_url} takes requests but makes "
                "no progress. See its log, restart it and rerun",
                base_url,
            ) from None
        except TimeoutError:
            raise ServedRequestError(
                f"prompt {prompt_index}: {url} did not finish within its deadline of {deadline:.0f} s "
                f"({settings.request_timeout_s:g} s and {body.get('max_tokens')} tokens at "
                f"{settings.min_tokens_per_s:g} tokens/s): the server at {base_url} is stalled or far slower than that",
                base_url,
            ) from None
        except (httpx.TransportError, _RetryableStatus) as exc:
            error = _describe(exc)
            gone = await asyncio.to_thread(_down, base_url, headers, error, f"prompt {prompt_index}")
            if gone is not None:
                raise gone from None
            if attempt == settings.request_attempts:
                raise ServedRequestError(f"prompt {prompt_index}: {url} failed {attempt} times; last: {error}", base_url) from None
            log.warning("prompt %d: %s failed (%s); retrying", prompt_index, url, error)
            retry_after = getattr(exc, "retry_after_s", None)  # the server's own word on when to come back
            await asyncio.sleep(
                retry_delay_s(attempt, settings.retry_backoff_s, retry_after=retry_after, retry_after_max_s=settings.retry_after_max_s)
            )
    raise AssertionError("unreachable")


async def _run_requests(
    base_url: str,
    model: str,
    prompts: Sequence[Messages],
    settings: SweepSettings,
    concurrency: int,
    api_key: str | None,
    desc: str,
) -> tuple[list[RequestResult], float]:
    headers = auth_headers(api_key)
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(prompts)):
        queue.put_nowait(i)
    results: list[RequestResult] = []
    bar = tqdm(total=len(prompts), desc=desc, disable=not settings.progress, leave=False)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            try:
                i = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            body = _payload(model, prompts[i], settings.output_len, settings.engine)
            results.append(await _request_with_retries(client, base_url, headers, body, i, settings))
            bar.update(1)

    try:
        # The read timeout is the longest wait for the next bytes; the key goes with each request.
        async with client(None, settings.request_timeout_s, asynchronous=True, limits=limits) as http:
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(http) for _ in range(concurrency)))
            wall = time.perf_counter() - t0
    finally:
        bar.close()
    return sorted(results, key=lambda r: r.prompt_index), wall


def _scrape(base_url: str, api_key: str | None, model: str, settings: SweepSettings) -> SpecCounters:
    """`scrape`, retried as a request is (`_request_with_retries`)."""
    for attempt in range(1, settings.request_attempts + 1):
        try:
            return scrape(base_url, api_key=api_key, model=model)
        except RuntimeError as exc:  # scrape's words for a transport error or an HTTP status
            gone = _down(base_url, auth_headers(api_key), str(exc), "a /metrics scrape")
            if gone is not None:
                raise gone from None
            if attempt == settings.request_attempts:
                raise ServedRequestError(f"{exc} ({attempt} attempts)", base_url) from None
            time.sleep(retry_delay_s(attempt, settings.retry_backoff_s))
    raise AssertionError("unreachable")


def _settled_scrape(base_url: str, api_key: str | None, model: str, settings: SweepSettings) -> SpecCounters:
    """Scrape until two scrapes agree (or settle_s passes): the last step's counters land late."""
    prev = _scrape(base_url, api_key, model, settings)
    deadline = time.monotonic() + settings.metrics_settle_s
    while time.monotonic() < deadline:
        time.sleep(0.2)
        cur = _scrape(base_url, api_key, model, settings)
        if cur == prev:
            return cur
        prev = cur
    return prev


def refuse_too_few_prompts(num_prompts: int, concurrencies: Sequence[int], what: str) -> None:
    """Refuse prompts too few to keep the highest concurrency's requests in flight; `what` names
    them in the message ("num_prompts=4", "2 prompts")."""
    top = max(concurrencies)
    if num_prompts < 1:
        raise ValueError(f"{what}: give at least 1 prompt")
    if num_prompts < top:
        raise ValueError(
            f"{what} cannot keep {top} requests in flight (concurrencies {list(concurrencies)}): give at least {top} prompts or lower the concurrency"
        )


def run_level(
    base_url: str,
    model: str,
    prompts: Sequence[Messages],
    concurrency: int,
    settings: SweepSettings,
    api_key: str | None = None,
) -> LevelResult:
    """Send every prompt once with `concurrency` requests in flight; measure the level."""
    refuse_too_few_prompts(len(prompts), (concurrency,), f"{len(prompts)} prompts")
    before = settled_counters(base_url, api_key, model, settings)
    results, wall = send_prompts(base_url, model, prompts, concurrency, settings, api_key)
    after = settled_counters(base_url, api_key, model, settings)
    return level_result(concurrency, results, wall, settings, spec_between(before, after, results, settings))


def send_prompts(
    base_url: str,
    model: str,
    prompts: Sequence[Messages],
    concurrency: int,
    settings: SweepSettings,
    api_key: str | None = None,
    indices: Sequence[int] | None = None,
) -> tuple[list[RequestResult], float]:
    """Every prompt once, `concurrency` in flight: the requests (numbered by `indices`, the
    prompts' places in a larger list, when given) and the wall time; refuses an answer of any
    length but `output_len`."""
    indices = list(indices) if indices is not None else list(range(len(prompts)))
    results, wall = asyncio.run(_run_requests(base_url, model, prompts, settings, concurrency, api_key, f"c={concurrency}"))
    for r in results:
        if r.output_tokens != settings.output_len:
            raise ServedRequestError(
                f"prompt {indices[r.prompt_index]} at concurrency {concurrency} got {r.output_tokens} output "
                f"tokens, expected exactly {settings.output_len}: the server did not honour "
                "min_tokens/ignore_eos, or output_len exceeds max-model-len minus the prompt",
                base_url,
            )
    return [replace(r, prompt_index=indices[r.prompt_index]) for r in results], wall


def settled_counters(base_url: str, api_key: str | None, model: str, settings: SweepSettings) -> SpecCounters | None:
    """vLLM's spec-decode counters once they stop moving; None for SGLang (its requests carry them)."""
    return _settled_scrape(base_url, api_key, model, settings) if settings.engine == "vllm" else None


def spec_between(
    before: SpecCounters | None, after: SpecCounters | None, results: Sequence[RequestResult], settings: SweepSettings
) -> SpecStats | None:
    """The level's speculation statistics: vLLM's counter deltas, or SGLang's per-request details."""
    if settings.engine == "vllm":
        return spec_stats_between(before, after)
    return spec_stats_from_sglang(r.spec_details for r in results if r.spec_details)


def level_result(
    concurrency: int,
    results: Sequence[RequestResult],
    wall: float,
    settings: SweepSettings,
    spec: SpecStats | None,
    round_tokens_per_s: Sequence[float] = (),
) -> LevelResult:
    """One level's figures from its requests and the wall time they took."""
    out_tokens = sum(r.output_tokens for r in results)
    level = LevelResult(
        concurrency=concurrency,
        num_requests=len(results),
        output_tokens=out_tokens,
        wall_s=wall,
        tokens_per_s=out_tokens / wall,
        requests_per_s=len(results) / wall,
        ttft_s=_dist([r.ttft_s for r in results]),
        itl_s=_dist([x for r in results for x in r.itl_s]),
        tokens_per_chunk=out_tokens / sum(r.chunks for r in results),
        spec=spec,
        round_tokens_per_s=tuple(round_tokens_per_s),
        retried_requests=sum(r.attempts > 1 for r in results),
    )
    al = f", AL {spec.al:.2f} over {spec.drafts} drafts" if spec and spec.drafts else ""
    log.info(
        "concurrency %d: %d requests, %.1f output tok/s, TTFT p50 %.3f s, ITL p50 %.4f s%s",
        concurrency,
        level.num_requests,
        level.tokens_per_s,
        level.ttft_s["p50"],
        level.itl_s["p50"],
        al,
    )
    return level


def warm_up(base_url: str, model: str, prompts: Sequence[Messages], settings: SweepSettings, api_key: str | None = None) -> None:
    """Unmeasured requests (the first requests to a fresh server pay one-off setup costs)."""
    if settings.warmup_requests <= 0:
        return
    n = settings.warmup_requests
    warm = [prompts[i % len(prompts)] for i in range(n)]
    quiet = replace(settings, output_len=min(settings.output_len, 8), concurrencies=(1,), warmup_requests=0, progress=False)
    asyncio.run(_run_requests(base_url, model, warm, quiet, 1, api_key, "warm-up"))


def run_sweep(
    base_url: str,
    model: str,
    prompts: Sequence[str | Sequence[Mapping]],
    output_len: int = 256,
    concurrencies: Sequence[int] = (1, 4, 8),
    api_key: str | None = None,
    settings: SweepSettings | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> list[LevelResult]:
    """Measure the server at each concurrency level, in the order given.

    `prompts` are chat message lists (or plain strings, sent as one user turn); every level
    sends each of them once. `settings` overrides `output_len` and `concurrencies` when given.
    `on_level` gets each level as soon as it is measured (to keep it on disk, say).
    """
    settings = settings or SweepSettings(output_len=output_len, concurrencies=tuple(concurrencies))
    msgs = [as_messages(p) for p in prompts]
    if not msgs:
        raise ValueError("no prompts to send: give at least one")
    warm_up(base_url, model, msgs, settings, api_key)
    levels = []
    for c in settings.concurrencies:
        levels.append(run_level(base_url, model, msgs, c, settings, api_key))
        if on_level:
            on_level(levels[-1])
    return levels


def run_served(
    label: str,
    base_url: str,
    model: str,
    prompts: Sequence[str | Sequence[Mapping]],
    settings: SweepSettings,
    api_key: str | None = None,
    config: Mapping | None = None,
    on_level: Callable[[LevelResult], None] | None = None,
) -> ServedRun:
    """`run_sweep` for one engine configuration, packaged as a `ServedRun` named `label`."""
    started = time.time()
    log.info(
        "served sweep %r on %s (%s): %d prompts x %d tokens at concurrency %s",
        label,
        base_url,
        model,
        len(prompts),
        settings.output_len,
        list(settings.concurrencies),
    )
    levels = run_sweep(base_url, model, prompts, settings=settings, api_key=api_key, on_level=on_level)
    return ServedRun(
        label=label,
        engine=settings.engine,
        model=model,
        base_url=base_url,
        output_len=settings.output_len,
        num_prompts=len(prompts),
        levels=tuple(levels),
        started_at=started,
        config=dict(config or {}),
    )


def write_json_atomic(path: str | Path, obj: object) -> Path:
    """Write JSON through a temporary name and rename, so a crash (or a full disk, `durable.DiskFull`
    naming the path) never leaves half a file."""
    path = Path(path)
    with room_named(path.parent, f"{path.name}'s folder"):
        path.parent.mkdir(parents=True, exist_ok=True)
    write_durably(path, json.dumps(obj, indent=2, allow_nan=True).encode("utf-8"))
    return path
