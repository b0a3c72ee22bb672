"""Drafter export to the engines' checkpoint folders, the name checks, and loading back.

An export is an HF folder (docs/design.md, "Drafter checkpoint"): `config.json` for
`LlamaForCausalLMEagle3` and `model.safetensors` with `fc.weight`, `layers.0.*`, `norm.weight`,
`lm_head.weight`, `d2t` (int64) and `t2d` (bool); never `embed_tokens` (the engines take the
target's). A drafter of more layers adds `layers.1.*` ... (vLLM only). The two engines differ
only in the config:

- vLLM reads `eagle_config.eagle_aux_hidden_state_layer_ids` in our numbering, as is.
  It loads `d2t` only when the draft vocabulary is smaller than the target's and fails on a
  `d2t` it has no slot for, so a full-vocabulary drafter is written without one.
- SGLang adds one to every id, so the ids are written minus one; it cannot capture the last
  layer. Its loader drops unknown tensor names silently: `check_sglang_names` replays that
  loader's renaming and lists what would be dropped, and the export refuses to write them.

Folders are written under a temporary name next to `out_dir`, fsynced, and renamed into place.

    >>> export_vllm(model, model.config, "out/drafter-vllm")
    >>> model, config = load_drafter("out/drafter-vllm")
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from eagle_assets.checked_reads import read_json_object, read_safetensors_header
from eagle_assets.drafter.config import DrafterConfig
from eagle_assets.drafter.model import Eagle3Drafter, check_vocab_mapping, exported_shapes
from eagle_assets.durable import fsync_dir, fsync_tree
from eagle_assets.formats import NUMBERING_KEY

WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"


def exported_weights(config: DrafterConfig) -> tuple[str, ...]:
    """Float tensors of an export of this drafter, under the names vLLM's and SGLang's loaders
    expect (`fc.weight`, `layers.0.*`, then `layers.1.*` ... for more layers, `norm`, `lm_head`)."""
    return tuple(n for n in exported_shapes(config) if n not in ("d2t", "t2d"))


# SGLang 0.5.23's LlamaForCausalLMEagle3 parameters for a one-layer drafter without fc bias,
# norm_before_fc or fc_norm (sglang/srt/models/llama_eagle3.py), and its load_weights renames.
_SGLANG_PARAMS = frozenset(
    {
        "model.embed_tokens.weight",
        "model.fc.weight",
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
        "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight",
        "model.layers.0.hidden_norm.weight",
        "model.norm.weight",
        "lm_head.weight",
    }
)
_SGLANG_LEGACY = {"midlayer": "layers.0", "aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}
_SGLANG_STACKED = (
    (".qkv_proj", ".q_proj"),
    (".qkv_proj", ".k_proj"),
    (".qkv_proj", ".v_proj"),
    (".gate_up_proj", ".gate_proj"),
    (".gate_up_proj", ".up_proj"),
)


def _sglang_target(name: str) -> str | None:
    """The SGLang parameter a checkpoint tensor lands in, or None when its loader drops it.

    A replay of `LlamaForCausalLMEagle3.load_weights` (d2t and t2d are consumed separately).
    """
    for legacy, new in _SGLANG_LEGACY.items():
        if legacy in name:
            name = name.replace(legacy, new)
    if "d2t" in name or "t2d" in name:
        return name
    for param, shard in _SGLANG_STACKED:
        if shard in name:
            name = name.replace(shard, param)
            break
    target = name if name in _SGLANG_PARAMS else f"model.{name}"
    return target if target in _SGLANG_PARAMS else None


def check_sglang_names(names) -> list[str]:
    """Checkpoint tensor names that SGLang 0.5.23's EAGLE-3 Llama loader would silently drop."""
    return sorted(n for n in names if _sglang_target(n) is None)


def sglang_unfilled_params(names) -> list[str]:
    """SGLang parameters no tensor in `names` fills (embed_tokens excepted: the target's is used)."""
    filled = {_sglang_target(n) for n in names}
    return sorted(p for p in _SGLANG_PARAMS - filled if p != "model.embed_tokens.weight")


