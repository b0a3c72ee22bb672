"""Does the engine write what the target writes? Greedy output with and without speculation.

Greedy verification makes speculative decoding emit exactly the target's greedy tokens: a
drafter can only make it faster. In floating point the engine computes the target's logits in
different kernels when it decodes one token and when it verifies K+1 (for MLA targets, two
different attention paths: absorbed decode, non-absorbed verification), so where the target's
two best tokens are nearly tied the two paths may pick different ones, and the streams part
there. That is rounding, not a defect. Anywhere else, a departure means the engine verifies
against something other than the target: a defect, named as one.

`greedy_tokens` asks a server for a prompt's greedy continuation with its token ids;
`first_divergence` finds where two streams part; `top2_margin` asks the target (through a
server's plain prefill of the common prefix) for the logit margin between its two best tokens
there; `judge` calls each departure a near tie or a defect against `NEAR_TIE_MARGIN`.

    plain_ids, plain = greedy_tokens(base, model, messages, 64)
    _, spec = greedy_tokens(spec_base, model, messages, 64)
    d = first_divergence(plain, spec)
    if d is not None:
        margin = top2_margin(spec_base, model, plain_ids + plain[:d])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import httpx

from eagle_assets.bench.served import ServedRequestError, request_deadline_s
from eagle_assets.http_client import client

NEAR_TIE_MARGIN = {"float32": 1e-3, "bfloat16": 0.25, "float16": 0.05}
"""Largest top-2 logit margin (nats) that the engine's two paths may flip, by the dtype it serves in.

The two paths differ by the rounding of different summation orders. In fp32 that moves a
logit by about 1e-5 of its size (logits here are tens of nats: a few 1e-4); 1e-3 is several
times that. bf16 keeps 8 bits of mantissa, so a logit of ~30 moves by ~0.1 between kernels;
0.25 leaves room for that. A margin above the threshold is a decision no rounding flips."""


@dataclass(frozen=True)
class Divergence:
    """Where a speculative stream departs from the plain greedy one, and the target's margin there."""

    prompt: int
    """Index of the prompt."""
    index: int
    """Output index of the first differing token."""
    plain_token: int
    spec_token: int
    margin: float | None
    """The target's top-2 logit margin at that position (None when it could not be read)."""
    near_tie: bool
    """True when the margin is within the threshold: rounding, not a defect."""


@dataclass(frozen=True)
class GreedyCheck:
    """Plain greedy against greedy under speculation, on the same prompts."""

    prompts: int
    tokens_per_prompt: int
    threshold: float
    served_dtype: str
    divergences: list[Divergence] = field(default_factory=list)

    @property
    def equal(self) -> int:
        return self.prompts - len(self.divergences)

    @property
    def defects(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.near_tie]

    @property
    def verdict(self) -> str:
        """ "equal", "near_ties" (every departure at a near tie) or "defect"."""
        if self.defects:
            return "defect"
        return "near_ties" if self.divergences else "equal"

    def sentence(self) -> str:
        head = f"Served greedy output under speculation equals plain greedy on {self.equal} of {self.prompts} prompts ({self.tokens_per_prompt} tokens each)"
        if not self.divergences:
            return head + "."
        parts = [
            f"prompt {d.prompt} at token {d.index} (margin {d.margin:.2e})"
            if d.margin is not None
            else f"prompt {d.prompt} at token {d.index} (margin unknown)"
            for d in self.divergences
        ]
        if self.defects:
            return (
                f"{head}; DEFECT: the engine departs from the target's greedy choice where the target is not near a tie "
                f"(margin above {self.threshold:g} nats in {self.served_dtype}): {'; '.join(parts)}. The engine verifies "
                "against something other than the target: check the engine's attention path for this architecture."
            )
        return (
            f"{head}; the others part at near ties of the target (top-2 logit margin at most {self.threshold:g} nats in "
            f"{self.served_dtype}, which the engine's two computations of the logits may flip): {'; '.join(parts)}."
        )

    def to_dict(self) -> dict:
        return {
            "prompts": self.prompts,
            "tokens_per_prompt": self.tokens_per_prompt,
            "threshold": self.threshold,
            "served_dtype": self.served_dtype,
            "equal": self.equal,
            "verdict": self.verdict,
            "sentence": self.sentence(),
            "divergences": [asdict(d) for d in self.divergences],
        }

    @classmethod
    def from_dict(cls, d: Mapping) -> "GreedyCheck":
        return cls(d["prompts"], d["tokens_per_prompt"], d["threshold"], d["served_dtype"], [Divergence(**x) for x in d["divergences"]])


