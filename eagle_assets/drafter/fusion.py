"""The training step's elementwise math, one fused GPU kernel per function (torch.compile on CUDA).

A TTT step of a Llama-8B-shaped drafter at 4,096 tokens moves about as many bytes through
elementwise operators as it spends FLOPs in matmuls: every fp32 upcast, norm, silu, rotary
and the soft cross-entropy over 32k draft logits reads and writes its own full-size tensor
when run operator by operator. Each function below is compiled by Inductor into one or two
Triton kernels on CUDA, where that traffic is the cost; elsewhere it runs eagerly, the same
Python, so the CPU tests check the very function the GPU compiles.

    @fused
    def silu_mul(gate, up): ...     # eager on CPU, compiled (once, dynamic shapes) on CUDA

EAGLE_ASSETS_COMPILE=0 keeps everything eager (for debugging); =1 compiles on CPU too.
Inference mode stays eager: the reference decoder needs no speed and Dynamo need not trace it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable

import torch
import torch.nn.functional as F

from eagle_assets.settings_env import env_choice

COMPILE_ENV = "EAGLE_ASSETS_COMPILE"
RECOMPILE_LIMIT = 64

# Inductor says so once per compiled log-softmax over the draft vocabulary (it splits that
# reduction instead): a note on its own choice, not on ours, that would repeat in every log.
warnings.filterwarnings("ignore", message=r"\s*Online softmax is disabled", category=UserWarning)


def _compile_wanted(args: tuple) -> bool:
    setting = env_choice(COMPILE_ENV, "auto", ("auto", "0", "1"))
    if setting == "0" or torch.is_inference_mode_enabled():
        return False
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if first is None:
        return False
    return setting == "1" or first.is_cuda


def fused(fn: Callable) -> Callable:
    """Run `fn` compiled (dynamic shapes) when its first tensor is on CUDA, else eagerly."""
    compiled: Callable | None = None

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        nonlocal compiled
        if not _compile_wanted(args):
            return fn(*args, **kwargs)
        if compiled is None:
            # Dtypes, a None residual, grad mode and sizes 1 each specialise a graph: a training
            # run meets a dozen variants of one function, above Dynamo's default limit of 8
            # (beyond which it runs the function eagerly, correct but unfused).
            torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
            compiled = torch.compile(fn, dynamic=True)
        return compiled(*args, **kwargs)

    wrapper.eager = fn  # type: ignore[attr-defined]
    return wrapper


def wide(x: torch.Tensor) -> torch.Tensor:
    """x in at least fp32 (float64 stays float64, so that gradcheck can check these functions)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


# ------------------------------------------------------------------------------ norms and MLP


@fused
def rms_norm_forward(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float):
    """RMSNorm of s = x + residual (fp32 sum) -> (weight * xhat, s in x's dtype, 1/rms (..., 1) fp32)."""
    s32 = wide(x) if residual is None else wide(x) + wide(residual)
    rstd = torch.rsqrt(s32.pow(2).mean(-1, keepdim=True) + eps)
    y = weight * (s32 * rstd).to(x.dtype)
    s = x if residual is None else s32.to(x.dtype)
    return y, s, rstd


@fused
def rms_norm_backward(s, weight, rstd, dy, ds, residual_dtype: torch.dtype | None, want_dweight: bool):
    """Gradients of `rms_norm_forward` from its saved (s, weight, rstd) -> (dx, dresidual, dweight)."""
    xhat = wide(s) * rstd
    dy32 = wide(dy)
    dweight = (dy32 * xhat).reshape(-1, xhat.shape[-1]).sum(0).to(weight.dtype) if want_dweight else None
    dxhat = dy32 * wide(weight)
    dsum = rstd * (dxhat - xhat * (dxhat * xhat).mean(-1, keepdim=True))
    if ds is not None:
        dsum = dsum + wide(ds)
    dres = None if residual_dtype is None else dsum.to(residual_dtype)
    return dsum.to(s.dtype), dres, dweight


@fused
def silu_mul_forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return (F.silu(wide(gate)) * wide(up)).to(gate.dtype)


@fused
def silu_mul_backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor):
    g32, dy32 = wide(gate), wide(dy)
    sig = torch.sigmoid(g32)
    silu = g32 * sig
    dgate = dy32 * wide(up) * (sig + silu * (1 - sig))
    return dgate.to(gate.dtype), (dy32 * silu).to(up.dtype)


@fused
def add_in_fp32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b summed in fp32, rounded once to b's dtype (vLLM's fused residual add)."""
    return (a.float() + b.float()).to(b.dtype)


# ------------------------------------------------------------------------------ rotary


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


@fused
def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (B, heads, T, D); cos/sin (B, T, D) fp32 -> rotated x in x's dtype (math in fp32)."""
    x32 = x.float()
    cos, sin = cos[:, None], sin[:, None]  # (B, 1, T, D)
    return (x32 * cos + rotate_half(x32) * sin).to(x.dtype)


# ------------------------------------------------------------------------------ TTT attention's diagonal keys


