"""Training-time test (TTT): the EAGLE-3 loss, unrolled over K draft steps as serving runs them.

Sequence index t pairs g_t = fc(A_t) with E[x_{t+1}] at rotary position t and predicts
x_{t+2}. Step i (0..K-1) is serving's draft step i+1 (docs/eagle3-semantics.md sections 3 and 6):

    token     E[x_{t+1+i}]                        (teacher forcing: the ground-truth token)
    hidden    g_t at i = 0, else step i-1's h_pre at t (the last layer's, for drafters of more layers)
    position  t + i
    keys      step-0 keys at indices <= t (causal), plus index t's own key of steps 1..i
    target    softmax over the draft vocabulary of the target's logits at t+1+i
    mask      loss_mask[t+2+i] * t2d[target argmax at t+1+i] * (t+2+i < length)

The attention of step i is computed without a (T, T*K) mask: a causal flash attention over
the step-0 keys, which also returns its log-sum-exp, merged exactly with the i extra
"diagonal" scores (one dot product per token, head and earlier step). Its backward reuses the
flash backward with the merged output and log-sum-exp (as ring attention does), plus the
diagonal's closed-form gradient. The draft-vocabulary logits are never held for all steps:
one fused function computes loss, accuracy and both gradients chunk by chunk. The step loop has
no host synchronisation.

    out = ttt_loss(model, batch, target_head, steps=7)
    (out.loss_sum / global_token_count).backward()   # or out.loss for a local mean

`batch` holds `aux` (B, T, n_aux*Ht), `final` (B, T, Ht) (the target's normed last state),
`input_ids` (B, T), `loss_mask` (B, T) and `lengths` (B,) for right padding; `target_head`
is the target lm_head's draft-vocabulary rows (N, Ht) (`target_head.draft_head`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from eagle_assets.drafter import fusion
from eagle_assets.drafter.fusion import apply_rotary, diagonal_scores, expand_kv
from eagle_assets.drafter.model import Eagle3Drafter

DEFAULT_STEP_DECAY = 0.8
"""Step i's loss weighs DEFAULT_STEP_DECAY ** i, as in EAGLE-3 and SpecForge."""


@dataclass
class TTTOutput:
    """What one TTT forward returns; only `loss_sum` carries gradients."""

    loss_sum: torch.Tensor
    """() fp32: sum over steps i of weight_i * (sum over masked positions of the soft cross-entropy)."""
    num_tokens: torch.Tensor
    """() fp32: masked positions of step 0. Normalise by its sum over ranks for exact DDP equality."""
    step_loss_sum: torch.Tensor
    """(K,) fp32, detached: unweighted cross-entropy summed over each step's masked positions."""
    step_tokens: torch.Tensor
    """(K,) fp32: masked positions per step (later steps lose positions off the end)."""
    step_correct: torch.Tensor
    """(K,) fp32: masked positions whose drafter argmax equals the target's (draft vocabulary)."""
    correct_rows: torch.Tensor | None = None
    """(K, B, T) bool: step i at row t trains and its argmax is the target's (for `replay_drafting`);
    None unless asked for (`with_correct_rows`)."""
    in_draft: torch.Tensor | None = None
    """(B, T) bool: the target's argmax over the full vocabulary is drafted (all True without an
    outside head); fixed by the target's states, so a trainer can keep it (`DraftableCache`)."""

    @property
    def loss(self) -> torch.Tensor:
        """Local mean: loss_sum / num_tokens (use the global count under DDP)."""
        return self.loss_sum / self.num_tokens.clamp(min=1)

    @property
    def step_loss(self) -> torch.Tensor:
        return self.step_loss_sum / self.step_tokens.clamp(min=1)

    @property
    def step_accuracy(self) -> torch.Tensor:
        return self.step_correct / self.step_tokens.clamp(min=1)

    @property
    def acceptance(self) -> torch.Tensor:
        """(K,) estimate of per-position acceptance p_k: product of accuracies up to step k."""
        return torch.cumprod(self.step_accuracy, dim=0)


# ---------------------------------------------------------------------------------------------
# Attention: causal over step-0 keys, merged with the diagonal keys of steps 1..i
# ---------------------------------------------------------------------------------------------


def _flash_forward(q, k, v, scale):
    """Causal flash attention -> (out (B, h, T, D), lse (B, h, T) fp32, state for the backward)."""
    if q.device.type == "cuda":
        res = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False, scale=scale)
        out, lse = res[0], res[1]
        return out, lse[..., : q.shape[2]], res[2:8]
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
    return out, lse, None


