"""Engine exports: files, names, numbering, atomic replacement, and loading back."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_assets.drafter.config import tiny_config
from eagle_assets.drafter.export import (
    check_sglang_names,
    check_vllm_names,
    export_sglang,
    export_vllm,
    load_drafter,
    sglang_unfilled_params,
)
from eagle_assets_tests.drafter.test_model import VLLM_NAMES, random_drafter

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def mapped_drafter(cfg):
    model = random_drafter(cfg)
    targets = torch.arange(cfg.draft_vocab_size) * 3  # every third target id is drafted
    t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
    t2d[targets] = True
    model.set_vocab_mapping(targets - torch.arange(cfg.draft_vocab_size), t2d)
    return model


def tensors_of(folder):
    with safe_open(folder / "model.safetensors", framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_vllm_export_folder(tmp_path):
    cfg = tiny_config()
    model = mapped_drafter(cfg)
    out = export_vllm(model, cfg, tmp_path / "drafter")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"] and config["model_type"] == "llama"
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 2, 3]  # ours, as is
    assert (config["draft_vocab_size"], config["target_hidden_size"], config["vocab_size"]) == (64, 64, 256)
    assert config["tie_word_embeddings"] is False and config["attention_bias"] is False
    assert "norm_output" not in config and config["num_hidden_layers"] == 1
    tensors = tensors_of(out)
    assert set(tensors) == VLLM_NAMES  # no embed_tokens
    assert tensors["d2t"].dtype == torch.int64 and tensors["t2d"].dtype == torch.bool
    assert tensors["fc.weight"].dtype == torch.bfloat16
    assert torch.equal(tensors["d2t"], model.d2t) and torch.equal(tensors["t2d"], model.t2d)
    assert not list(tmp_path.glob(".drafter*"))  # no staging folder left behind


def test_export_load_roundtrip_is_exact_and_replaces_atomically(tmp_path):
    cfg = tiny_config()
    model = mapped_drafter(cfg)
    target = tmp_path / "drafter"
    export_vllm(random_drafter(cfg, seed=5).trainable_state_dict() | {"d2t": model.d2t, "t2d": model.t2d}, cfg, target)
    export_vllm(model, cfg, target, dtype=torch.float32)  # replaces the first export as a whole
    loaded, loaded_cfg = load_drafter(target)
    assert loaded_cfg == cfg
    for name, value in model.trainable_state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drafter"]


def test_two_layer_drafter_exports_for_vllm_only_and_loads_back(tmp_path):
    cfg = tiny_config(num_hidden_layers=2)
    model = mapped_drafter(cfg)
    out = export_vllm(model, cfg, tmp_path / "drafter", dtype=torch.float32)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 2
    tensors = tensors_of(out)
    later = {n.replace("layers.0.", "layers.1.") for n in VLLM_NAMES if n.startswith("layers.0.")}
    assert set(tensors) == VLLM_NAMES | later - {"layers.1.hidden_norm.weight"}  # vLLM never reads that one
    assert tuple(tensors["layers.1.self_attn.k_proj.weight"].shape) == (2 * 16, 64)
    assert not check_vllm_names(tensors, cfg)
    assert any("no such parameter" in p for p in check_vllm_names(tensors, tiny_config()))  # a 1-layer config
    loaded, loaded_cfg = load_drafter(out)
    assert loaded_cfg == cfg
    for name, value in model.trainable_state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name
    with pytest.raises(ValueError, match="does not serve in SGLang"):
        export_sglang(model, cfg, tmp_path / "sg")
    assert not (tmp_path / "sg").exists()
    # A checkpoint written by another tool may carry layer 1's unused norm: read, and dropped as vLLM does.
    save_file(tensors | {"layers.1.hidden_norm.weight": torch.ones(64)}, str(out / "model.safetensors"))
    assert load_drafter(out)[1] == cfg


def test_sglang_export_numbering_and_names(tmp_path):
    cfg = tiny_config(aux_layer_ids=(1, 2, 3), target_num_layers=4)
    model = mapped_drafter(cfg)
    out = export_sglang(model, cfg, tmp_path / "sg")
    config = json.loads((out / "config.json").read_text())
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [0, 1, 2]  # SGLang adds 1 back
    assert check_sglang_names(tensors_of(out)) == [] and sglang_unfilled_params(tensors_of(out)) == []
    loaded, loaded_cfg = load_drafter(out)  # the marker says the ids are SGLang-numbered
    assert loaded_cfg.aux_layer_ids == (1, 2, 3)
    with pytest.raises(ValueError, match="last layer"):
        export_sglang(model, tiny_config(aux_layer_ids=(1, 2, 4), target_num_layers=4), tmp_path / "no")
    with pytest.raises(ValueError, match="embeddings"):
        tiny_config(aux_layer_ids=(0, 2, 3)).to_sglang_config()
    assert not (tmp_path / "no").exists()


def test_sglang_numbering_follows_the_target_architecture():
    """SGLang's deepseek_v2 (Kimi-K2.x) adds 1 only when the first id is 1; its llama always adds 1."""
    kimi = dict(target_num_layers=61, target_model_type="kimi_k2")
    assert tiny_config(aux_layer_ids=(2, 30, 58), **kimi).sglang_layer_ids() == [1, 29, 57]  # 1.. gains 1 back
    assert tiny_config(aux_layer_ids=(3, 30, 58), **kimi).sglang_layer_ids() == [3, 30, 58]  # read as written
    with pytest.raises(ValueError, match="first id other than 1"):
        tiny_config(aux_layer_ids=(1, 30, 58), **kimi).sglang_layer_ids()
    assert tiny_config(aux_layer_ids=(2, 30, 58), target_num_layers=61).sglang_layer_ids() == [1, 29, 57]
    with pytest.raises(ValueError, match="target_model_type is unknown"):
        tiny_config(target_model_type=None).sglang_layer_ids()