def check_vllm_names(names, config: DrafterConfig) -> list[str]:
    """Problems vLLM 0.32's `Eagle3LlamaForCausalLM.load_weights` would have with these names."""
    names = set(names)
    problems = []
    full_vocab = config.draft_vocab_size == config.vocab_size
    if "d2t" in names and full_vocab:
        problems.append("d2t: vLLM has no d2t slot when draft_vocab_size == vocab_size and fails to load it")
    if "d2t" not in names and not full_vocab:
        problems.append("d2t missing: vLLM would map every draft id to itself (all-zero offsets)")
    weights = exported_weights(config)
    known = set(weights) | {"embed_tokens.weight", "d2t", "t2d"}
    for n in sorted(names):
        if n.replace("midlayer.", "layers.0.") not in known:
            problems.append(f"{n}: no such parameter in vLLM's drafter (the load fails)")
    missing = [n for n in weights if n not in {m.replace("midlayer.", "layers.0.") for m in names}]
    problems += [f"{n} missing: vLLM would keep its random initialisation" for n in missing]
    return problems


# ---------------------------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------------------------


def _state_of(model_or_state) -> dict[str, torch.Tensor]:
    if isinstance(model_or_state, Eagle3Drafter):
        return model_or_state.trainable_state_dict()
    return {k: v for k, v in dict(model_or_state).items() if not k.startswith("embed_tokens.")}


