"""The offline reference without the target: chain drafting replayed over the engine's own states.

The reference decoder (`reference_decoder.py`) runs the target in this process, in fp32: a
135M-parameter target fits, a 1T-parameter one does not. It does not have to. Verification is
greedy, so the target emits its greedy stream whatever the drafts, and the rounds of
speculative decoding are fixed by that stream: a round whose last committed slot is p drafts
K tokens from the drafter's state at p; its first `a` drafts equal the stream's next tokens, the
target adds one, and the next round is at p + a + 1. Everything a round needs is therefore

- the target's greedy stream: from its server (temperature 0, EOS ignored, as the served
  benchmark asks), K tokens past the output length so that the last round's drafts are judged
  as the reference decoder judges them (its verification looks past the output length too);
- the aux states the engine captured for prompt + stream: from an extraction server
  (`hidden_states/engine_extract.py`), the states the engine itself feeds the drafter.

The drafter's K steps run at every position at once (`drafter.ttt.unroll_steps`, training's
unroll, teacher-forced: a step's input token is the stream's, which is the draft before it
whenever the chain is still accepted), and the rounds are walked as the reference decoder walks
them. The counts equal the reference decoder's (the tests check it on SmolLM2) up to the
floating-point noise between two computations of the same states.

    results = replay_reference(drafter, prompt_ids, streams, states_of, output_len=128, k=3)
    AcceptanceNumbers.from_results(results, 3)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from eagle_assets.bench.reference_decoder import Result
from eagle_assets.drafter.model import Eagle3Drafter
from eagle_assets.drafter.ttt import unroll_steps


@torch.no_grad()
def draft_leads(drafter: Eagle3Drafter, aux: torch.Tensor, input_ids: torch.Tensor, k: int) -> list[int]:
    """Per row t of one sequence: how many of the K drafts from slot t equal the sequence's next
    tokens x_{t+2}, x_{t+3}, ... in a row (what a round at t would accept). aux (T, n_aux*Ht),
    input_ids (T,). A draft whose token lies past the sequence's end counts as wrong."""
    T = input_ids.shape[0]
    dtype = next(drafter.parameters()).dtype
    h_posts = unroll_steps(drafter, aux[None].to(dtype), input_ids[None].long(), k, attention="auto")  # K x (1, T, H)
    nxt = torch.cat([input_ids.long(), input_ids.new_full((k + 2,), -1).long()])  # x_{t} for t >= T is "none"
    correct = []
    for i, h in enumerate(h_posts):
        draft = drafter.draft_to_target(drafter.compute_logits(h[0]).argmax(-1))  # (T,) target ids
        correct.append(draft == nxt[2 + i : 2 + i + T])
    lead = torch.cumprod(torch.stack(correct).int(), dim=0).sum(0)  # (T,) accepted in a row from step 0
    return lead.tolist()


def replay_rounds(leads: Sequence[int], prompt_len: int, stream: Sequence[int], output_len: int, k: int) -> Result:
    """The reference decoder's rounds along a greedy `stream` (its first token is the prefill's).

    The round after `c` emitted tokens drafts from slot prompt_len + c - 2 (the last committed
    token sits at prompt_len + c - 1); rounds run while fewer than `output_len` are emitted."""
    if len(stream) < output_len + k:
        raise ValueError(f"the greedy stream holds {len(stream)} tokens; replaying {output_len} tokens at K={k} needs {output_len + k}")
    accepted, c = [], 1
    while c < output_len:
        a = int(leads[prompt_len + c - 2])
        accepted.append(a)
        c += a + 1
    return Result(tokens=list(stream[:output_len]), accepted_per_step=accepted, k=k)


def replay_reference(
    drafter: Eagle3Drafter,
    prompt_ids: Sequence[Sequence[int]],
    streams: Sequence[Sequence[int]],
    states_of: Callable[[list[int]], torch.Tensor],
    output_len: int,
    k: int,
    log: Callable[[str], None] = print,
) -> list[Result]:
    """The reference decoder's `Result` for each prompt, from the target's greedy `streams` and
    `states_of(token ids) -> (T, n_aux*Ht)`, the drafter's aux states for that sequence."""
    if k < 1:
        raise ValueError(f"k={k}: draft at least one token per step")
    results = []
    for i, (prompt, stream) in enumerate(zip(prompt_ids, streams), 1):
        ids = list(prompt) + list(stream[: output_len + k])
        aux = states_of(ids)
        if aux.shape[0] != len(ids):
            raise ValueError(f"prompt {i}: {aux.shape[0]} states for {len(ids)} tokens")
        leads = draft_leads(drafter, aux, torch.tensor(ids), k)
        result = replay_rounds(leads, len(prompt), stream, output_len, k)
        results.append(result)
        log(f"offline reference (replayed over the engine's states): prompt {i}/{len(prompt_ids)}: AL {result.al:.2f}")
    return results
