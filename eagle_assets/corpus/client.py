"""Async client for an OpenAI-compatible inference server (vLLM, SGLang), over httpx.

It sends chat and raw completion requests with bounded concurrency and retries with
exponential backoff and jitter on the failures that a retry can cure (5xx, 408/429, refused or
dropped connections), waiting at least what a `Retry-After` header asks. Any other 4xx is the
caller's mistake and fails at once with the server's own message. The API key comes from the
caller and is sent as a bearer header; it never appears in a message, a log line or a repr.

Deadlines. A request is not streamed (the server's reasoning parser splits a whole answer, as
the corpus stores it), so a stalled server and a slow answer look alike until one ends: each
attempt gets a deadline that fits its length, `first_token_s` plus `max_tokens` at
`min_tokens_per_s`, at most `timeout_s` (`ClientSettings.deadline_s`). An attempt past its
deadline is abandoned and tried once more; when no request at all has finished during a whole
deadline, the server accepts connections but does no work, and `ServerStalled` is raised at
once, naming it. While requests wait with nothing finished, `log` (when given) says so every
`quiet_s` seconds.

    async with InferenceClient(ClientSettings("http://localhost:8000", "my-model")) as client:
        await client.check_server()
        result = await client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 32})
        print(result.content, result.reasoning_content, result.completion_tokens)
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from eagle_assets import http_client
from eagle_assets.http_client import retry_after_s, retry_delay_s

# Statuses that mean "try again later" even though they are 4xx.
RETRYABLE_4XX = (408, 429)


@dataclass(frozen=True)
class ClientSettings:
    """Where the server is and how hard to push it."""

    base_url: str
    """Server root, e.g. `http://localhost:8000` (a trailing `/v1` is accepted too)."""
    model: str
    """The served model name (`--served-model-name`), sent in every request."""
    api_key: str | None = field(default=None, repr=False)
    """Bearer token, if the server wants one. Never logged."""
    concurrency: int = 16
    """Requests in flight at once; more queue in the client, not on the server."""
    timeout_s: float = 600.0
    """The most seconds one attempt may take; one asking for fewer tokens gets a shorter
    deadline (`deadline_s`). A long reasoning answer is slow; a hung server is not."""
    first_token_s: float = 120.0
    """Part of every attempt's deadline: queueing and the prompt's prefill."""
    min_tokens_per_s: float = 2.0
    """Part of every attempt's deadline: `max_tokens` at this rate, the slowest a working server
    is taken to write one answer."""
    connect_timeout_s: float = 10.0
    """Seconds to open a connection; a dead server fails fast and is retried."""
    max_retries: int = 4
    """Retries after the first attempt, for retryable failures only."""
    backoff_s: float = 1.0
    """First retry delay; doubles per retry, with full jitter in [delay/2, delay]."""
    backoff_max_s: float = 30.0
    """Cap on one retry delay."""
    retry_after_max_s: float = 300.0
    """Cap on the wait a server's `Retry-After` asks for (it is honoured up to this)."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"server URL {self.base_url!r} must start with http:// or https://")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")
        for name in ("timeout_s", "first_token_s", "min_tokens_per_s", "connect_timeout_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number of seconds (tokens per second), got {value}")

    def deadline_s(self, max_tokens: int | None) -> float:
        """Seconds one attempt of a request for `max_tokens` may take (module docstring)."""
        if not max_tokens:
            return self.timeout_s
        return min(self.timeout_s, self.first_token_s + max_tokens / self.min_tokens_per_s)

    @property
    def quiet_s(self) -> float:
        """How long requests wait with nothing finished before the client's log says so (and again after as long)."""
        return min(60.0, self.timeout_s / 2)

    @property
    def api_root(self) -> str:
        """The `/v1` root every endpoint hangs off."""
        root = self.base_url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"


@dataclass(frozen=True)
class Completion:
    """One finished request, chat or raw completion."""

    content: str
    """The answer text (for a raw completion: the generated text)."""
    reasoning_content: str | None
    """What the server's reasoning parser split off (`reasoning_content` or `reasoning`); None without one."""
    finish_reason: str | None
    """`stop`, `length` (truncated at max_tokens), ..."""
    prompt_tokens: int
    completion_tokens: int
    latency_s: float
    """Wall time of the successful attempt."""
    attempts: int
    """1 when the first attempt succeeded."""


class InferenceError(RuntimeError):
    """A request that did not produce an answer; the message says why and what to do."""

    retryable = False


class RequestRejected(InferenceError):
    """The server refused the request (4xx): retrying the same request cannot help."""

    def __init__(self, url: str, status: int, body: str):
        self.status = status
        super().__init__(
            f"{url} rejected the request with HTTP {status}: {body[:500]}. Check the model name, "
            "the sampling parameters and the prompt length against the server's settings."
        )