def _grouped(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, nh, T, D) -> (B, nkv, g, T, D): query head h reads kv head h // g."""
    B, nh, T, D = x.shape
    return x.view(B, kv_heads, nh // kv_heads, T, D)


def expand_kv(x: torch.Tensor, nh: int) -> torch.Tensor:
    """(B, nkv, T, D) -> (B, nh, T, D), the inverse view of `_grouped`: query head h reads kv head h // g."""
    B, nkv, T, D = x.shape
    return x if nkv == nh else x[:, :, None].expand(B, nkv, nh // nkv, T, D).reshape(B, nh, T, D)


def diagonal_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """q (B, nh, T, D), k (B, nkv, T, D) -> fp32 scores (B, nh, T) of each query with its own index's key."""
    B, nh, T, D = q.shape
    return (_grouped(q, k.shape[1]).float() * k[:, :, None].float()).sum(-1).mul(scale).view(B, nh, T)


@fused
def merge_diagonal(q, k, v, out, lse, scale: float):
    """Fold one diagonal key block into an attention result, exactly (online softmax).

    out (B, nh, T, D) so far, with its log-sum-exp lse (B, nh, T) fp32; k, v (B, nkv, T, D)
    -> (out fp32, lse) over the union of keys.
    """
    B, nh, T, D = q.shape
    s = diagonal_scores(q, k, scale)
    new = torch.logaddexp(lse, s)
    v32 = v[:, :, None].float().expand(B, v.shape[1], nh // v.shape[1], T, D).reshape(B, nh, T, D)
    return out.float() * torch.exp(lse - new)[..., None] + v32 * torch.exp(s - new)[..., None], new


@fused
def row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """sum over the last axis of a * b, in fp32 (flash attention's D = rowsum(dout * out))."""
    return (a.float() * b.float()).sum(-1)


@fused
def diagonal_backward(q, k, v, dout, delta, lse, dq32, scale: float):
    """One diagonal key block's share of the attention gradient.

    With P = exp(s - lse) the block's probabilities and dS = P (dout.v - delta) scale:
    dq += dS k, dk = sum over the group of dS q, dv = sum over the group of P dout.
    Returns (dq32 updated, dk, dv) with dk, dv in k's dtype.
    """
    B, nh, T, D = q.shape
    nkv = k.shape[1]
    p = torch.exp(diagonal_scores(q, k, scale) - lse)  # (B, nh, T)
    dout32 = dout.float()
    dp = (_grouped(dout32, nkv) * v[:, :, None].float()).sum(-1).view(B, nh, T)
    ds = p * (dp - delta) * scale  # (B, nh, T): d loss / d score, scale folded in
    k32 = expand_kv(k.float(), nh)
    dq32 = dq32 + ds[..., None] * k32
    dk = _grouped(ds[..., None] * q.float(), nkv).sum(2).to(k.dtype)
    dv = _grouped(p[..., None] * dout32, nkv).sum(2).to(v.dtype)
    return dq32, dk, dv


# ------------------------------------------------------------------------------ the draft-vocabulary loss

_GEMM_FP32_OUT: bool | None = None
"""Whether this torch has `addmm(..., out_dtype=float32)` for 16-bit CUDA inputs (found on first use)."""


def accumulate_matmul(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """acc += a @ b, acc fp32. With 16-bit a, b on CUDA, one GEMM adds into acc in fp32 in its
    epilogue; otherwise the product is rounded, upcast and added (three more passes over acc)."""
    global _GEMM_FP32_OUT
    if acc.is_cuda and a.dtype in (torch.bfloat16, torch.float16) and _GEMM_FP32_OUT is not False:
        try:
            torch.addmm(acc, a, b, out_dtype=torch.float32, out=acc)
            _GEMM_FP32_OUT = True
            return
        except (RuntimeError, TypeError):  # an older torch: no fp32-output GEMM for 16-bit inputs
            _GEMM_FP32_OUT = False
    acc += (a @ b).to(acc.dtype)


@fused
def logit_stats(chunk: torch.Tensor):
    """(C, N) logits -> (log-sum-exp, max, argmax), each (C,), statistics in fp32."""
    c32 = chunk.float()
    top, best = c32.max(dim=-1)
    return torch.logsumexp(c32, dim=-1), top, best


@fused
def soft_ce_chunk(logits, tgt_logits, idx, tgt_lse, tgt_argmax, rw, want_grad: bool):
    """Soft cross-entropy of one chunk of drafter logits against the target's distribution.

    logits (C, N) drafter logits (matmul dtype); tgt_logits (R, N), tgt_lse (R,), tgt_argmax (R,)
    the target's, read at rows idx (C,); rw (C,) fp32 row weights. Returns ce (C,) fp32,
    correct (C,) fp32 (argmax agrees) and, with want_grad, d(sum rw * ce)/d logits in logits' dtype.
    """
    l32 = logits.float()
    logq = torch.log_softmax(l32, dim=-1)
    p = torch.exp(tgt_logits[idx].float() - tgt_lse[idx, None])  # (C, N) target probabilities
    ce = -(p * logq).sum(-1)
    correct = (l32.argmax(-1) == tgt_argmax[idx]).float()
    grad = ((logq.exp() - p) * rw[:, None]).to(logits.dtype) if want_grad else None
    return ce, correct, grad