def test_sglang_name_check_replays_its_loader():
    ok = [
        "fc.weight",
        "midlayer.self_attn.q_proj.weight",
        "layers.0.mlp.up_proj.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "embed_tokens.weight",
        "layers.0.hidden_norm.weight",
    ]
    assert check_sglang_names(ok) == []
    dropped = check_sglang_names(ok + ["fc.bias", "layers.1.self_attn.q_proj.weight", "model.norm_output.weight"])
    assert dropped == ["fc.bias", "layers.1.self_attn.q_proj.weight", "model.norm_output.weight"]
    assert "model.layers.0.self_attn.o_proj.weight" in sglang_unfilled_params(ok)


def test_full_vocab_vllm_export_has_no_d2t(tmp_path):
    """vLLM has no d2t slot when the draft vocabulary is the whole vocabulary; writing one fails its load."""
    cfg = tiny_config(draft_vocab_size=256)
    model = random_drafter(cfg)
    out = export_vllm(model, cfg, tmp_path / "full")
    assert "d2t" not in tensors_of(out) and "t2d" in tensors_of(out)
    assert any("no d2t slot" in p for p in check_vllm_names(VLLM_NAMES, cfg))
    loaded, _ = load_drafter(out)
    assert torch.equal(loaded.d2t, torch.zeros(256, dtype=torch.long))


def test_load_midlayer_names_and_refuse_strays(tmp_path):
    cfg = tiny_config()
    model = mapped_drafter(cfg)
    sd = {k.replace("layers.0.", "midlayer."): v.contiguous() for k, v in model.trainable_state_dict().items()}
    (tmp_path / "config.json").write_text(json.dumps(cfg.to_vllm_config()))
    save_file(sd, str(tmp_path / "model.safetensors"))
    loaded, _ = load_drafter(tmp_path)
    assert torch.equal(loaded.layer.self_attn.q_proj.weight, model.layer.self_attn.q_proj.weight)
    save_file({**sd, "fc.bias": torch.zeros(64)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="fc.bias"):
        load_drafter(tmp_path)
    del sd["d2t"]
    save_file(sd, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="no d2t"):
        load_drafter(tmp_path)


def test_export_refuses_weights_that_do_not_fit(tmp_path):
    cfg = tiny_config()
    state = mapped_drafter(cfg).trainable_state_dict()
    with pytest.raises(ValueError, match="lm_head.weight \\(63, 64\\)"):
        export_vllm({**state, "lm_head.weight": state["lm_head.weight"][:63]}, cfg, tmp_path / "x")
    with pytest.raises(ValueError, match="missing \\['norm.weight'\\]"):
        export_vllm({k: v for k, v in state.items() if k != "norm.weight"}, cfg, tmp_path / "x")
    assert not (tmp_path / "x").exists()