def _flash_backward(dout, q, k, v, out, lse, scale, state):
    if q.device.type == "cuda":
        cum_q, cum_k, max_q, max_k, seed, offset = state
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cum_q, cum_k, max_q, max_k, 0.0, True, seed, offset, scale=scale
        )
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, True, scale=scale)


class _MergedFlashAttention(torch.autograd.Function):
    """Causal flash attention over (q, k0, v0) merged with per-index diagonal keys, exactly."""

    @staticmethod
    def forward(ctx, q, k0, v0, scale, *extra):
        # q, k0, v0: (B, nh, T, D) (k0, v0 already expanded to nh heads); extra = k_1..k_i, v_1..v_i (B, nkv, T, D)
        n = len(extra) // 2
        ks, vs = extra[:n], extra[n:]
        out0, lse0, state = _flash_forward(q, k0, v0, scale)  # (B, nh, T, D), (B, nh, T)
        out, lse = out0, lse0
        for k, v in zip(ks, vs):  # online softmax over the diagonal keys, one fused kernel each
            out, lse = fusion.merge_diagonal(q, k, v, out, lse, scale)
        out = out.to(q.dtype)
        ctx.scale, ctx.n, ctx.state = scale, n, state
        ctx.save_for_backward(q, k0, v0, out, lse, *extra)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k0, v0, out, lse, *extra = ctx.saved_tensors
        n, scale = ctx.n, ctx.scale
        dout = dout.to(q.dtype).contiguous()
        # The flash backward with the *merged* out and lse gives the exact gradient of the
        # step-0 block: P = exp(S - lse) and D = rowsum(dout * out) are the global ones.
        dq, dk0, dv0 = _flash_backward(dout, q, k0, v0, out, lse, scale, ctx.state)
        if n == 0:
            return dq, dk0, dv0, None
        ks, vs = extra[:n], extra[n:]
        delta = fusion.row_dot(dout, out)  # (B, nh, T)
        dq32 = dq.float()
        dks, dvs = [], []
        for k, v in zip(ks, vs):
            dq32, dk, dv = fusion.diagonal_backward(q, k, v, dout, delta, lse, dq32, scale)
            dks.append(dk)
            dvs.append(dv)
        return (dq32.to(q.dtype), dk0, dv0, None, *dks, *dvs)


def _math_attention(q, k0, v0, ks, vs, scale):
    """Same function with explicit (T, T) scores; autograd does the backward. CPU/fallback path."""
    B, nh, T, D = q.shape
    k0e, v0e = expand_kv(k0, nh).float(), expand_kv(v0, nh).float()
    s0 = torch.matmul(q.float(), k0e.transpose(-1, -2)) * scale  # (B, nh, T, T)
    causal = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s0 = s0.masked_fill(~causal, float("-inf"))
    diag = [diagonal_scores(q, k, scale)[..., None] for k in ks]  # each (B, nh, T, 1)
    p = torch.softmax(torch.cat([s0, *diag], dim=-1), dim=-1)  # (B, nh, T, T + i)
    out = torch.matmul(p[..., :T], v0e)
    for j, v in enumerate(vs):
        out = out + p[..., T + j, None] * expand_kv(v, nh).float()
    return out.to(q.dtype)


def flash_supported(q: torch.Tensor) -> bool:
    """Whether the merged flash path runs for this query (device, dtype, head size)."""
    if q.device.type == "cpu":
        return q.dtype in (torch.float32, torch.bfloat16, torch.float16)
    if q.device.type == "cuda":
        return q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] % 8 == 0 and q.shape[-1] <= 256
    return False


def ttt_attention(
    q: torch.Tensor,
    k0: torch.Tensor,
    v0: torch.Tensor,
    ks: list[torch.Tensor],
    vs: list[torch.Tensor],
    scale: float,
    backend: str = "auto",
) -> torch.Tensor:
    """Step-i attention: query t sees step-0 keys at <= t and k_j[t] for each earlier step j >= 1.

    q (B, nh, T, D); k0, v0 (B, nkv or nh, T, D); each of ks, vs (B, nkv, T, D) -> (B, nh, T, D).
    backend: "flash" (merged flash, exact gradient), "math" (explicit scores), "auto".
    """
    if backend == "auto":
        backend = "flash" if flash_supported(q) else "math"
    if backend == "math":
        return _math_attention(q, k0, v0, ks, vs, scale)
    if backend != "flash":
        raise ValueError(f"attention backend {backend!r}: use 'flash', 'math' or 'auto'")
    nh = q.shape[1]
    return _MergedFlashAttention.apply(q, expand_kv(k0, nh), expand_kv(v0, nh), scale, *ks, *vs)


