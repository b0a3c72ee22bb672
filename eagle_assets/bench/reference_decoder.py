"""Reference EAGLE-3 speculative decoder in PyTorch, with vLLM's proposer semantics.

The offline half of the benchmark: it says what acceptance a drafter earns when the engine
does exactly what docs/eagle3-semantics.md sections 2-3 describe, so that a low served acceptance
can be blamed on the drafter or on the engine wiring. Greedy verification makes its output
equal, token for token, to the target's plain greedy decoding.

One round, with context x_0..x_{n-1} in the target's KV cache and x_n just emitted:

1. Drafter first pass over the round's pending slots: slot s pairs g_s = fc(A_s) (aux states
   of the target pass that verified x_s) with E[x_{s+1}] at rotary position s, writing the
   drafter's KV at s. The last slot p = n-1 gives draft d_1 (its argmax, mapped through d2t).
2. Steps 2..K: token d_{j-1}, hidden = previous step's h_pre, position p + j - 1, attending to
   the drafter KV at <= p plus the earlier steps' own entries.
3. The target verifies [x_n, d_1..d_K] at positions n..n+K; greedy: d_j is accepted while it
   equals the target's argmax after d_{j-1}; the target's next argmax is the bonus token.
4. The accepted slots n..n+a become the next round's pending slots (their aux from this
   verification pass); the drafter KV written by steps 2..K is overwritten there.

A parallel-drafting drafter (`ptd_token_id` set; vLLM's `parallel_drafting`) replaces step 2's
chain: K-1 mask slots (the mask token, fc(mask_hidden)) at positions p+1..p+K-1 ride in one
more forward, each attending to the drafter KV at <= p and the mask slots before it, and give
d_2..d_K at once. (vLLM runs them in the first pass's forward; attention makes it the same.)

Metrics (docs/design.md): AL = 1 + accepted / drafts; p_k = drafts whose k-th token was accepted / drafts.
`eagle-assets bench --offline-reference hf` runs it on a drafter folder beside the served benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from eagle_assets.drafter.model import Eagle3Drafter


@dataclass
class Result:
    """What one speculative generation produced and how its drafts fared."""

    tokens: list[int]
    """Generated token ids (prompt excluded), cut at max_new_tokens or after the first EOS."""
    accepted_per_step: list[int]
    """Accepted draft tokens of each verification step (0..k each)."""
    k: int
    """Draft tokens proposed per verification step."""
    num_drafts: int = 0
    """Verification steps that carried drafts."""
    al: float = 0.0
    """Acceptance length: 1 + accepted / drafts."""
    per_position_acceptance: list[float] = field(default_factory=list)
    """p_k for k = 1..K: fraction of drafts whose k-th token was accepted."""
    drafts: list[list[int]] = field(default_factory=list)
    """The k target ids proposed at each verification step (for tracing a drafter's choices)."""
    answer_end: int | None = None
    """Index in `tokens` of the target's first end-of-answer token when generation ran past it
    (EOS ignored, as the served benchmark does); None when the answer filled the output."""

    def __post_init__(self) -> None:
        self.num_drafts = len(self.accepted_per_step)
        n = max(self.num_drafts, 1)
        self.al = 1.0 + sum(self.accepted_per_step) / n
        self.per_position_acceptance = [sum(a >= j for a in self.accepted_per_step) / n for j in range(1, self.k + 1)]

    def steps_split_at(self, index: int) -> tuple[list[int], list[int]]:
        """Accepted drafts per step, split into steps drafting at or before output token `index`
        and steps drafting after it (e.g. after the target's end-of-answer token when EOS is
        ignored). Step i drafts from output index 1 + sum_{j<i}(accepted_j + 1): the first
        output token comes from the prefill."""
        before, after, start = [], [], 1
        for a in self.accepted_per_step:
            (before if start <= index else after).append(a)
            start += a + 1
        return before, after

    @property
    def draft_acceptance_rate(self) -> float:
        """accepted / drafted tokens (vLLM's "avg draft acceptance rate")."""
        return sum(self.accepted_per_step) / max(self.num_drafts * self.k, 1)


class TargetRunner:
    """A Hugging Face causal LM with a KV cache that returns logits and the EAGLE-3 aux states.

    Aux id k < L is `output_hidden_states[k]` (the residual stream, un-normed); id L (the last
    layer's output, which HF returns normed) is taken at the final norm's input.
    """

    def __init__(self, model, aux_layer_ids: tuple[int, ...]) -> None:
        from transformers import DynamicCache

        self.model = model
        self.aux_layer_ids = tuple(sorted(aux_layer_ids))
        self.num_layers = int(model.config.get_text_config().num_hidden_layers)
        if max(self.aux_layer_ids) > self.num_layers or min(self.aux_layer_ids) < 0:
            raise ValueError(f"aux ids {self.aux_layer_ids} out of range for a target with {self.num_layers} layers")
        self.cache = DynamicCache(config=model.config)
        self._pre_norm: torch.Tensor | None = None
        self._hook = None
        if self.num_layers in self.aux_layer_ids:
            norm = model.get_decoder().norm
            self._hook = norm.register_forward_pre_hook(lambda _m, args: setattr(self, "_pre_norm", args[0]))

    def close(self) -> None:
        if self._hook is not None:
            self._hook.remove()

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """ids (1, T) continuing the cached context -> (logits (1, T, V), aux (1, T, n_aux * H))."""
        out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True, output_hidden_states=True)
        states = [self._pre_norm if k == self.num_layers else out.hidden_states[k] for k in self.aux_layer_ids]
        return out.logits, torch.cat(states, dim=-1)

    def crop(self, length: int) -> None:
        """Forget cached positions >= length (rejected drafts)."""
        drop = self.length - length
        if drop > 0:
            self.cache.crop(-drop)  # a negative count removes that many trailing positions


