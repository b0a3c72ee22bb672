"""Continuous batching for a Llama-family target in this process: a fixed pool of decode slots.

`LocalGenerationClient` used to run one batched `generate` per group of requests, so every
group waited for its longest answer and decode re-concatenated a growing KV cache each step.
Here each slot holds one sequence in a preallocated KV cache; a finished sequence frees its
slot at once and the next request is prefilled into it while the others keep decoding. One
decode step is one forward over every slot:

    decoder = SlotDecoder(model, slots=512, max_len=1536)
    first = decoder.prefill([0, 1], [ids_a, ids_b], temperature=[0.0, 0.0], top_p=[1.0, 1.0])
    nxt = decoder.step()              # the next token of every slot (tokens of free slots are junk)
    decoder.release(0)

The math is the model's own (its norms, MLPs, rotary embedding and projections are called as
modules); only attention is written here, over the slot cache, with grouped-query heads
folded into the query length instead of repeating keys and values. Greedy output equals
`generate`'s token for token on the same dtype (eagle_assets_tests/test_bench_local_engine.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


def unsupported_reason(model) -> str | None:
    """Why `SlotDecoder` cannot run this model (None when it can)."""
    cfg = model.config
    if getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return f"model_type {getattr(cfg, 'model_type', None)!r} is not one of {', '.join(SUPPORTED_MODEL_TYPES)}"
    if getattr(cfg, "sliding_window", None) and getattr(cfg, "use_sliding_window", True):
        return "sliding-window attention is not implemented"
    attn = model.model.layers[0].self_attn
    if hasattr(attn, "q_norm") or hasattr(attn, "k_norm"):
        return "per-head q/k norms are not implemented"
    return None


class SlotDecoder:
    """Prefill and decode over `slots` sequences of at most `max_len` tokens each."""

    def __init__(self, model, *, slots: int, max_len: int, seed: int = 0, cuda_graphs: bool | None = None):
        """`cuda_graphs`: replay each decode step as a captured CUDA graph (CUDA only; None = on
        when the model is on CUDA). A step is a few hundred small kernels whose launches, not the
        GPU, bound it; a graph launches them all at once, for the same tokens
        (test_slot_decoder_graphs.py; benchmarks/slot_decoder_step.py times both, figures in
        benchmarks/results/slot_decoder_h200_2026-12-01.md). One graph
        per attention span (powers of two), captured on first use."""
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"SlotDecoder cannot run this model: {reason}; use batched `generate` instead")
        self.model = model
        cfg = model.config
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self.slots, self.max_len = slots, max_len
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.scale = self.head_dim**-0.5
        shape = (len(model.model.layers), slots, self.kv_heads, max_len, self.head_dim)
        self.keys = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.values = torch.zeros(shape, device=self.device, dtype=self.dtype)
        self.positions = torch.zeros(slots, dtype=torch.long, device=self.device)
        """Where each slot writes its next token's keys (= its sequence length so far)."""
        self.tokens = torch.zeros(slots, dtype=torch.long, device=self.device)
        """Each slot's last token: the input of the next step."""
        self.temperature = torch.zeros(slots, device=self.device)
        self.top_p = torch.ones(slots, device=self.device)
        self.live = torch.zeros(slots, dtype=torch.long, device=self.device)
        """1 for a slot holding a sequence: only those advance."""
        self.host_lengths = [0] * slots
        """Host copy of `positions`, so that a step needs no device sync to size its attention."""
        self.sampling_slots: set[int] = set()
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.cuda_graphs = self.device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if self.cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs needs the model on a CUDA device; it is on {self.device}")
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        """span -> (captured step, its logits output buffer)."""
        self._graph_pool = None

    # ---------------------------------------------------------------- the forward
    def _qkv(self, attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        b, t, _ = x.shape
        q = attn.q_proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)  # the model family's own (Llama's, shared by Mistral and Qwen2)
        return q, k, v

    def _layers(self, x: torch.Tensor, position_ids: torch.Tensor, attend) -> torch.Tensor:
        cos, sin = self.model.model.rotary_emb(x, position_ids)
        for i, layer in enumerate(self.model.model.layers):
            h = layer.input_layernorm(x)
            q, k, v = self._qkv(layer.self_attn, h, cos, sin)
            x = x + layer.self_attn.o_proj(attend(i, q, k, v))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.model.model.norm(x)

    def _sample(self, logits: torch.Tensor, slot_ids: Sequence[int] | None) -> torch.Tensor:
        greedy = logits.argmax(dim=-1)
        rows = range(self.slots) if slot_ids is None else slot_ids
        if not any(s in self.sampling_slots for s in rows):
            return greedy
        index = None if slot_ids is None else torch.tensor(list(slot_ids), device=self.device)
        temperature = self.temperature if index is None else self.temperature[index]
        top_p = self.top_p if index is None else self.top_p[index]
        probs = torch.softmax(logits.float() / temperature.clamp(min=1e-6)[:, None], dim=-1)
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Nucleus: keep the smallest prefix whose mass reaches top_p (the first token always).
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None]
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        pick = torch.multinomial(sorted_probs, 1, generator=self.generator).squeeze(1)
        sampled = order.gather(1, pick[:, None]).squeeze(1)
        return torch.where(temperature > 0, sampled, greedy)

    # ---------------------------------------------------------------- the interface
    @torch.inference_mode()
    def prefill(self, slot_ids: Sequence[int], prompts: Sequence[Sequence[int]], temperature: Sequence[float], top_p: Sequence[float]) -> list[int]:
        """Load prompts into free slots; returns each one's first generated token."""
        lengths = [len(p) for p in prompts]
        if min(lengths) < 1 or max(lengths) >= self.max_len:
            raise ValueError(f"prompt lengths {min(lengths)}..{max(lengths)} outside 1..{self.max_len - 1}")
        n, width = len(prompts), max(lengths)
        # Right padding: every prompt starts at position 0, and a causal mask keeps the padding
        # (which comes after the real tokens) out of every real token's attention.
        ids = torch.zeros((n, width), dtype=torch.long)
        for row, p in enumerate(prompts):
            ids[row, : len(p)] = torch.tensor(p)
        ids = ids.to(self.device)
        index = torch.tensor(list(slot_ids), device=self.device)
        groups = self.heads // self.kv_heads

        def attend(i: int, q, k, v):
            self.keys[i, index, :, :width] = k
            self.values[i, index, :, :width] = v
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
            return out.transpose(1, 2).reshape(n, width, self.heads * self.head_dim)

        positions = torch.arange(width, device=self.device).expand(n, width)
        hidden = self._layers(self.model.model.embed_tokens(ids), positions, attend)
        last = hidden[torch.arange(n, device=self.device), torch.tensor(lengths, device=self.device) - 1]
        self.temperature[index] = torch.tensor([float(t) for t in temperature], device=self.device)
        self.top_p[index] = torch.tensor([float(p) for p in top_p], device=self.device)
        for s, t in zip(slot_ids, temperature):
            (self.sampling_slots.add if t > 0 else self.sampling_slots.discard)(s)
        first = self._sample(self.model.lm_head(last), slot_ids)
        self.tokens[index] = first
        self.positions[index] = torch.tensor(lengths, device=self.device)
        self.live[index] = 1
        for s, length in zip(slot_ids, lengths):
            self.host_lengths[s] = length
        return first.tolist()

    @torch.inference_mode()
    def step(self) -> list[int]:
        """One decode step over every slot: feeds each slot's last token, returns the next ones."""
        longest = max(self.host_lengths) + 1
        if longest > self.max_len:
            raise ValueError(f"a slot reached max_len {self.max_len}; release it before stepping")
        # Attend over a power-of-two prefix of the cache: sized by the longest live slot, not max_len.
        span = min(self.max_len, 1 << (longest - 1).bit_length())
        logits = self._replay(span) if self.cuda_graphs else self._step_logits(span)
        nxt = self._sample(logits, None)
        self.tokens.copy_(nxt)
        self.positions += self.live
        self.host_lengths = [n + 1 if n else 0 for n in self.host_lengths]
        return nxt.tolist()

    def _step_logits(self, span: int) -> torch.Tensor:
        """The step's forward from `tokens` and `positions` to logits (slots, V), writing each
        slot's new keys and values: no host sync, so that it can be captured as a graph."""
        b, groups = self.slots, self.heads // self.kv_heads
        rows = torch.arange(b, device=self.device)
        visible = (torch.arange(span, device=self.device)[None, :] <= self.positions[:, None])[:, None, None, :]

        def attend(i: int, q, k, v):
            self.keys[i, rows, :, self.positions] = k[:, :, 0]
            self.values[i, rows, :, self.positions] = v[:, :, 0]
            # Grouped-query heads ride in the query-length axis: [b, kv_heads, groups, d] against
            # [b, kv_heads, span, d], so keys and values are read once, never repeated.
            q = q.view(b, self.kv_heads, groups, self.head_dim)
            out = F.scaled_dot_product_attention(q, self.keys[i, :, :, :span], self.values[i, :, :, :span], attn_mask=visible, scale=self.scale)
            return out.reshape(b, 1, self.heads * self.head_dim)

        hidden = self._layers(self.model.model.embed_tokens(self.tokens[:, None]), self.positions[:, None], attend)
        return self.model.lm_head(hidden[:, 0])

    def _replay(self, span: int) -> torch.Tensor:
        if span not in self._graphs:
            self._graphs[span] = self._capture(span)
        graph, logits = self._graphs[span]
        graph.replay()
        return logits

    def _capture(self, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        # Warm up on a side stream first (cuBLAS and attention pick kernels and workspaces
        # outside the capture, as torch.cuda.graphs requires). The warm-up writes the current
        # tokens' keys and values exactly as the replay that follows rewrites them: no change.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            self._step_logits(span)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # Graphs share one memory pool: they never run at once, and each keeps its output alive.
        with torch.cuda.graph(graph, pool=self._graph_pool):
            logits = self._step_logits(span)
        self._graph_pool = graph.pool()
        return graph, logits

    def release(self, slot: int) -> None:
        """Free a slot: it keeps stepping on junk until the next prefill, at the cost of no memory."""
        self.host_lengths[slot] = 0
        self.positions[slot] = 0
        self.live[slot] = 0
        self.sampling_slots.discard(slot)