# ---------------------------------------------------------------------------------------------
# Target distribution and the fused draft-vocabulary soft cross-entropy
# ---------------------------------------------------------------------------------------------


@dataclass
class TargetStats:
    """The target's distribution over the draft vocabulary, per sequence index (flattened B*T)."""

    logits: torch.Tensor  # (B*T, N) target logits over the draft vocabulary (matmul dtype)
    lse: torch.Tensor  # (B*T,) fp32 log-sum-exp of those logits
    argmax: torch.Tensor  # (B*T,) long, draft id of the target's most likely drafted token
    in_draft: torch.Tensor  # (B*T,) bool: the target's argmax over the FULL vocab is drafted


@torch.no_grad()
def target_stats(
    final: torch.Tensor,
    target_head: torch.Tensor,
    outside_head: torch.Tensor | None = None,
    chunk_rows: int = 4096,
    temperature: float = 1.0,
    in_draft: torch.Tensor | None = None,
) -> TargetStats:
    """Target logits over the draft vocab from the normed final state, in row chunks.

    final (B, T, Ht), target_head (N, Ht) = lm_head rows of the draft vocab; outside_head
    (V - N, Ht) = the other rows, optional: with it, `in_draft` is exact (SpecForge's
    t2d[argmax]); without it every position counts as drafted. temperature: the logits are
    divided by it (below 1 sharpens the distribution the drafter learns towards the target's
    greedy token; the argmax and `in_draft` do not change). in_draft (B, T) bool: the mask as an
    earlier call computed it, instead of the outside head (its matmul is (V-N)/N times the draft
    head's: most of this function's cost).
    """
    if not temperature > 0:
        raise ValueError(f"target_temperature={temperature} must be > 0")
    if in_draft is not None and outside_head is not None:
        raise ValueError("pass outside_head or a known in_draft mask, not both")
    flat = final.reshape(-1, final.shape[-1])
    head = target_head.to(flat.dtype)
    other_head = None if outside_head is None or outside_head.shape[0] == 0 else outside_head.to(flat.dtype)  # cast once
    logits = torch.empty(flat.shape[0], head.shape[0], dtype=torch.promote_types(flat.dtype, head.dtype), device=flat.device)
    lse = torch.empty(flat.shape[0], dtype=torch.float32, device=flat.device)
    best = torch.empty(flat.shape[0], dtype=torch.long, device=flat.device)
    if in_draft is None:
        in_draft = torch.ones(flat.shape[0], dtype=torch.bool, device=flat.device)
    else:
        in_draft = in_draft.reshape(-1).to(device=flat.device, dtype=torch.bool)
        if in_draft.shape[0] != flat.shape[0]:
            raise ValueError(f"in_draft has {in_draft.shape[0]} positions for {flat.shape[0]} final states")
    for start in range(0, flat.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        chunk = flat[rows] @ head.T  # (C, N)
        lse[rows], top, best[rows] = fusion.logit_stats(chunk)
        if other_head is not None:
            other = (flat[rows] @ other_head.T).amax(dim=-1).float()  # (C,); max is exact in bf16
            in_draft[rows] = top >= other
        if temperature != 1.0:  # after the argmax and the drafted test, on the unscaled logits
            chunk = chunk / temperature
            lse[rows] = torch.logsumexp(chunk.float(), dim=-1)
        logits[rows] = chunk
    return TargetStats(logits=logits, lse=lse, argmax=best, in_draft=in_draft)


class _FusedSoftCE(torch.autograd.Function):
    """sum_r weight_r * CE(softmax(target_r) || softmax(h_r @ W.T)) without holding all logits.

    Gradients are computed in the forward, chunk by chunk, and scaled by the incoming scalar
    gradient in the backward (as Liger's fused linear cross-entropy): memory is one chunk of
    logits plus grad_h (rows, H) and grad_W (N, H) fp32.
    """

    @staticmethod
    def forward(
        ctx,
        h,
        weight,
        tgt_logits,
        tgt_lse,
        tgt_argmax,
        tgt_index,
        row_mask,
        row_step,
        step_weight,
        chunk_rows,
        row_pos=None,
        num_positions=0,
        unreached_weight=1.0,
    ):
        # h (M, H) compute dtype; weight (N, H); tgt_* indexed by tgt_index (M,); row_mask (M,) fp32 0/1;
        # row_step (M,) long, ascending; step_weight (K,) fp32. row_pos (M,) long: each row's sequence
        # position b * T + t, of num_positions (B * T); needed when unreached_weight < 1 (see `ttt_loss`).
        K = step_weight.shape[0]
        w = weight.to(h.dtype)
        want_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]  # False in validation: loss only
        grad_h = torch.empty_like(h) if want_grad else None
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=h.device) if want_grad else None
        loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
        step_loss = torch.zeros(K, dtype=torch.float32, device=h.device)
        step_correct = torch.zeros(K, dtype=torch.float32, device=h.device)
        row_correct = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
        by_step = unreached_weight != 1.0
        if by_step:  # step by step, so that each step knows which chains the one before kept alive
            counts = torch.bincount(row_step, minlength=K).tolist()  # one host sync
            ends = [sum(counts[: i + 1]) for i in range(K)]
            segments = [(end - n, end) for n, end in zip(counts, ends)]
            reached = torch.ones(num_positions, dtype=torch.bool, device=h.device)
        else:
            segments = [(0, h.shape[0])]  # every row weighs the same: one pass in chunks
        for seg_start, seg_end in segments:
            if by_step:
                next_reached = torch.zeros_like(reached)  # a position that did not train at this step is not reached
            for start in range(seg_start, seg_end, chunk_rows):
                rows = slice(start, min(start + chunk_rows, seg_end))
                hc = h[rows]  # (C, H)
                mask, step = row_mask[rows], row_step[rows]
                rw = mask * step_weight[step]  # (C,)
                if by_step:
                    alive = reached[row_pos[rows]]
                    rw = rw * torch.where(alive, 1.0, unreached_weight)
                ce, correct, grad_logits = fusion.soft_ce_chunk(
                    hc @ w.T, tgt_logits, tgt_index[rows], tgt_lse, tgt_argmax, rw, want_grad
                )  # (C,), (C,), (C, N) d loss / d logits
                loss_sum += (rw * ce).sum()
                step_loss.index_add_(0, step, mask * ce)
                step_correct.index_add_(0, step, mask * correct)
                row_correct[rows] = mask * correct
                if by_step:
                    next_reached[row_pos[rows]] = alive & (mask * correct > 0)
                if want_grad:
                    grad_h[rows] = grad_logits @ w
                    fusion.accumulate_matmul(grad_w, grad_logits.T, hc)
            if by_step:
                reached = next_reached
        ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        ctx.mark_non_differentiable(step_loss, step_correct, row_correct)
        return loss_sum, step_loss, step_correct, row_correct

    @staticmethod
    def backward(ctx, dloss, _dstep_loss, _dstep_correct, _drow_correct):
        grad_h, grad_w = ctx.saved_tensors
        return (grad_h * dloss.to(grad_h.dtype), (grad_w * dloss).to(ctx.weight_dtype)) + (None,) * 11


