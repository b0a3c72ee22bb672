"""A Kimi-K2.5 drafter trained from nothing takes SpecForge's kimi-k2 drafter shape, not the target's."""

from __future__ import annotations

from eagle_assets.drafter.run_config import TrainConfig
from eagle_assets.drafter.train import resolve_drafter_config
from eagle_assets.targets import get_preset

# Kimi-K2.5's text config as its hub config.json writes it (the fields a new drafter reads).
KIMI_TEXT = {
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "vocab_size": 163840,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "intermediate_size": 18432,
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 262144,
    "rope_theta": 50000.0,
    "rope_scaling": {
        "type": "yarn",
        "factor": 64.0,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
}
KIMI = {"model_type": "kimi_k25", "architectures": ["KimiK25ForConditionalGeneration"], "text_config": KIMI_TEXT}


def _config(tmp_path, **kw) -> TrainConfig:
    return TrainConfig(shard_dirs=(str(tmp_path),), vocab_mapping=str(tmp_path / "v"), target=str(tmp_path), out_dir=str(tmp_path / "o"), **kw)


def test_the_fields_kimi_drafter_shape_over_the_targets(tmp_path):
    derived = resolve_drafter_config(_config(tmp_path), KIMI, (2, 30, 58), 32000)
    assert (derived.head_dim, derived.num_attention_heads, derived.rope_theta) == (112, 64, 50000.0)  # 7168 / 64, the target's RoPE base
    shaped = resolve_drafter_config(_config(tmp_path, drafter_shape=dict(get_preset("kimi-k2.5").drafter_shape)), KIMI, (2, 30, 58), 32000)
    # SpecForge's configs/kimi-k2-eagle3.json and kimi-k25-eagle3.json (as the public Kimi drafters).
    assert (shaped.head_dim, shaped.num_attention_heads, shaped.num_key_value_heads, shaped.intermediate_size) == (128, 64, 64, 18432)
    assert (shaped.rope_theta, shaped.rope_scaling, shaped.max_position_embeddings, shaped.rms_norm_eps) == (1e6, None, 131072, 1e-6)
    assert (shaped.hidden_size, shaped.vocab_size, shaped.draft_vocab_size, shaped.aux_layer_ids) == (7168, 163840, 32000, (2, 30, 58))
    assert not get_preset("tiny-kimi-k2.5").drafter_shape  # the stand-in's width is not Kimi's: its own shapes