@torch.no_grad()
def speculative_generate(
    target,
    drafter: Eagle3Drafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    k: int,
    eos_token_id: int | list[int] | None = None,
) -> Result:
    """Greedy speculative decoding of `input_ids` (1, n) with chain drafts of `k` tokens.

    target: a transformers causal LM (its dtype and device are used as they are); drafter: an
    `Eagle3Drafter` whose aux ids name the target's layers and whose embedding is the target's.
    """
    if input_ids.ndim != 2 or input_ids.shape[0] != 1:
        raise ValueError(f"input_ids must be (1, n); got {tuple(input_ids.shape)} (one prompt at a time)")
    if k < 1:
        raise ValueError(f"k={k}: draft at least one token per step")
    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    device = next(target.parameters()).device
    ids = input_ids.to(device)
    runner = TargetRunner(target, drafter.config.aux_layer_ids)
    dparam = next(drafter.parameters())
    n = ids.shape[1]
    dcache = drafter.new_kv_cache(1, n + max_new_tokens + k + 2)
    try:
        logits, aux = runner.forward(ids)  # prefill
        bonus = int(logits[0, -1].argmax())
        tokens = [bonus]
        accepted: list[int] = []
        proposed: list[list[int]] = []
        # Pending drafter slots: positions 0..n-1, token of slot s = x_{s+1}.
        slot_aux = aux
        slot_tokens = torch.cat([ids[:, 1:], torch.tensor([[bonus]], device=device)], dim=1)
        slot_start = 0
        while len(tokens) < max_new_tokens and bonus not in eos:
            drafts = _propose(drafter, dcache, slot_aux.to(dparam.dtype), slot_tokens, slot_start, k)
            proposed.append(drafts)
            verify = torch.tensor([[bonus] + drafts], device=device)  # (1, k+1) at positions n..n+k
            ctx = runner.length
            logits, aux = runner.forward(verify)
            best = logits[0].argmax(-1).tolist()  # best[j]: target's token after verify[j]
            a = 0
            while a < k and drafts[a] == best[a]:
                a += 1
            accepted.append(a)
            new = drafts[:a] + [best[a]]
            runner.crop(ctx + a + 1)  # keep x_n and the accepted drafts
            slot_aux = aux[:, : a + 1]
            slot_tokens = torch.tensor([new], device=device)  # slot ctx+j holds x_{ctx+j+1}
            slot_start = ctx
            tokens.extend(new)
            bonus = new[-1]
            if eos & set(new):
                break
    finally:
        runner.close()
    tokens = tokens[:max_new_tokens]
    for i, t in enumerate(tokens):
        if t in eos:
            tokens = tokens[: i + 1]
            break
    return Result(tokens=tokens, accepted_per_step=accepted, k=k, drafts=proposed)


def _propose(drafter: Eagle3Drafter, dcache, slot_aux: torch.Tensor, slot_tokens: torch.Tensor, start: int, k: int) -> list[int]:
    """Chain-draft k target ids from the pending slots at positions start..start+T-1."""
    T = slot_tokens.shape[1]
    positions = torch.arange(start, start + T, device=slot_tokens.device)[None]  # (1, T)
    g = drafter.project_hidden_states(slot_aux)  # (1, T, H)
    h_pre, h_post = drafter(g, slot_tokens, positions, kv_cache=dcache)
    hidden, p = h_pre[:, -1:], start + T - 1
    draft = drafter.draft_to_target(drafter.compute_logits(h_post[:, -1]).argmax(-1))  # (1,)
    drafts = [int(draft)]
    if drafter.config.ptd_token_id is not None and k > 1:
        # Parallel drafting: drafts 2..k from k-1 mask slots at p+1..p+k-1 in the same round,
        # each attending to the context and the mask slots before it; no draft is fed back.
        g_mask, mask_ids = drafter.mask_slots(1, k - 1)
        pos = torch.arange(p + 1, p + k, device=slot_tokens.device)[None]
        _, h_post = drafter(g_mask.to(g.dtype), mask_ids, pos, kv_cache=dcache)
        drafts += drafter.draft_to_target(drafter.compute_logits(h_post[0]).argmax(-1)).tolist()
        return drafts
    for j in range(1, k):
        pos = torch.tensor([[p + j]], device=slot_tokens.device)
        hidden, h_post = drafter(hidden, draft[:, None], pos, kv_cache=dcache)
        draft = drafter.draft_to_target(drafter.compute_logits(h_post[:, -1]).argmax(-1))
        drafts.append(int(draft))
    return drafts


@torch.no_grad()
def greedy_generate(target, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id=None) -> list[int]:
    """Plain greedy decoding with a KV cache, one token per step (the equality reference)."""
    from transformers import DynamicCache

    eos = set([eos_token_id] if isinstance(eos_token_id, int) else (eos_token_id or []))
    cache = DynamicCache(config=target.config)
    ids = input_ids.to(next(target.parameters()).device)
    out = []
    for _ in range(max_new_tokens):
        logits = target(input_ids=ids, past_key_values=cache, use_cache=True).logits
        nxt = int(logits[0, -1].argmax())
        out.append(nxt)
        if nxt in eos:
            break
        ids = torch.tensor([[nxt]], device=ids.device)
    return out