def _compute_dtype(ref: torch.Tensor) -> torch.dtype:
    if torch.is_autocast_enabled(ref.device.type):
        return torch.get_autocast_dtype(ref.device.type)
    return ref.dtype


# ---------------------------------------------------------------------------------------------
# The unroll
# ---------------------------------------------------------------------------------------------


def step_masks(loss_mask: torch.Tensor, lengths: torch.Tensor, in_draft: torch.Tensor, steps: int) -> torch.Tensor:
    """(K, B, T) fp32 0/1: which rows each step trains on.

    Row t of step i predicts x_{t+2+i}: it counts when that token exists (t+2+i < length),
    carries loss_mask, and the target's argmax at t+1+i is in the draft vocabulary.
    """
    B, T = loss_mask.shape
    pad = torch.zeros(B, steps + 2, dtype=loss_mask.dtype, device=loss_mask.device)
    lm = torch.cat([loss_mask, pad], dim=1)  # (B, T + K + 2)
    dr = torch.cat([in_draft.view(B, T), pad.bool()], dim=1)
    t = torch.arange(T, device=loss_mask.device)
    masks = []
    for i in range(steps):
        exists = (t[None, :] + 2 + i) < lengths[:, None]  # (B, T)
        masks.append((lm[:, 2 + i : 2 + i + T] > 0) & dr[:, 1 + i : 1 + i + T] & exists)
    return torch.stack(masks).float()