def _export_tensors(state: dict[str, torch.Tensor], config: DrafterConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    state = {k.replace("midlayer.", "layers.0."): v for k, v in state.items()}
    weights = exported_weights(config)
    missing = [n for n in (*weights, "d2t", "t2d") if n not in state]
    unknown = sorted(set(state) - set(weights) - {"d2t", "t2d"})
    if missing or unknown:
        raise ValueError(f"drafter state does not match an EAGLE-3 drafter: missing {missing}, unexpected {unknown}")
    check_vocab_mapping(state["d2t"], state["t2d"], config.draft_vocab_size, config.vocab_size)
    expected = exported_shapes(config)
    wrong = [f"{k} {tuple(state[k].shape)} (config says {expected[k]})" for k in expected if tuple(state[k].shape) != expected[k]]
    if wrong:
        raise ValueError("drafter weights do not match its config: " + "; ".join(wrong))
    out = {}
    for k, v in state.items():
        v = v.detach().cpu()
        if k == "d2t":
            v = v.to(torch.int64)
        elif k == "t2d":
            v = v.to(torch.bool)
        else:
            v = v.to(dtype)
        out[k] = v.contiguous().clone()
    return out


def _write_folder(out_dir: Path, tensors: dict[str, torch.Tensor], config_json: dict) -> Path:
    """Write config.json + model.safetensors under a temporary name, then rename into place."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=f".{out_dir.name}.tmp-"))
    try:
        save_file(tensors, str(staging / WEIGHTS_FILE), metadata={"format": "pt"})
        (staging / CONFIG_FILE).write_text(json.dumps(config_json, indent=2) + "\n")
        # The data reach the disk before the rename that publishes them, and the rename after
        # (durable.py): a power loss never leaves a complete-looking export of empty files.
        fsync_tree(staging)
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}"
            os.replace(out_dir, old)
        os.replace(staging, out_dir)
        fsync_dir(out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir


def export_vllm(model_or_state, config: DrafterConfig, out_dir, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write a vLLM drafter folder (ids in our numbering); returns `out_dir`."""
    tensors = _export_tensors(_state_of(model_or_state), config, dtype)
    if config.draft_vocab_size == config.vocab_size:
        if bool(tensors["d2t"].any()):
            raise ValueError(
                "a full-vocabulary drafter (draft_vocab_size == vocab_size) with a non-identity d2t: "
                "vLLM ignores d2t at that size, so its lm_head rows would be read in the wrong order"
            )
        del tensors["d2t"]  # vLLM has no slot for it and would fail to load
    problems = check_vllm_names(tensors, config)
    if problems:
        raise ValueError("vLLM would not load this drafter as written: " + "; ".join(problems))
    cfg = config.to_vllm_config()
    cfg[NUMBERING_KEY] = "vllm"
    return _write_folder(Path(out_dir), tensors, cfg)


def export_sglang(model_or_state, config: DrafterConfig, out_dir, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write an SGLang drafter folder (ids minus one; refuses ids SGLang cannot capture and
    drafters of more than one layer)."""
    cfg = config.to_sglang_config()  # raises for the embeddings, the last layer, or more layers
    tensors = _export_tensors(_state_of(model_or_state), config, dtype)
    dropped = check_sglang_names(tensors)
    unfilled = sglang_unfilled_params(tensors)
    if dropped or unfilled:
        raise ValueError(f"SGLang would drop {dropped} and leave {unfilled} uninitialised; not writing")
    cfg[NUMBERING_KEY] = "sglang"
    return _write_folder(Path(out_dir), tensors, cfg)


# ---------------------------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------------------------


def read_drafter_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a drafter folder (single file or sharded), names as stored."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder} holds no *.safetensors: not a drafter checkpoint folder")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        read_safetensors_header(f)  # a garbage or truncated file: a ValueError naming it, not a SafetensorError
        with safe_open(f, framework="pt") as sf:
            for name in sf.keys():
                out[name] = sf.get_tensor(name)
    return out


def _drafter_config(raw: dict, cfg_path: Path, numbering: str, target_num_layers: int | None) -> DrafterConfig:
    """`DrafterConfig.from_hf_drafter_config`, its errors naming the file they came from."""
    try:
        return DrafterConfig.from_hf_drafter_config(raw, layer_id_numbering=numbering, target_num_layers=target_num_layers)
    except KeyError as exc:
        raise ValueError(f"{cfg_path}: no {exc.args[0]!r}: not a complete EAGLE-3 drafter config: re-export the drafter") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{cfg_path}: {exc}") from None


def load_drafter_config(folder, layer_id_numbering: str | None = None, target_num_layers: int | None = None) -> DrafterConfig:
    """A drafter folder's config alone (its layer ids in our numbering: the marker of our exports,
    else `layer_id_numbering`, default "vllm"), without reading its weights."""
    cfg_path = Path(folder) / CONFIG_FILE
    if not cfg_path.is_file():
        raise FileNotFoundError(f"{cfg_path} does not exist: not a drafter checkpoint folder")
    raw = read_json_object(cfg_path, "the drafter's config", "re-export the drafter")
    numbering = raw.get(NUMBERING_KEY) or layer_id_numbering or "vllm"
    if layer_id_numbering and raw.get(NUMBERING_KEY) and layer_id_numbering != raw[NUMBERING_KEY]:
        raise ValueError(f"{cfg_path} says its ids are {raw[NUMBERING_KEY]!r}-numbered, caller says {layer_id_numbering!r}")
    return _drafter_config(raw, cfg_path, numbering, target_num_layers)


def load_drafter(
    folder,
    layer_id_numbering: str | None = None,
    target_num_layers: int | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Eagle3Drafter, DrafterConfig]:
    """A drafter from an HF folder with `layers.0.*` or `midlayer.*` names -> (model, config).

    The numbering of the config's layer ids is taken from our exports' marker, else from
    `layer_id_numbering` ("vllm", the default, or "sglang"). `embed_tokens` stays zero unless
    the checkpoint has one: call `model.load_target_embedding` with the target's.
    """
    folder = Path(folder)
    config = load_drafter_config(folder, layer_id_numbering, target_num_layers)
    tensors = {k.replace("midlayer.", "layers.0."): v for k, v in read_drafter_tensors(folder).items()}
    for i in range(1, config.num_hidden_layers):  # vLLM builds it in later layers but never reads it
        tensors.pop(f"layers.{i}.hidden_norm.weight", None)
    model = Eagle3Drafter(config)
    expected = set(model.state_dict())
    unknown = sorted(set(tensors) - expected)
    if unknown:
        raise ValueError(f"{folder}: tensors {unknown} have no place in the drafter (fc bias? extra layers?); refusing to drop them")
    missing = [n for n in exported_weights(config) if n not in tensors]
    if missing:
        raise ValueError(f"{folder}: the checkpoint lacks {missing}")
    if "d2t" not in tensors:
        if config.draft_vocab_size != config.vocab_size:
            raise ValueError(
                f"{folder}: no d2t although draft_vocab_size={config.draft_vocab_size} < vocab_size="
                f"{config.vocab_size}; the draft vocabulary is unknown"
            )
        tensors["d2t"] = torch.zeros(config.draft_vocab_size, dtype=torch.long)
    if "t2d" not in tensors:
        t2d = torch.zeros(config.vocab_size, dtype=torch.bool)
        t2d[torch.arange(config.draft_vocab_size) + tensors["d2t"].long()] = True
        tensors["t2d"] = t2d
    with torch.no_grad():
        model.set_vocab_mapping(tensors.pop("d2t"), tensors.pop("t2d"))
        params = dict(model.named_parameters())
        for name, value in tensors.items():
            if tuple(value.shape) != tuple(params[name].shape):
                raise ValueError(f"{folder}: {name} has shape {tuple(value.shape)}, config.json implies {tuple(params[name].shape)}")
            params[name].copy_(value)
    model.to(dtype)
    return model, config
