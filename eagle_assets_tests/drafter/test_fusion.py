"""The fused elementwise functions: eager where they must be, compiled where asked, same numbers."""

import pytest
import torch

from eagle_assets.drafter import fusion

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's Triton kernels need a CUDA device")


@pytest.fixture
def compile_calls(monkeypatch):
    """Record torch.compile calls (and hand back the eager function) instead of compiling.

    Stands in for torch.compile on purpose: what these tests check is *when* the wrapper asks
    for a compile, and a real Inductor compile on this CPU builds C++ for a minute or more per
    function. The compiled kernels themselves are checked for real below, on CUDA."""
    calls = []

    def fake_compile(fn, **kwargs):
        calls.append(fn.__name__)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    return calls


def _fresh(fn):
    return fusion.fused(fn.eager)  # a wrapper that has compiled nothing yet


def test_cpu_tensors_run_eagerly(compile_calls, monkeypatch):
    monkeypatch.delenv(fusion.COMPILE_ENV, raising=False)
    silu_mul = _fresh(fusion.silu_mul_forward)
    gate, up = torch.randn(4, 8), torch.randn(4, 8)
    assert torch.equal(silu_mul(gate, up), fusion.silu_mul_forward.eager(gate, up))
    assert compile_calls == []


def test_compile_on_request_once_and_never_when_disabled_or_in_inference(compile_calls, monkeypatch):
    silu_mul = _fresh(fusion.silu_mul_forward)
    gate, up = torch.randn(4, 8), torch.randn(4, 8)
    monkeypatch.setenv(fusion.COMPILE_ENV, "1")
    silu_mul(gate, up)
    silu_mul(gate, up)
    assert compile_calls == ["silu_mul_forward"]  # compiled once, reused
    with torch.inference_mode():
        silu_mul(gate, up)
    monkeypatch.setenv(fusion.COMPILE_ENV, "0")
    _fresh(fusion.silu_mul_forward)(gate, up)
    assert compile_calls == ["silu_mul_forward"]


def test_accumulate_matmul_adds_the_product():
    acc = torch.randn(5, 3)
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    want = acc + a @ b
    fusion.accumulate_matmul(acc, a, b)
    torch.testing.assert_close(acc, want)


def test_merge_diagonal_equals_one_softmax_over_all_keys():
    """Folding diagonal keys one at a time (online softmax) is softmax over [causal keys ; diagonal keys]."""
    torch.manual_seed(0)
    B, nh, nkv, T, D, scale = 1, 4, 2, 6, 8, 0.3
    q, k0, v0 = torch.randn(B, nh, T, D), torch.randn(B, nh, T, D), torch.randn(B, nh, T, D)
    ks, vs = [torch.randn(B, nkv, T, D) for _ in range(2)], [torch.randn(B, nkv, T, D) for _ in range(2)]
    s0 = (q @ k0.transpose(-1, -2) * scale).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    lse, out = torch.logsumexp(s0, -1), torch.softmax(s0, -1) @ v0
    for k, v in zip(ks, vs):
        out, lse = fusion.merge_diagonal(q, k, v, out, lse, scale)
    diag = [fusion.diagonal_scores(q, k, scale)[..., None] for k in ks]
    p = torch.softmax(torch.cat([s0, *diag], -1), -1)
    want = p[..., :T] @ v0 + sum(p[..., T + j, None] * v.repeat_interleave(nh // nkv, 1) for j, v in enumerate(vs))
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, torch.logsumexp(torch.cat([s0, *diag], -1), -1), rtol=1e-5, atol=1e-5)


def _cases(device):
    g = torch.Generator(device=device).manual_seed(0)

    def r(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, generator=g, device=device).to(dtype)

    B, nh, nkv, T, D, H, N, C = 2, 8, 2, 33, 64, 96, 257, 17
    x, res, w = r(B, T, H), r(B, T, H), r(H, dtype=torch.float32)
    y, s, rstd = fusion.rms_norm_forward.eager(x, res, w, 1e-5)
    q, k, v, out = r(B, nh, T, D), r(B, nkv, T, D), r(B, nkv, T, D), r(B, nh, T, D)
    lse = r(B, nh, T, dtype=torch.float32) + 3
    tgt = r(C + 4, N)
    return {
        "rms_norm_forward": (x, res, w, 1e-5),
        "rms_norm_forward_no_residual": (x, None, w, 1e-5),
        "rms_norm_backward": (s, w, rstd, r(B, T, H), r(B, T, H), torch.bfloat16, True),
        "silu_mul_forward": (r(B, T, H), r(B, T, H)),
        "silu_mul_backward": (r(B, T, H), r(B, T, H), r(B, T, H)),
        "add_in_fp32": (r(B, T, H), r(B, T, H)),
        "apply_rotary": (q, r(B, T, D, dtype=torch.float32), r(B, T, D, dtype=torch.float32)),
        "merge_diagonal": (q, k, v, out, lse, 0.125),
        "row_dot": (out, q),
        "diagonal_backward": (q, k, v, out, r(B, nh, T, dtype=torch.float32), lse, r(B, nh, T, D, dtype=torch.float32), 0.125),
        "logit_stats": (r(C, N),),
        "soft_ce_chunk": (
            r(C, N),
            tgt,
            torch.randperm(C + 4, device=device)[:C],
            r(C + 4, dtype=torch.float32) + 8,
            torch.randint(0, N, (C + 4,), device=device),
            r(C, dtype=torch.float32),
            True,
        ),
    }


@cuda
@pytest.mark.parametrize("name", list(_cases("cpu")))
def test_compiled_kernels_equal_the_eager_functions_on_cuda(name, monkeypatch):
    """What the GPU runs (Inductor's kernels) against the function the CPU tests check."""
    monkeypatch.setenv(fusion.COMPILE_ENV, "auto")
    args = _cases("cuda")[name]
    fn = getattr(fusion, name.replace("_no_residual", ""))
    got, want = fn(*args), fn.eager(*args)
    got, want = (got if isinstance(got, tuple) else (got,)), (want if isinstance(want, tuple) else (want,))
    for a, b in zip(got, want):
        if b is None:
            assert a is None
            continue
        assert a.dtype == b.dtype and a.shape == b.shape
        if b.dtype in (torch.long, torch.bool):
            assert torch.equal(a, b)
        else:  # one rounding of a 16-bit result apart at most
            torch.testing.assert_close(a.float(), b.float(), rtol=1.6e-2, atol=1e-3)
