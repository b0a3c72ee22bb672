"""The EAGLE-3 drafter: exactly the function vLLM 0.32's `llama_eagle3.py` serves.

One step, for a slot at position p that pairs a hidden state h (g_p = fc(A_p) at the first
draft step, the previous step's pre-norm output afterwards) with the embedding of the next
token x_{p+1} (docs/eagle3-semantics.md sections 2-3):

    e = input_layernorm(E[x_{p+1}])           u = hidden_norm(h)         res = h
    a = o_proj(Attn([e ; u], rotary position p))          # keys: this drafter's KV at <= p
    s = a + res                                # fp32 add, as vLLM's fused add + RMSNorm
    h_pre = s + MLP(post_attention_layernorm(s))
    h_post = norm(h_pre)                       logits = lm_head(h_post)  (draft vocab)
    target_id = draft_id + d2t[draft_id]

A drafter of more layers (vLLM only) runs each later layer as a plain Llama layer on the
running stream h (the previous layer's h_pre): its attention reads input_layernorm(h), H wide,
its residual is h, and its post-attention half is layer 0's; `h_pre` is the last layer's.

`h_pre` is what the engines feed back to the next step; `h_post` makes the logits. Parameter
names are those of a vLLM drafter checkpoint (`fc.weight`, `layers.0.self_attn.q_proj.weight`,
...), so export is a save without renaming; `embed_tokens` is the target's, frozen, and left out
of exports. There are no biases anywhere.

The seam (as SpecForge's): `project_hidden_states`, `embed_input_ids`, `forward`,
`compute_logits`, `draft_to_target`. `forward` runs causal attention over the call's own
tokens, or over an explicit `DrafterKVCache` (the reference decoder's incremental path).
Training-time test (several steps with diagonal attention) lives in `drafter/ttt.py` and uses
the layer's `attention_inputs` / `finish` halves so that both paths share one definition.

    >>> from eagle_assets.drafter.config import tiny_config
    >>> model = Eagle3Drafter(tiny_config())
    >>> g = model.project_hidden_states(torch.randn(1, 5, 3 * 64))      # (1, 5, 64)
    >>> h_pre, h_post = model(g, torch.randint(0, 256, (1, 5)))
    >>> model.compute_logits(h_post).shape
    torch.Size([1, 5, 64])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from eagle_assets.drafter import fusion
from eagle_assets.drafter.config import DrafterConfig
from eagle_assets.drafter.fusion import apply_rotary


class _RMSNormFunction(torch.autograd.Function):
    """RMSNorm of (x + residual) with statistics in fp32; saves only the sum (input dtype) and 1/rms.

    Plain autograd of the same formula keeps two or three fp32 copies of every normed tensor
    alive until the backward; over a TTT unroll of 7 steps at 4096 tokens that is gigabytes.
    The math is `fusion.rms_norm_forward` / `rms_norm_backward` (one kernel each on CUDA).
    """

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        # x, residual (..., H) (residual may be None); weight (H,) -> (y, s) with s = x + residual
        y, s, rstd = fusion.rms_norm_forward(x, residual, weight, eps)
        ctx.save_for_backward(s, weight, rstd)
        ctx.residual_dtype = None if residual is None else residual.dtype
        return (y, None) if residual is None else (y, s)

    @staticmethod
    def backward(ctx, dy, ds):
        s, weight, rstd = ctx.saved_tensors
        dx, dres, dweight = fusion.rms_norm_backward(s, weight, rstd, dy, ds, ctx.residual_dtype, ctx.needs_input_grad[2])
        return dx, dres, dweight, None


class RMSNorm(nn.Module):
    """RMSNorm as vLLM and HF compute it: statistics in fp32, scale applied in the input dtype."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RMSNormFunction.apply(x, None, self.weight, self.eps)[0]

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """vLLM's fused add + RMSNorm: s = x + residual in fp32; returns (norm(s), s in x's dtype)."""
        return _RMSNormFunction.apply(x, residual, self.weight, self.eps)


class _SiluMulFunction(torch.autograd.Function):
    """silu(gate) * up, computed in fp32 and rounded once; saves gate and up only."""

    @staticmethod
    def forward(ctx, gate, up):
        ctx.save_for_backward(gate, up)
        return fusion.silu_mul_forward(gate, up)

    @staticmethod
    def backward(ctx, dy):
        gate, up = ctx.saved_tensors
        return fusion.silu_mul_backward(gate, up, dy)