class ServerFailure(InferenceError):
    """A failure a retry may cure: 5xx, 408/429, timeout, refused or dropped connection."""

    retryable = True

    def __init__(self, message: str, retry_after_s: float | None = None):
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """What the server's Retry-After header asked for, in seconds; None without one."""


class RequestStalled(ServerFailure):
    """An attempt that did not finish within its deadline (`ClientSettings.deadline_s`)."""


class ServerStalled(InferenceError):
    """No request finished during a whole deadline: the server accepts connections but does no
    work. Raised at once; retrying against it cannot help."""


class RetriesExhausted(InferenceError):
    """The last retryable failure, after every retry was spent."""

    def __init__(self, url: str, attempts: int, last: Exception):
        self.attempts = attempts
        self.last = last
        super().__init__(f"{url}: gave up after {attempts} attempts; last error: {last}")


class ServerUnreachable(InferenceError):
    """The server does not answer or does not serve the model: nothing was sent."""


def _describe(exc: httpx.HTTPError) -> str:
    # httpx messages are often empty ("") for dropped connections; name the type instead.
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


class InferenceClient:
    """OpenAI-compatible chat/completions client; use as an async context manager."""

    def __init__(self, settings: ClientSettings, *, rng: random.Random | None = None, log: Callable[[str], None] | None = None):
        self.settings = settings
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(settings.concurrency)
        self._http: httpx.AsyncClient | None = None
        self._log = log
        self._watch: asyncio.Task | None = None
        self._in_flight = 0
        self._last_answer = time.monotonic()
        """When a request last finished (or the client started): what tells a stalled server."""
        self._stalled: str | None = None
        """Why the server was found stalled, once it was: every request after fails at once."""
        self._deadlines: set[asyncio.Timeout] = set()
        """The deadlines of the attempts in flight (moved to now when the server is found stalled)."""

    def __repr__(self) -> str:  # the settings' repr already hides the key
        return f"InferenceClient({self.settings!r})"

    async def __aenter__(self) -> "InferenceClient":
        s = self.settings
        self._http = http_client.client(
            s.api_key,
            s.timeout_s,
            s.connect_timeout_s,
            asynchronous=True,
            # One connection per request in flight; keep-alive avoids a handshake per request.
            limits=httpx.Limits(max_connections=s.concurrency, max_keepalive_connections=s.concurrency),
        )
        self._last_answer = time.monotonic()
        if self._log is not None:
            self._watch = asyncio.create_task(self._say_when_quiet(self._log))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def _say_when_quiet(self, log: Callable[[str], None]) -> None:
        """Every `quiet_s` with requests waiting and none finished since: say so, with the server."""
        quiet = self.settings.quiet_s
        while True:
            await asyncio.sleep(quiet / 4)
            waited = time.monotonic() - self._last_answer
            if self._in_flight and waited >= quiet:
                log(
                    f"no request to {self.settings.base_url} has finished in {waited:.0f} s; {self._in_flight} waiting. Each is "
                    f"abandoned after its deadline (up to {self.settings.timeout_s:.0f} s), and the work stops when none "
                    "finishes within one"
                )
                await asyncio.sleep(max(0.0, quiet - quiet / 4))

    @property
    def http(self) -> httpx.AsyncClient:
        if self._http is None:
            raise RuntimeError("use the client inside `async with InferenceClient(...) as client:`")
        return self._http

    async def check_server(self) -> list[str]:
        """Fail fast, before any work, when the server is down or serves another model.

        Returns the served model names. Raises `ServerUnreachable` naming the URL.
        """
        url = f"{self.settings.api_root}/models"
        try:
            response = await self.http.get(url, timeout=self.settings.connect_timeout_s + 20)
        except httpx.HTTPError as exc:
            raise ServerUnreachable(
                f"cannot reach the inference server at {url} ({_describe(exc)}). Start the server, "
                "or fix the URL (scheme, host and port) in the server settings."
            ) from None
        if response.status_code != 200:
            raise ServerUnreachable(
                f"{url} answered HTTP {response.status_code}: {response.text[:300]}. Is this an OpenAI-compatible server, and is the API key right?"
            )
        try:
            names = [m.get("id") for m in response.json().get("data", [])]
        except (ValueError, AttributeError, TypeError):
            raise ServerUnreachable(
                f"{url} answered without an OpenAI model list: {response.text[:300]}. Is this an OpenAI-compatible server?"
            ) from None
        if self.settings.model not in names:
            raise ServerUnreachable(
                f"{self.settings.base_url} serves {names}, not {self.settings.model!r}; set the model name to the server's --served-model-name."
            )
        return names

    async def chat(self, messages: list[dict], params: dict[str, Any]) -> Completion:
        """One chat completion; `params` are body fields (max_tokens, temperature, seed, ...)."""
        body = {"model": self.settings.model, "messages": messages, **params}
        return await self._post("chat/completions", body)

    async def complete(self, prompt: str, params: dict[str, Any]) -> Completion:
        """One raw completion of `prompt` (no chat template applied by the server)."""
        body = {"model": self.settings.model, "prompt": prompt, **params}
        return await self._post("completions", body)

    async def _post(self, endpoint: str, body: dict) -> Completion:
        url = f"{self.settings.api_root}/{endpoint}"
        s = self.settings
        deadline = s.deadline_s(body.get("max_tokens"))
        stalls = 0
        async with self._semaphore:
            self._in_flight += 1
            try:
                for attempt in range(1, s.max_retries + 2):
                    if self._stalled is not None:  # found stalled: no request waits on it any more
                        raise ServerStalled(self._stalled)
                    try:
                        return await self._attempt(url, body, attempt, deadline)
                    except RequestStalled as exc:
                        stalls += 1
                        if self._stalled is not None:
                            raise ServerStalled(self._stalled) from None
                        if time.monotonic() - self._last_answer >= deadline:
                            raise self._found_stalled(exc) from None
                        if stalls > 1 or attempt > s.max_retries:  # a stall costs a deadline: tried once more, no more
                            raise RetriesExhausted(url, attempt, exc) from None
                    except ServerFailure as exc:
                        if attempt > s.max_retries:
                            raise RetriesExhausted(url, attempt, exc) from None
                        await asyncio.sleep(retry_delay_s(attempt, s.backoff_s, s.backoff_max_s, exc.retry_after_s, s.retry_after_max_s, self._rng))
            finally:
                self._in_flight -= 1
        raise AssertionError("unreachable")

    def _found_stalled(self, exc: RequestStalled) -> ServerStalled:
        """The server finished nothing within a whole deadline: say so once, and end every other
        request waiting on it now (their deadlines are moved to this moment), not one deadline later."""
        s = self.settings
        self._stalled = (
            f"the server at {s.base_url} finished no request in {time.monotonic() - self._last_answer:.0f} s, though it takes "
            f"connections ({exc}): it is stalled or far slower than {s.min_tokens_per_s:g} tokens/s. See its log; restart it, "
            "or raise the requests' deadline (request_timeout_s, --timeout)"
        )
        now = asyncio.get_running_loop().time()
        for waiting in list(self._deadlines):
            if not waiting.expired():
                try:
                    waiting.reschedule(now)
                except RuntimeError:  # expiring already: it ends on its own
                    pass
        return ServerStalled(self._stalled)

    async def _attempt(self, url: str, body: dict, attempt: int, deadline: float) -> Completion:
        start = time.perf_counter()
        try:
            # The whole attempt, not each read: a server may send its headers and then stall.
            async with asyncio.timeout(deadline) as limit:
                self._deadlines.add(limit)
                try:
                    response = await self.http.post(url, json=body, timeout=httpx.Timeout(deadline, connect=self.settings.connect_timeout_s))
                finally:
                    self._deadlines.discard(limit)
        except (TimeoutError, httpx.TimeoutException) as exc:
            if isinstance(exc, httpx.ConnectTimeout):
                raise ServerFailure(f"{url}: {_describe(exc)}") from None
            raise RequestStalled(f"{url}: no answer within its deadline of {deadline:.0f} s") from None
        except httpx.HTTPError as exc:  # refused and dropped connections
            raise ServerFailure(f"{url}: {_describe(exc)}") from None
        latency = time.perf_counter() - start
        self._last_answer = time.monotonic()
        status = response.status_code
        if status >= 500 or status in RETRYABLE_4XX:
            raise ServerFailure(f"{url}: HTTP {status}: {response.text[:300]}", retry_after_s(response.headers.get("Retry-After")))
        if status >= 400:
            raise RequestRejected(url, status, response.text)
        try:
            payload = response.json()
            choice = payload["choices"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise InferenceError(
                f"{url} answered HTTP {status} without a choice: {response.text[:300]}; is this an OpenAI-compatible endpoint?"
            ) from None
        usage = payload.get("usage") or {}
        message = choice.get("message")
        if message is not None:  # chat
            content = message.get("content") or ""
            # vLLM >= 0.10 names the field `reasoning`; SGLang and older vLLM `reasoning_content`.
            reasoning = message.get("reasoning_content")
            if reasoning is None:
                reasoning = message.get("reasoning")
        else:  # raw completion
            content = choice.get("text") or ""
            reasoning = None
        return Completion(
            content=content,
            reasoning_content=reasoning,
            finish_reason=choice.get("finish_reason"),
            prompt_tokens=int(usage.get("prompt_tokens") or 0),
            completion_tokens=int(usage.get("completion_tokens") or 0),
            latency_s=latency,
            attempts=attempt,
        )