def _client(api_key: str | None, timeout_s: float) -> httpx.Client:
    return client(api_key, timeout_s)


def _post(base_url: str, endpoint: str, body: dict, api_key: str | None, stall_s: float) -> httpx.Response:
    """One request, not streamed, within its deadline (`served.request_deadline_s`); a server
    that does not answer in time is a `ServedRequestError` naming it."""
    deadline = request_deadline_s(stall_s, body["max_tokens"])
    try:
        with _client(api_key, deadline) as http:
            return http.post(f"{base_url.rstrip('/')}/v1/{endpoint}", json=body)
    except httpx.TimeoutException as exc:
        raise ServedRequestError(
            f"the server at {base_url} did not answer a {body['max_tokens']}-token request within its "
            f"deadline of {deadline:.0f} s ({type(exc).__name__}): it takes requests but makes no progress",
            base_url,
        ) from None


def greedy_tokens(
    base_url: str, model: str, messages: Sequence[Mapping], n: int, api_key: str | None = None, stall_s: float = 180.0
) -> tuple[list[int], list[int]]:
    """(prompt token ids, the first `n` greedy output token ids) of a chat prompt, EOS ignored, as
    the served benchmark asks; the ids are the server's own (its chat template, its tokenizer)."""
    body = {
        "model": model,
        "messages": list(messages),
        "max_tokens": n,
        "min_tokens": n,
        "temperature": 0.0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    resp = _post(base_url, "chat/completions", body, api_key, stall_s)
    if resp.status_code != 200:
        raise RuntimeError(f"the server at {base_url} answered {resp.status_code} to a greedy request: {resp.text[:300]}")
    out = resp.json()
    prompt_ids, tokens = out.get("prompt_token_ids"), out["choices"][0].get("token_ids")
    if prompt_ids is None or tokens is None:
        raise RuntimeError(f"the server at {base_url} returned no token ids (`return_token_ids`): it is not a vLLM of 0.11 or later")
    return list(prompt_ids), list(tokens)


def top2_margin(base_url: str, model: str, ids: Sequence[int], api_key: str | None = None, stall_s: float = 180.0) -> float:
    """The target's logit margin between its two most likely next tokens after `ids`, read from a
    one-token completion's top-2 log-probabilities (a log-softmax keeps logit differences)."""
    body = {"model": model, "prompt": list(ids), "max_tokens": 1, "temperature": 0.0, "logprobs": 2}
    resp = _post(base_url, "completions", body, api_key, stall_s)
    if resp.status_code != 200:
        raise RuntimeError(f"the server at {base_url} answered {resp.status_code} to a log-probability request: {resp.text[:300]}")
    top = resp.json()["choices"][0]["logprobs"]["top_logprobs"][0]
    best = sorted(top.values(), reverse=True)
    if len(best) < 2:
        raise RuntimeError(f"the server at {base_url} returned {len(best)} top log-probabilities, not 2")
    return float(best[0] - best[1])


def first_divergence(plain: Sequence[int], spec: Sequence[int]) -> int | None:
    """The first index where the two streams differ (over their common length), or None."""
    return next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)


def judge(margin: float | None, threshold: float) -> bool:
    """Near tie: a margin within the threshold. An unknown margin is not called a near tie."""
    return margin is not None and margin <= threshold


def check_against(
    plain: Sequence[tuple[list[int], list[int]]],
    spec_base_url: str,
    model: str,
    prompts: Sequence[Sequence[Mapping]],
    n: int,
    served_dtype: str,
    api_key: str | None = None,
    stall_s: float = 180.0,
) -> GreedyCheck:
    """Greedy under speculation from `spec_base_url` against the plain streams `plain` ((prompt
    ids, tokens) per prompt, at least `n` tokens each), the margins read from the same server."""
    threshold = NEAR_TIE_MARGIN.get(served_dtype, NEAR_TIE_MARGIN["bfloat16"])
    divergences = []
    for i, (messages, (prompt_ids, plain_tokens)) in enumerate(zip(prompts, plain)):
        spec_prompt, spec_tokens = greedy_tokens(spec_base_url, model, messages, n, api_key, stall_s)
        if spec_prompt != prompt_ids:
            raise RuntimeError(f"prompt {i}: the two servers tokenised the prompt differently: they serve different targets")
        d = first_divergence(plain_tokens[:n], spec_tokens)
        if d is None:
            continue
        margin = top2_margin(spec_base_url, model, prompt_ids + plain_tokens[:d], api_key, stall_s)
        divergences.append(Divergence(i, d, plain_tokens[d], spec_tokens[d], margin, judge(margin, threshold)))
    return GreedyCheck(len(prompts), n, threshold, served_dtype, divergences)
