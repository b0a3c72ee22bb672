"""Random EAGLE-3 drafters written by hand in docs/design.md's checkpoint format, for engine tests.

Written straight with safetensors, independently of `eagle_assets.drafter.export`, so that the
engine tests also check the format itself against the real vLLM loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_TARGET_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "num_hidden_layers": 4,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}
"""A target folder's config.json matching `drafter.config.tiny_config()`'s drafters, for checks
that read configs and never load weights."""


def write_random_drafter(
    folder: Path,
    target_config: dict,
    aux_layer_ids: tuple[int, ...] | None = (2, 15, 27),
    draft_vocab_size: int = 1024,
    intermediate_size: int = 256,
    target_hidden_size: int | None = None,
    seed: int = 0,
) -> Path:
    """A one-layer drafter for `target_config` with random weights; `aux_layer_ids=None` omits them."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    h = target_config["hidden_size"]
    ht = target_hidden_size or h
    heads, kv = target_config["num_attention_heads"], target_config["num_key_value_heads"]
    hd = target_config.get("head_dim") or h // heads
    vocab = target_config["vocab_size"]
    n_aux = len(aux_layer_ids) if aux_layer_ids else 3

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(torch.bfloat16)

    draft_to_target = torch.arange(draft_vocab_size, dtype=torch.int64)  # the lowest ids
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[draft_to_target] = True
    tensors = {
        "fc.weight": w(h, n_aux * ht),
        "layers.0.input_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "layers.0.hidden_norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "layers.0.post_attention_layernorm.weight": torch.ones(h, dtype=torch.bfloat16),
        "layers.0.self_attn.q_proj.weight": w(heads * hd, 2 * h),
        "layers.0.self_attn.k_proj.weight": w(kv * hd, 2 * h),
        "layers.0.self_attn.v_proj.weight": w(kv * hd, 2 * h),
        "layers.0.self_attn.o_proj.weight": w(h, heads * hd),
        "layers.0.mlp.gate_proj.weight": w(intermediate_size, h),
        "layers.0.mlp.up_proj.weight": w(intermediate_size, h),
        "layers.0.mlp.down_proj.weight": w(h, intermediate_size),
        "norm.weight": torch.ones(h, dtype=torch.bfloat16),
        "lm_head.weight": w(draft_vocab_size, h),
        "d2t": draft_to_target - torch.arange(draft_vocab_size),
        "t2d": t2d,
    }
    save_file(tensors, str(folder / "model.safetensors"))
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": intermediate_size,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": target_config.get("rms_norm_eps", 1e-5),
        "max_position_embeddings": target_config.get("max_position_embeddings", 2048),
        "rope_theta": (target_config.get("rope_parameters") or {}).get("rope_theta", target_config.get("rope_theta", 10000.0)),
        "vocab_size": vocab,
        "draft_vocab_size": draft_vocab_size,
        "target_hidden_size": ht,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {"use_aux_hidden_state": True},
    }
    if aux_layer_ids:
        config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