def unroll_steps(model: Eagle3Drafter, aux: torch.Tensor, input_ids: torch.Tensor, steps: int, attention: str = "auto") -> list[torch.Tensor]:
    """The drafter's `steps` draft steps at every sequence index at once (the module docstring's
    unroll): aux (B, T, n_aux*Ht), input_ids (B, T) -> per step i the normed last state h_post
    (B, T, H) in the compute dtype, whose draft-vocabulary logits draft x_{t+2+i} at row t."""
    cfg = model.config
    B, T = input_ids.shape
    device = input_ids.device
    layer = model.layer
    attn = layer.self_attn
    H = cfg.hidden_size
    nh, nkv, D = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim

    # Tokens: step i at row t reads x_{t+1+i}; ids past the end are padding (their rows are masked).
    ids = torch.cat([input_ids[:, 1:], input_ids.new_zeros(B, steps)], dim=1)  # (B, T-1+K)
    e_all = layer.input_layernorm(model.embed_input_ids(ids))  # (B, T-1+K, H), one norm for all steps
    # q/k/v are linear in [e ; u]: the embedding half is computed once for all steps and sliced.
    w_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight], dim=0)  # (Q+2KV, 2H)
    qkv_e = F.linear(e_all, w_qkv[:, :H])  # (B, T-1+K, Q+2KV)
    # Per layer: the weights applied to the stream (layer 0: the hidden half) and its input norm.
    later = model.layers[1:]
    stream_w = [w_qkv[:, H:]] + [
        torch.cat([m.self_attn.q_proj.weight, m.self_attn.k_proj.weight, m.self_attn.v_proj.weight], dim=0) for m in later
    ]  # each (Q+2KV, H)
    stream_norm = [layer.hidden_norm] + [m.input_layernorm for m in later]
    positions = torch.arange(T - 1 + steps, device=device)
    cos_all, sin_all = model.rotary(positions[None])  # (1, T-1+K, D) each

    h = model.project_hidden_states(aux)  # (B, T, H): g
    dtype = _compute_dtype(h)  # bf16 under autocast: the loss matmuls run in it
    # Parallel drafting: steps after the first are mask slots, each the same input (the mask
    # token's embedding, fc(mask_hidden)) at its own position; nothing is fed back between steps.
    parallel = cfg.ptd_token_id is not None
    if parallel:
        g_mask, mask_ids = model.mask_slots(1, 1)  # (1, 1, H), (1, 1)
        qkv_mask = F.linear(layer.input_layernorm(model.embed_input_ids(mask_ids.to(device))), w_qkv[:, :H])  # (1, 1, Q+2KV)
    n_layers = len(model.layers)
    k0, v0 = [None] * n_layers, [None] * n_layers  # per layer: step-0 keys (B, nh, T, D)
    ks, vs = [[] for _ in range(n_layers)], [[] for _ in range(n_layers)]  # per layer: steps 1..i diagonal keys
    h_posts = []
    for i in range(steps):
        cos, sin = cos_all[:, i : i + T], sin_all[:, i : i + T]  # rotary position t + i
        masked = parallel and i > 0
        if masked:
            h = g_mask.expand(B, T, H)
        for j, lay in enumerate(model.layers):
            qkv = F.linear(stream_norm[j](h), stream_w[j])  # (B, T, Q+2KV)
            if j == 0:
                qkv = (qkv_mask if masked else qkv_e[:, i : i + T]) + qkv
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = apply_rotary(q.reshape(B, T, nh, D).transpose(1, 2), cos, sin)  # (B, nh, T, D)
            k = apply_rotary(k.reshape(B, T, nkv, D).transpose(1, 2), cos, sin)  # (B, nkv, T, D)
            v = v.reshape(B, T, nkv, D).transpose(1, 2)  # (B, nkv, T, D)
            if i == 0:
                k0[j], v0[j] = expand_kv(k, nh), expand_kv(v, nh)  # expanded once, shared by all steps
            else:
                ks[j].append(k)
                vs[j].append(v)
            out = ttt_attention(q, k0[j], v0[j], ks[j], vs[j], attn.scale, backend=attention)  # (B, nh, T, D)
            h = lay.finish(out.transpose(1, 2).reshape(B, T, nh * D), h)  # (B, T, H) this layer's h_pre
        h_posts.append(model.norm(h).to(dtype))  # the last layer's h_pre is fed back
    return h_posts