class RotaryEmbedding(nn.Module):
    """Llama (neox-style) RoPE with the default, linear or llama3 frequency schedule."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.head_dim = config.head_dim
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)  # (D/2,)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin for `positions` (...,) long -> each (..., D) fp32."""
        freqs = positions.float()[..., None] * self.inv_freq.float()  # (..., D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (..., D)
        return emb.cos(), emb.sin()


def rope_inv_freq(config: DrafterConfig) -> torch.Tensor:
    """Inverse frequencies (D/2,) fp32, as vLLM's `get_rope` builds them for this config."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    scaling = config.rope_scaling or {}
    kind = config.rope_type
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        orig = float(scaling["original_max_position_embeddings"])
        wave_len = 2 * math.pi / inv_freq
        smooth = (orig / wave_len - low) / (high - low) if low != high else torch.zeros_like(inv_freq)
        inv_freq = torch.where(
            wave_len < orig / high,
            inv_freq,
            torch.where(wave_len > orig / low, inv_freq / factor, (1 - smooth) * inv_freq / factor + smooth * inv_freq),
        )
    return inv_freq


class Eagle3Attention(nn.Module):
    """q/k/v take layer 0's 2H-wide [embedding ; hidden] input (H-wide in later layers); o_proj returns to H. No biases."""

    def __init__(self, config: DrafterConfig, input_size: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.head_dim**-0.5
        self.q_proj = nn.Linear(input_size, config.q_size, bias=False)
        self.k_proj = nn.Linear(input_size, config.kv_size, bias=False)
        self.v_proj = nn.Linear(input_size, config.kv_size, bias=False)
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=False)


class Eagle3MLP(nn.Module):
    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(_SiluMulFunction.apply(self.gate_proj(x), self.up_proj(x)))


class Eagle3DecoderLayer(nn.Module):
    """vLLM's EAGLE-3 layer `index`, split at the attention so that TTT can supply its own attention."""

    def __init__(self, config: DrafterConfig, index: int = 0) -> None:
        super().__init__()
        self.index = index
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # Only layer 0 norms the hidden half (vLLM builds the norm in later layers too, unused).
        self.hidden_norm = RMSNorm(config.hidden_size, config.rms_norm_eps) if index == 0 else None
        self.self_attn = Eagle3Attention(config, (2 if index == 0 else 1) * config.hidden_size)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = Eagle3MLP(config)

    def attention_input(self, embeds: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        """The attention's input: [input_layernorm(embeds) ; hidden_norm(hidden)] (B, T, 2H) in
        layer 0, input_layernorm(hidden) (B, T, H) in later layers (embeds unused there)."""
        if self.index > 0:
            return self.input_layernorm(hidden)
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)  # embedding first

    def attention_inputs(
        self, embeds: torch.Tensor | None, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated q (B, nh, T, D), k (B, nkv, T, D) and v (B, nkv, T, D) for one slot per token.

        embeds: (B, T, H) token embeddings E[x_{p+1}] (layer 0 only); hidden: (B, T, H) the
        layer's input stream (g_p or fed-back h_pre in layer 0, the previous layer's h_pre after).
        """
        attn = self.self_attn
        B, T, _ = hidden.shape
        z = self.attention_input(embeds, hidden)
        q = attn.q_proj(z).view(B, T, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B, nh, T, D)
        k = attn.k_proj(z).view(B, T, attn.num_kv_heads, attn.head_dim).transpose(1, 2)  # (B, nkv, T, D)
        v = attn.v_proj(z).view(B, T, attn.num_kv_heads, attn.head_dim).transpose(1, 2)  # (B, nkv, T, D)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, attn_out: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attn_out (B, T, nh*D) before o_proj, residual (B, T, H) = the layer's input hidden -> h_pre (B, T, H)."""
        a = self.self_attn.o_proj(attn_out)  # (B, T, H)
        m_in, s = self.post_attention_layernorm.add_forward(a, residual)  # s = a + res (fp32 add)
        return fusion.add_in_fp32(self.mlp(m_in), s)  # h_pre = MLP + s, fp32 add as vLLM's final fused norm


