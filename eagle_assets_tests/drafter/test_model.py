"""Eagle3Drafter against a naive float64 implementation of vLLM's EAGLE-3 step, and its config."""

from __future__ import annotations

import json
import math

import pytest
import torch

from eagle_assets.drafter.config import DrafterConfig, tiny_config
from eagle_assets.drafter.model import Eagle3Drafter, exported_shapes, rope_inv_freq

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


VLLM_NAMES = {
    "fc.weight",
    "layers.0.input_layernorm.weight",
    "layers.0.hidden_norm.weight",
    "layers.0.self_attn.q_proj.weight",
    "layers.0.self_attn.k_proj.weight",
    "layers.0.self_attn.v_proj.weight",
    "layers.0.self_attn.o_proj.weight",
    "layers.0.post_attention_layernorm.weight",
    "layers.0.mlp.gate_proj.weight",
    "layers.0.mlp.up_proj.weight",
    "layers.0.mlp.down_proj.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
}


def random_drafter(config: DrafterConfig, seed: int = 0) -> Eagle3Drafter:
    """A drafter whose every weight (norms and embedding included) is random, so that no term hides."""
    torch.manual_seed(seed)
    model = Eagle3Drafter(config)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (1.0 if p.ndim == 1 else 0.0))
    return model


def naive_drafter_step(sd: dict, cfg: DrafterConfig, g, ids, positions):
    """vLLM's EAGLE-3 drafter for one sequence, written from the math with loops, in float64.

    Layer 0 reads [input_layernorm(E[x]) ; hidden_norm(g)] with residual g; each later layer
    (vLLM's `input_layernorm(h, residual)`) reads input_layernorm(h) with residual h, where h is
    the previous layer's pre-norm output. g (T, H) hidden, ids (T,) tokens, positions (T,).
    Returns (h_pre, h_post), each (T, H).
    """
    w = {k: v.double() for k, v in sd.items() if v.is_floating_point()}
    eps, D = cfg.rms_norm_eps, cfg.head_dim
    stream = g.double()  # (T, H) each layer's input and residual

    def rms(x, weight):
        return weight * x / math.sqrt(float((x * x).mean()) + eps)

    def rope(x, pos):  # x (D,): pairs (i, i + D/2) rotated by pos * theta^(-2i/D)
        out = x.clone()
        for i in range(D // 2):
            angle = pos * cfg.rope_theta ** (-2 * i / D)
            c, s = math.cos(angle), math.sin(angle)
            out[i] = x[i] * c - x[i + D // 2] * s
            out[i + D // 2] = x[i + D // 2] * c + x[i] * s
        return out

    T = g.shape[0]
    group = cfg.num_attention_heads // cfg.num_key_value_heads
    for layer in range(cfg.num_hidden_layers):
        L = f"layers.{layer}."
        qs, ks, vs = [], [], []
        for t in range(T):
            if layer == 0:
                e = rms(w["embed_tokens.weight"][ids[t]], w[L + "input_layernorm.weight"])
                z = torch.cat([e, rms(stream[t], w[L + "hidden_norm.weight"])])  # embedding first
            else:
                z = rms(stream[t], w[L + "input_layernorm.weight"])
            q = w[L + "self_attn.q_proj.weight"] @ z
            k = w[L + "self_attn.k_proj.weight"] @ z
            v = w[L + "self_attn.v_proj.weight"] @ z
            pos = int(positions[t])
            qs.append([rope(q[h * D : (h + 1) * D], pos) for h in range(cfg.num_attention_heads)])
            ks.append([rope(k[h * D : (h + 1) * D], pos) for h in range(cfg.num_key_value_heads)])
            vs.append([v[h * D : (h + 1) * D] for h in range(cfg.num_key_value_heads)])
        pres = []
        for t in range(T):
            heads = []
            for h in range(cfg.num_attention_heads):
                kv = h // group
                seen = [s for s in range(T) if positions[s] <= positions[t]]
                scores = torch.stack([qs[t][h] @ ks[s][kv] / math.sqrt(D) for s in seen])
                p = torch.softmax(scores, dim=0)
                heads.append(sum(p[i] * vs[s][kv] for i, s in enumerate(seen)))
            a = w[L + "self_attn.o_proj.weight"] @ torch.cat(heads)
            s = a + stream[t]  # residual = the un-normed layer input
            m_in = rms(s, w[L + "post_attention_layernorm.weight"])
            gate = w[L + "mlp.gate_proj.weight"] @ m_in
            up = w[L + "mlp.up_proj.weight"] @ m_in
            pres.append(w[L + "mlp.down_proj.weight"] @ (gate * torch.sigmoid(gate) * up) + s)
        stream = torch.stack(pres)
    return stream, torch.stack([rms(x, w["norm.weight"]) for x in stream])


@pytest.mark.parametrize("layers", [1, 2])
def test_forward_equals_naive_math(layers):
    cfg = tiny_config(
        hidden_size=32,
        intermediate_size=48,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        target_hidden_size=24,
        vocab_size=40,
        draft_vocab_size=40,
        num_hidden_layers=layers,
    )
    model = random_drafter(cfg)
    torch.manual_seed(1)
    aux = torch.randn(1, 6, 3 * 24)
    ids = torch.randint(0, 40, (1, 6))
    positions = torch.tensor([[7, 8, 9, 10, 11, 12]])  # a slot run that starts mid-sequence
    g = model.project_hidden_states(aux)
    h_pre, h_post = model(g, ids, positions)
    want_pre, want_post = naive_drafter_step(model.state_dict(), cfg, g[0].detach(), ids[0], positions[0])
    torch.testing.assert_close(h_pre[0].double(), want_pre, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(h_post[0].double(), want_post, rtol=1e-5, atol=1e-5)
    # g is fc(aux) without bias: a plain matrix product
    torch.testing.assert_close(g[0], aux[0] @ model.fc.weight.T)


@pytest.mark.parametrize("layers", [1, 2])
def test_kv_cache_decode_equals_full_forward(layers):
    """Token-by-token decoding through the explicit KV caches gives the causal full-sequence result."""
    model = random_drafter(tiny_config(num_hidden_layers=layers))
    torch.manual_seed(2)
    g = torch.randn(2, 7, 64)
    ids = torch.randint(0, 256, (2, 7))
    full_pre, full_post = model(g, ids)
    cache = model.new_kv_cache(2, 16)
    first_pre, _ = model(g[:, :3], ids[:, :3], torch.arange(3).expand(2, 3), kv_cache=cache)  # a 3-slot first pass
    outs = [first_pre]
    for t in range(3, 7):
        pre, _ = model(g[:, t : t + 1], ids[:, t : t + 1], torch.full((2, 1), t), kv_cache=cache)
        outs.append(pre)
    torch.testing.assert_close(torch.cat(outs, dim=1), full_pre, rtol=1e-4, atol=1e-4)
    # A later write at an earlier position replaces the stale entry (the next round's first pass).
    model(g[:, 2:3] * 0, ids[:, 2:3], torch.full((2, 1), 2), kv_cache=cache)
    pre, _ = model(g[:, 2:3], ids[:, 2:3], torch.full((2, 1), 2), kv_cache=cache)
    torch.testing.assert_close(pre, full_pre[:, 2:3], rtol=1e-4, atol=1e-4)


def test_parameter_names_are_vllm_checkpoint_names():
    cfg = tiny_config()
    model = Eagle3Drafter(cfg)
    assert set(model.trainable_state_dict()) == VLLM_NAMES
    assert {k: tuple(v.shape) for k, v in model.trainable_state_dict().items()} == exported_shapes(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert shapes["fc.weight"] == (64, 3 * 64)
    assert shapes["layers.0.self_attn.q_proj.weight"] == (4 * 16, 2 * 64)  # 2H input
    assert shapes["layers.0.self_attn.k_proj.weight"] == (2 * 16, 2 * 64)
    assert shapes["lm_head.weight"] == (64, 64)  # (draft vocab, H)
    assert shapes["embed_tokens.weight"] == (256, 64)  # (target vocab, H)
    assert model.d2t.dtype == torch.int64 and model.t2d.dtype == torch.bool
    assert not any(n.endswith("bias") for n, _ in model.named_parameters())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert "embed_tokens.weight" not in trainable and "fc.weight" in trainable


def test_later_layers_are_plain_llama_layers_under_vllm_names():
    cfg = tiny_config(num_hidden_layers=2)
    model = Eagle3Drafter(cfg)
    shapes = {k: tuple(v.shape) for k, v in model.trainable_state_dict().items()}
    assert shapes == exported_shapes(cfg)
    assert shapes["layers.0.self_attn.q_proj.weight"] == (4 * 16, 2 * 64)  # [embedding ; hidden]
    assert shapes["layers.1.self_attn.q_proj.weight"] == (4 * 16, 64)  # the stream only
    assert "layers.0.hidden_norm.weight" in shapes and "layers.1.hidden_norm.weight" not in shapes  # only layer 0 norms g
    assert "layers.1.input_layernorm.weight" in shapes and all(p.requires_grad for p in model.layers[1].parameters())
    assert cfg.to_vllm_config()["num_hidden_layers"] == 2
    with pytest.raises(ValueError, match="does not serve in SGLang"):
        cfg.to_sglang_config()
    with pytest.raises(ValueError, match="at least one decoder layer"):
        tiny_config(num_hidden_layers=0)


def test_vocab_mapping_and_draft_to_target():
    model = Eagle3Drafter(tiny_config())
    targets = torch.arange(64) * 4  # draft id i -> target id 4i
    t2d = torch.zeros(256, dtype=torch.bool)
    t2d[targets] = True
    model.set_vocab_mapping(targets - torch.arange(64), t2d)
    assert model.draft_to_target(torch.tensor([[0, 1, 63]])).tolist() == [[0, 4, 252]]
    with pytest.raises(ValueError, match="outside the target vocab"):
        model.set_vocab_mapping(torch.arange(64) * 4, t2d)  # offsets reach 63 + 252
    with pytest.raises(ValueError, match="expected \\(256,\\)"):
        model.set_vocab_mapping(targets - torch.arange(64), t2d[:100])
    with pytest.raises(ValueError, match="t2d must be True exactly"):
        model.set_vocab_mapping(targets - torch.arange(64), torch.roll(t2d, 1))
    with pytest.raises(ValueError, match="expects \\(256, 64\\)"):
        model.load_target_embedding(torch.zeros(255, 64))


def test_rope_matches_transformers():
    """Our inverse frequencies equal transformers' for plain and llama3-scaled RoPE."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    for rope_scaling in (None, scaling):
        cfg = tiny_config(rope_theta=500000.0, rope_scaling=rope_scaling)
        hf = LlamaConfig(
            hidden_size=64,
            num_attention_heads=4,
            head_dim=16,
            max_position_embeddings=512,
            rope_parameters={"rope_theta": 500000.0, **(rope_scaling or {"rope_type": "default"})},
        )
        kind = (rope_scaling or {}).get("rope_type", "default")
        if kind == "default":
            want = 1.0 / (500000.0 ** (torch.arange(0, 16, 2).float() / 16))
        else:
            want, _ = ROPE_INIT_FUNCTIONS[kind](hf, "cpu")
        torch.testing.assert_close(rope_inv_freq(cfg), want.float())
    with pytest.raises(ValueError, match="yarn"):
        tiny_config(rope_scaling={"rope_type": "yarn", "factor": 4.0})


def test_config_from_smollm2_and_json_roundtrip(smollm2_config):
    cfg = DrafterConfig.from_target_config(smollm2_config, draft_vocab_size=8192)
    assert cfg.aux_layer_ids == (2, 15, 27)  # (2, L//2, L-3) for 30 layers
    assert (cfg.hidden_size, cfg.target_hidden_size, cfg.vocab_size) == (576, 576, 49152)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (9, 3, 64)
    assert cfg.rope_theta == 100000.0 and cfg.rope_scaling is None  # read from transformers 5 rope_parameters
    assert DrafterConfig.from_json(cfg.to_json()) == cfg
    assert DrafterConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError, match="unknown keys \\['hidden'\\]"):
        DrafterConfig.from_dict({**cfg.to_dict(), "hidden": 1})
    with pytest.raises(ValueError, match="ascending and distinct"):
        DrafterConfig.from_target_config(smollm2_config, aux_layer_ids=(2, 2, 27))


def test_config_from_existing_drafter():
    vllm_style = tiny_config().to_vllm_config()
    assert DrafterConfig.from_hf_drafter_config(vllm_style) == tiny_config()
    # SpecForge / SGLang-numbered ids gain one, so they name the same residual streams.
    sglang_style = {**vllm_style, "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2]}}
    assert DrafterConfig.from_hf_drafter_config(sglang_style, layer_id_numbering="sglang").aux_layer_ids == (1, 2, 3)
    no_ids = {k: v for k, v in vllm_style.items() if k not in ("eagle_config", "target_num_hidden_layers")}
    with pytest.raises(ValueError, match="pass target_num_layers"):
        DrafterConfig.from_hf_drafter_config(no_ids)
    assert DrafterConfig.from_hf_drafter_config(no_ids, target_num_layers=30).aux_layer_ids == (2, 15, 27)
    for bad in ({"norm_before_residual": True}, {"attention_bias": True}, {"bias": True}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            DrafterConfig.from_hf_drafter_config({**vllm_style, **bad})
    # More layers: vLLM's function is ours; SGLang's later layers drop the residual stream.
    two = {**vllm_style, "num_hidden_layers": 2}
    assert DrafterConfig.from_hf_drafter_config(two) == tiny_config(num_hidden_layers=2)
    with pytest.raises(ValueError, match="num_hidden_layers=2 in an SGLang-numbered drafter"):
        DrafterConfig.from_hf_drafter_config(two, layer_id_numbering="sglang")
    with pytest.warns(UserWarning, match="norm_output"):
        DrafterConfig.from_hf_drafter_config({**vllm_style, "norm_output": True})


def test_memory_lean_norm_and_mlp_gradients():
    """The hand-written backwards of RMSNorm (with and without the fused add) and silu*up, in float64."""
    from eagle_assets.drafter.model import _RMSNormFunction, _SiluMulFunction

    g = torch.Generator().manual_seed(0)
    x, r = (torch.randn(3, 6, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(2))
    w = torch.randn(6, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w: _RMSNormFunction.apply(x, None, w, 1e-6)[0], (x, w))
    assert torch.autograd.gradcheck(lambda x, r, w: _RMSNormFunction.apply(x, r, w, 1e-6), (x, r, w))
    assert torch.autograd.gradcheck(_SiluMulFunction.apply, (x, r))
