"""Async client for an OpenAI-compatible inference server (vLLM, SGLang), over httpx.

It sends chat and raw completion requests with bounded concurrency, a per-request timeout
and retries with exponential backoff and jitter on the failures that a retry can cure
(5xx, 408/429, timeouts, refused or dropped connections). Any other 4xx is the caller's
mistake and fails at once with the server's own message. The API key comes from the caller
and is sent as a bearer header; it never appears in a message, a log line or a repr.

    async with InferenceClient(ClientSettings("http://localhost:8000", "my-model")) as client:
        await client.check_server()
        result = await client.chat([{"role": "user", "content": "hi"}], {"max_tokens": 32})
        print(result.content, result.reasoning_content, result.completion_tokens)
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

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
    """Seconds one request may take (a long reasoning answer is slow; a hung server is not)."""
    connect_timeout_s: float = 10.0
    """Seconds to open a connection; a dead server fails fast and is retried."""
    max_retries: int = 4
    """Retries after the first attempt, for retryable failures only."""
    backoff_s: float = 1.0
    """First retry delay; doubles per retry, with full jitter in [delay/2, delay]."""
    backoff_max_s: float = 30.0
    """Cap on one retry delay."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"server URL {self.base_url!r} must start with http:// or https://")
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {self.max_retries}")

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

    def __init__(self, settings: ClientSettings, *, rng: random.Random | None = None):
        self.settings = settings
        self._rng = rng or random.Random()
        self._semaphore = asyncio.Semaphore(settings.concurrency)
        self._http: httpx.AsyncClient | None = None

    def __repr__(self) -> str:  # the settings' repr already hides the key
        return f"InferenceClient({self.settings!r})"

    async def __aenter__(self) -> "InferenceClient":
        s = self.settings
        headers = {"Authorization": f"Bearer {s.api_key}"} if s.api_key else {}
        self._http = httpx.AsyncClient(
            headers=headers,
            timeout=httpx.Timeout(s.timeout_s, connect=s.connect_timeout_s),
            # One connection per request in flight; keep-alive avoids a handshake per request.
            limits=httpx.Limits(max_connections=s.concurrency, max_keepalive_connections=s.concurrency),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

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
        names = [m.get("id") for m in response.json().get("data", [])]
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
        async with self._semaphore:
            for attempt in range(1, s.max_retries + 2):
                try:
                    return await self._attempt(url, body, attempt)
                except ServerFailure as exc:
                    if attempt > s.max_retries:
                        raise RetriesExhausted(url, attempt, exc) from None
                    delay = min(s.backoff_max_s, s.backoff_s * 2 ** (attempt - 1))
                    # Jitter spreads the retries of many requests that failed together.
                    await asyncio.sleep(delay * self._rng.uniform(0.5, 1.0))
        raise AssertionError("unreachable")

    async def _attempt(self, url: str, body: dict, attempt: int) -> Completion:
        start = time.perf_counter()
        try:
            response = await self.http.post(url, json=body)
        except httpx.HTTPError as exc:  # timeouts, refused and dropped connections
            raise ServerFailure(f"{url}: {_describe(exc)}") from None
        latency = time.perf_counter() - start
        status = response.status_code
        if status >= 500 or status in RETRYABLE_4XX:
            raise ServerFailure(f"{url}: HTTP {status}: {response.text[:300]}")
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