@dataclass
class DrafterKVCache:
    """The drafter's own KV cache, indexed by absolute position (as the engine's block table).

    Entries at positions <= p are written by the first pass of each round from (g_s, E[x_{s+1}]);
    later draft steps write at p+1, p+2, ... and are overwritten by the next round's first pass.
    A query at position q attends to every written entry at a position <= q.
    """

    k: torch.Tensor  # (B, nkv, L, D), rotated keys
    v: torch.Tensor  # (B, nkv, L, D)
    written: torch.Tensor  # (B, L) bool

    @classmethod
    def empty(cls, config: DrafterConfig, batch: int, max_len: int, device=None, dtype=torch.float32) -> "DrafterKVCache":
        shape = (batch, config.num_key_value_heads, max_len, config.head_dim)
        return cls(
            k=torch.zeros(shape, device=device, dtype=dtype),
            v=torch.zeros(shape, device=device, dtype=dtype),
            written=torch.zeros(batch, max_len, dtype=torch.bool, device=device),
        )

    @property
    def max_len(self) -> int:
        return self.k.shape[2]

    def write(self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """positions (B, T) long; k, v (B, nkv, T, D): store each token's key/value at its position."""
        if int(positions.max()) >= self.max_len:
            raise ValueError(f"position {int(positions.max())} beyond the KV cache length {self.max_len}; allocate a longer cache")
        b = torch.arange(positions.shape[0], device=positions.device)[:, None]  # (B, 1)
        self.k[b, :, positions] = k.transpose(1, 2).to(self.k.dtype)  # index (B, T) -> (B, T, nkv, D)
        self.v[b, :, positions] = v.transpose(1, 2).to(self.v.dtype)
        self.written[b, positions] = True

    def mask(self, positions: torch.Tensor) -> torch.Tensor:
        """(B, 1, T, L) bool: query at position q may see written keys at positions <= q."""
        key_pos = torch.arange(self.max_len, device=positions.device)  # (L,)
        allowed = key_pos[None, None, :] <= positions[:, :, None]  # (B, T, L)
        return (allowed & self.written[:, None, :])[:, None]


class Eagle3Drafter(nn.Module):
    """Llama EAGLE-3 drafter with vLLM checkpoint names (see the module docstring)."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_tokens.weight.requires_grad_(False)  # the target's; frozen and never exported
        self.fc = nn.Linear(config.fc_in_features, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([Eagle3DecoderLayer(config, i) for i in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.draft_vocab_size, bias=False)
        if config.ptd_token_id is not None:
            # Parallel drafting's mask slots read fc(mask_hidden) as their hidden state: a
            # learned stand-in for the aux states, as wide as fc's input (vLLM's `mask_hidden`).
            self.mask_hidden = nn.Parameter(torch.zeros(config.fc_in_features))
        self.rotary = RotaryEmbedding(config)
        # d2t: target_id = draft_id + d2t[draft_id]; t2d: True where a target id is drafted.
        # Identity mapping until `set_vocab_mapping` (correct only when N == V).
        self.register_buffer("d2t", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[: config.draft_vocab_size] = True
        self.register_buffer("t2d", t2d)
        self.reset_parameters()

    @property
    def layer(self) -> Eagle3DecoderLayer:
        """Layer 0, the one that reads the token embedding."""
        return self.layers[0]

    def reset_parameters(self, std: float = 0.02) -> None:
        """HF Llama initialisation: normal(0, std) linears, unit norms. The embedding is left alone."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=std)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)
        if self.config.ptd_token_id is not None:
            nn.init.normal_(self.mask_hidden, std=1.0)  # fc then hidden_norm rescale it; zero would sit on the norm's pole

    # ------------------------------------------------------------------ vocab and embedding
    @torch.no_grad()
    def set_vocab_mapping(self, d2t: torch.Tensor, t2d: torch.Tensor) -> None:
        """Install the draft vocabulary; refuses a mapping that does not fit this drafter."""
        check_vocab_mapping(d2t, t2d, self.config.draft_vocab_size, self.config.vocab_size)
        self.d2t.copy_(d2t.to(torch.long))
        self.t2d.copy_(t2d.to(torch.bool))

    @torch.no_grad()
    def load_target_embedding(self, embedding: torch.Tensor) -> None:
        """Copy the target's input embedding (V, H) into the frozen `embed_tokens`."""
        want = tuple(self.embed_tokens.weight.shape)
        if tuple(embedding.shape) != want:
            raise ValueError(
                f"target embedding has shape {tuple(embedding.shape)}, the drafter expects {want} "
                "(vocab_size, hidden_size): the drafter config does not match this target"
            )
        self.embed_tokens.weight.copy_(embedding)

    def draft_to_target(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Target token ids of draft ids (any shape): draft_id + d2t[draft_id]."""
        return draft_ids + self.d2t[draft_ids]

    # ------------------------------------------------------------------ the seam
    def project_hidden_states(self, aux: torch.Tensor) -> torch.Tensor:
        """aux (B, T, n_aux * Ht), captured states in ascending layer order -> g (B, T, H)."""
        if aux.shape[-1] != self.config.fc_in_features:
            raise ValueError(
                f"aux states are {aux.shape[-1]} wide, fc expects {self.config.num_aux} x "
                f"{self.config.target_hidden_size} = {self.config.fc_in_features} (aux ids {self.config.aux_layer_ids})"
            )
        if not torch.is_autocast_enabled(aux.device.type):
            aux = aux.to(self.fc.weight.dtype)  # bf16 shards into an fp32 model (autocast casts by itself)
        return self.fc(aux)

    def mask_slots(self, batch: int, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Parallel drafting's mask slots: (hidden (batch, slots, H) = fc(mask_hidden), input_ids
        (batch, slots) = ptd_token_id), what vLLM feeds the slots after the last real one."""
        if self.config.ptd_token_id is None:
            raise ValueError("this drafter drafts step by step (ptd_token_id is None): it has no mask slots")
        g = self.project_hidden_states(self.mask_hidden.view(1, 1, -1)).expand(batch, slots, -1)
        ids = torch.full((batch, slots), self.config.ptd_token_id, dtype=torch.long, device=g.device)
        return g, ids

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids (B, T) target ids -> (B, T, H) embeddings (the target's, frozen)."""
        return self.embed_tokens(input_ids)

    def compute_logits(self, h_post: torch.Tensor) -> torch.Tensor:
        """h_post (..., H) -> draft-vocabulary logits (..., N)."""
        return self.lm_head(h_post)

    def forward(
        self,
        hidden: torch.Tensor,
        input_ids: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        input_embeds: torch.Tensor | None = None,
        kv_cache: DrafterKVCache | list[DrafterKVCache] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One drafter step for T slots -> (h_pre, h_post), each (B, T, H).

        hidden: (B, T, H) g (from `project_hidden_states`) or a fed-back h_pre; input_ids (B, T)
        the token of each slot (x_{p+1} for the slot at position p); position_ids (B, T), default
        0..T-1. Without a cache, slot t attends to the call's slots at positions <= its own. With
        `kv_cache` (`new_kv_cache`: one per layer), the slots' keys/values are written at their
        positions first, then each slot attends to all cached keys at positions <= its own.
        """
        if input_embeds is None:
            if input_ids is None:
                raise ValueError("forward needs input_ids or input_embeds")
            input_embeds = self.embed_input_ids(input_ids)
        B, T, _ = hidden.shape
        if position_ids is None:
            position_ids = torch.arange(T, device=hidden.device).expand(B, T)
        caches = [kv_cache] if isinstance(kv_cache, DrafterKVCache) else kv_cache
        if caches is not None and len(caches) != len(self.layers):
            raise ValueError(f"{len(caches)} KV caches for {len(self.layers)} drafter layers; use new_kv_cache")
        input_embeds = input_embeds.to(hidden.dtype)
        cos, sin = self.rotary(position_ids)  # (B, T, D) each
        groups = self.config.num_attention_heads // self.config.num_key_value_heads
        h = hidden
        for i, layer in enumerate(self.layers):
            q, k, v = layer.attention_inputs(input_embeds, h, cos, sin)
            if caches is None:
                mask = position_ids[:, None, :, None] >= position_ids[:, None, None, :]  # (B, 1, T, T)
                keys, values = k, v
            else:
                caches[i].write(position_ids, k, v)
                mask = caches[i].mask(position_ids)  # (B, 1, T, L)
                keys, values = caches[i].k.to(q.dtype), caches[i].v.to(q.dtype)
            keys = keys.repeat_interleave(groups, dim=1)  # (B, nh, S, D)
            values = values.repeat_interleave(groups, dim=1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=layer.self_attn.scale)  # (B, nh, T, D)
            h = layer.finish(out.transpose(1, 2).reshape(B, T, -1), h)  # (B, T, H) this layer's h_pre
        return h, self.norm(h)

    def new_kv_cache(self, batch: int, max_len: int) -> list[DrafterKVCache]:
        """Empty KV caches, one per decoder layer, for `forward(..., kv_cache=)`."""
        w = self.fc.weight
        return [DrafterKVCache.empty(self.config, batch, max_len, device=w.device, dtype=w.dtype) for _ in self.layers]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Everything an export saves: all parameters and buffers except the target's embedding."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed_tokens.")}


def exported_shapes(config: DrafterConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every tensor `trainable_state_dict` holds, from the config alone (no allocation)."""
    H, I, Q, KV = config.hidden_size, config.intermediate_size, config.q_size, config.kv_size
    shapes: dict[str, tuple[int, ...]] = {"fc.weight": (H, config.fc_in_features)}
    for i in range(config.num_hidden_layers):
        width = 2 * H if i == 0 else H
        shapes.update(
            {
                f"layers.{i}.input_layernorm.weight": (H,),
                **({f"layers.{i}.hidden_norm.weight": (H,)} if i == 0 else {}),
                f"layers.{i}.self_attn.q_proj.weight": (Q, width),
                f"layers.{i}.self_attn.k_proj.weight": (KV, width),
                f"layers.{i}.self_attn.v_proj.weight": (KV, width),
                f"layers.{i}.self_attn.o_proj.weight": (H, Q),
                f"layers.{i}.post_attention_layernorm.weight": (H,),
                f"layers.{i}.mlp.gate_proj.weight": (I, H),
                f"layers.{i}.mlp.up_proj.weight": (I, H),
                f"layers.{i}.mlp.down_proj.weight": (H, I),
            }
        )
    shapes.update(
        {
            "norm.weight": (H,),
            "lm_head.weight": (config.draft_vocab_size, H),
            "d2t": (config.draft_vocab_size,),
            "t2d": (config.vocab_size,),
        }
    )
    if config.ptd_token_id is not None:
        shapes["mask_hidden"] = (config.fc_in_features,)
    return shapes


def check_vocab_mapping(d2t: torch.Tensor, t2d: torch.Tensor, draft_vocab_size: int, vocab_size: int) -> None:
    """Raise a clear error when (d2t, t2d) is not a valid draft vocabulary for these sizes."""
    if d2t.ndim != 1 or d2t.shape[0] != draft_vocab_size:
        raise ValueError(f"d2t has shape {tuple(d2t.shape)}, expected ({draft_vocab_size},) = draft_vocab_size")
    if t2d.ndim != 1 or t2d.shape[0] != vocab_size:
        raise ValueError(f"t2d has shape {tuple(t2d.shape)}, expected ({vocab_size},) = the target vocab_size")
    if d2t.dtype.is_floating_point or t2d.dtype not in (torch.bool, torch.uint8):
        raise ValueError(f"d2t must be an integer tensor and t2d bool; got {d2t.dtype} and {t2d.dtype}")
    targets = torch.arange(draft_vocab_size, device=d2t.device) + d2t.long()
    if int(targets.min()) < 0 or int(targets.max()) >= vocab_size:
        raise ValueError(
            f"d2t maps draft ids to target ids in [{int(targets.min())}, {int(targets.max())}], outside the "
            f"target vocab [0, {vocab_size}): the mapping was built for another target"
        )
    if torch.unique(targets).numel() != draft_vocab_size:
        raise ValueError("d2t maps two draft ids to the same target id; rebuild the vocab mapping")
    t2d = t2d.bool()
    if int(t2d.sum()) != draft_vocab_size or not bool(t2d[targets].all()):
        raise ValueError(
            f"t2d marks {int(t2d.sum())} target ids but d2t names {draft_vocab_size}, or they disagree: "
            "t2d must be True exactly at draft_id + d2t[draft_id]"
        )