def ttt_loss(
    model: Eagle3Drafter,
    batch: dict,
    target_head: torch.Tensor,
    steps: int,
    *,
    outside_head: torch.Tensor | None = None,
    step_weights: torch.Tensor | list[float] | None = None,
    attention: str = "auto",
    loss_chunk_rows: int | None = None,
    with_correct_rows: bool = False,
    target_temperature: float = 1.0,
    unreached_weight: float = 1.0,
    in_draft: torch.Tensor | None = None,
) -> TTTOutput:
    """Unroll `steps` draft steps over a right-padded batch and return the summed loss and stats.

    batch: aux (B, T, n_aux*Ht), final (B, T, Ht) normed, input_ids (B, T) long, loss_mask
    (B, T) 0/1, lengths (B,) (optional; default T). target_head (N, Ht): the target lm_head's
    draft-vocabulary rows (target logits over the draft vocab = final @ target_head.T).
    outside_head (V-N, Ht): the remaining rows, to mask positions whose target argmax is not
    drafted (SpecForge's t2d[argmax]); omit it to keep every position. step_weights (K,):
    default 0.8**i. attention: "auto" | "flash" | "math". loss_chunk_rows: rows of draft logits
    held at once (default: about 64 Mi logits). with_correct_rows: also return which rows were
    drafted right (`correct_rows`, for validation's `replay_drafting`; training steps skip it).
    target_temperature: the target's logits are divided by it before the softmax the drafter
    learns (`target_stats`); 1 is the target's own distribution.
    unreached_weight: the weight of step i's row t when an earlier step at t drafted a token
    other than the target's (serving rejects that chain before step i, so its draft is never
    verified). 1 trains every row alike (EAGLE-3); 0 trains only the chains serving reaches
    (GRIFFIN's token-alignable training). Below 1, the steps run one after another (one more
    host sync); the returned statistics still count every row.
    in_draft (B, T) bool: the drafted-argmax mask an earlier call returned for these samples
    (`TTTOutput.in_draft`), in place of outside_head: the same loss without its matmul.
    A drafter with `ptd_token_id` (parallel drafting) unrolls its steps after the first as vLLM
    serves them: mask slots (`Eagle3Drafter.mask_slots`) instead of the token and hidden state
    of the step before.
    """
    if not 0.0 <= unreached_weight <= 1.0:
        raise ValueError(f"unreached_weight={unreached_weight} must be in [0, 1] (1 = every row counts)")
    cfg = model.config
    aux, final, input_ids, loss_mask = batch["aux"], batch["final"], batch["input_ids"], batch["loss_mask"]
    B, T = input_ids.shape
    device = input_ids.device
    _check_batch(cfg, aux, final, input_ids, loss_mask, target_head, steps)
    lengths = batch.get("lengths")
    lengths = torch.full((B,), T, device=device) if lengths is None else lengths.to(device)
    if step_weights is None:
        step_weights = [DEFAULT_STEP_DECAY**i for i in range(steps)]
    step_weight = torch.as_tensor(step_weights, dtype=torch.float32, device=device)
    if step_weight.shape != (steps,):
        raise ValueError(f"step_weights has {step_weight.numel()} entries for steps={steps}")

    H = cfg.hidden_size
    stats = target_stats(final, target_head, outside_head, temperature=target_temperature, in_draft=in_draft)
    masks = step_masks(loss_mask, lengths, stats.in_draft, steps)  # (K, B, T)
    h_posts = unroll_steps(model, aux, input_ids, steps, attention)

    h_all = torch.stack(h_posts).reshape(steps * B * T, H)  # (K*B*T, H), rows (i, b, t)
    del h_posts
    t_idx = torch.arange(T, device=device)
    tgt_index = torch.stack(
        [(torch.arange(B, device=device)[:, None] * T + (t_idx[None, :] + 1 + i).clamp(max=T - 1)) for i in range(steps)]
    ).reshape(-1)  # (K*B*T,) flat index of the target position t+1+i
    row_step = torch.arange(steps, device=device).repeat_interleave(B * T)
    # Only rows that train reach the draft-vocabulary head: a masked row (prompt token, padding,
    # undraftable target, past the end) contributes nothing to the loss or the gradients, and
    # its (N,)-wide logits are the most expensive part of a step. One host sync for the count.
    row_mask = masks.reshape(-1)
    keep = row_mask.nonzero().squeeze(1)  # (M,) rows (i, b, t) that train
    chunk = loss_chunk_rows or max(1, (64 << 20) // cfg.draft_vocab_size)
    loss_sum, step_loss, step_correct, row_correct = _FusedSoftCE.apply(
        h_all.index_select(0, keep),
        model.lm_head.weight,
        stats.logits,
        stats.lse,
        stats.argmax,
        tgt_index[keep],
        row_mask[keep],
        row_step[keep],
        step_weight,
        chunk,
        keep % (B * T),
        B * T,
        float(unreached_weight),
    )
    step_tokens = masks.sum(dim=(1, 2))
    correct_rows = None
    if with_correct_rows:
        correct_rows = torch.zeros(steps * B * T, dtype=torch.bool, device=device)
        correct_rows[keep] = row_correct > 0
        correct_rows = correct_rows.view(steps, B, T)
    return TTTOutput(
        loss_sum=loss_sum,
        num_tokens=step_tokens[0],
        step_loss_sum=step_loss,
        step_tokens=step_tokens,
        step_correct=step_correct,
        correct_rows=correct_rows,
        in_draft=stats.in_draft.view(B, T),
    )


def replay_drafting(correct_rows: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Chain drafting replayed along each sequence's answers, as the engine walks them.

    A round at row t (last committed token x_{t+1}) drafts K tokens; its first `a` drafts are
    accepted (steps 0..a-1 correct, `correct_rows` from `ttt_loss`), the target adds one token,
    and the next round is at row t + a + 1. A round starts only inside an answer (x_{t+1} and
    x_{t+2} both carry loss_mask): the answer's first token comes from the target's prefill.
    Averaging over rounds, not rows, weights hard stretches as serving does: it lingers there.

    Returns (K+1,) fp32 counts [rounds, rounds with draft 1 accepted, ..., all K accepted]:
    p_k = counts[k] / counts[0] and AL = 1 + sum_k p_k, the reference decoder's definitions.
    """
    return replay_drafting_per_sequence(correct_rows, loss_mask, lengths).sum(0)


def replay_drafting_per_sequence(correct_rows: torch.Tensor, loss_mask: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
    """`replay_drafting`'s counts for each sequence of the batch apart: (B, K+1) fp32 (a paired
    comparison of two drafters resamples sequences)."""
    K, B, T = correct_rows.shape
    lead = torch.cumprod(correct_rows.to(torch.int32), dim=0).sum(0).tolist()  # (B, T) drafts accepted per round
    mask = (loss_mask > 0).tolist()
    ends = [T] * B if lengths is None else [min(T, int(n)) for n in lengths.tolist()]
    counts = [[0] * (K + 1) for _ in range(B)]
    for b in range(B):
        t, row_lead, row_mask, row = 0, lead[b], mask[b], counts[b]
        while t + 2 < ends[b]:
            if not (row_mask[t + 1] and row_mask[t + 2]):
                t += 1
                continue
            a = row_lead[t]
            for k in range(a + 1):
                row[k] += 1
            t += a + 1
    return torch.tensor(counts, dtype=torch.float32).reshape(B, K + 1)


def _check_batch(cfg, aux, final, input_ids, loss_mask, target_head, steps) -> None:
    B, T = input_ids.shape
    if steps < 1:
        raise ValueError(f"steps={steps}: TTT needs at least one step")
    if aux.shape[:2] != (B, T) or aux.shape[-1] != cfg.fc_in_features:
        raise ValueError(
            f"batch['aux'] has shape {tuple(aux.shape)}, expected ({B}, {T}, {cfg.fc_in_features}) = "
            f"{cfg.num_aux} aux states of width {cfg.target_hidden_size}"
        )
    if final.shape != (B, T, cfg.target_hidden_size):
        raise ValueError(f"batch['final'] has shape {tuple(final.shape)}, expected ({B}, {T}, {cfg.target_hidden_size})")
    if loss_mask.shape != (B, T):
        raise ValueError(f"batch['loss_mask'] has shape {tuple(loss_mask.shape)}, expected ({B}, {T})")
    if target_head.shape != (cfg.draft_vocab_size, cfg.target_hidden_size):
        raise ValueError(
            f"target_head has shape {tuple(target_head.shape)}, expected (draft_vocab_size, target_hidden_size) = "
            f"({cfg.draft_vocab_size}, {cfg.target_hidden_size}); select the rows with target_head.draft_head(lm_head, d2t)"
        )


# ---------------------------------------------------------------------------------------------
# The same loss written plainly (dense masks, full logits): the cross-check and the baseline
# ---------------------------------------------------------------------------------------------


def ttt_loss_dense(
    model: Eagle3Drafter,
    batch: dict,
    target_head: torch.Tensor,
    steps: int,
    *,
    outside_head: torch.Tensor | None = None,
    step_weights: list[float] | None = None,
    target_temperature: float = 1.0,
    unreached_weight: float = 1.0,
) -> TTTOutput:
    """`ttt_loss` as SpecForge's SDPA path computes it: all steps' keys side by side under an
    explicit (T, T*(i+1)) mask, and every step's full draft-vocabulary logits kept for the
    backward. O(T^2 K) mask memory: for cross-checks and as the benchmark baseline only."""
    cfg = model.config
    if cfg.ptd_token_id is not None:
        raise ValueError("ttt_loss_dense unrolls chain drafting only; a parallel-drafting drafter trains with ttt_loss")
    aux, final, input_ids, loss_mask = batch["aux"], batch["final"], batch["input_ids"], batch["loss_mask"]
    B, T = input_ids.shape
    device = input_ids.device
    _check_batch(cfg, aux, final, input_ids, loss_mask, target_head, steps)
    lengths = batch.get("lengths")
    lengths = torch.full((B,), T, device=device) if lengths is None else lengths.to(device)
    weights = step_weights or [DEFAULT_STEP_DECAY**i for i in range(steps)]
    stats = target_stats(final, target_head, outside_head, temperature=target_temperature)
    masks = step_masks(loss_mask, lengths, stats.in_draft, steps)  # (K, B, T)
    target_logp = torch.log_softmax(stats.logits.float(), -1).view(B, T, -1)  # (B, T, N)
    ids = torch.cat([input_ids[:, 1:], input_ids.new_zeros(B, steps)], dim=1)  # (B, T-1+K)
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    t = torch.arange(T, device=device)
    h = model.project_hidden_states(aux)
    ks, vs = [[] for _ in model.layers], [[] for _ in model.layers]
    loss_sum = torch.zeros((), device=device)
    step_loss, step_correct = torch.zeros(steps, device=device), torch.zeros(steps, device=device)
    reached = torch.ones(B, T, dtype=torch.bool, device=device)  # every earlier step at t drafted right
    for i in range(steps):
        cos, sin = model.rotary((t + i)[None].expand(B, T))
        blocks = [t[:, None] >= t[None, :]] + [t[:, None] == t[None, :]] * i
        mask = torch.cat(blocks, dim=1)  # (T, T*(i+1))
        for j, lay in enumerate(model.layers):
            q, k, v = lay.attention_inputs(model.embed_input_ids(ids[:, i : i + T]), h, cos, sin)
            ks[j].append(k)
            vs[j].append(v)
            keys = torch.cat(ks[j], dim=2).repeat_interleave(groups, 1)  # (B, nh, T*(i+1), D)
            values = torch.cat(vs[j], dim=2).repeat_interleave(groups, 1)
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=lay.self_attn.scale)
            h = lay.finish(out.transpose(1, 2).reshape(B, T, -1), h)
        logp = torch.log_softmax(model.compute_logits(model.norm(h)).float(), -1)  # (B, T, N)
        tgt = target_logp[:, (t + 1 + i).clamp(max=T - 1)]  # (B, T, N)
        ce = -(tgt.exp() * logp).sum(-1)  # (B, T)
        m = masks[i]
        correct = (logp.argmax(-1) == tgt.argmax(-1)).float() * m
        loss_sum = loss_sum + weights[i] * (ce * m * torch.where(reached, 1.0, unreached_weight)).sum()
        step_loss[i] = (ce.detach() * m).sum()
        step_correct[i] = correct.sum()
        reached = reached & (correct > 0)
    step_tokens = masks.sum(dim=(1, 2))
    return TTTOutput(loss_sum, step_tokens[0], step_loss, step_tokens, step_correct)
