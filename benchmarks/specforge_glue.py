"""SpecForge 0.2.0 beside our drafter: its import from the wheel, its config and weight names, its input shift.

Shared by benchmarks/train_throughput.py (step speed on one batch) and
benchmarks/quality_vs_specforge.py (whole trainings on the same shards, then acceptance).

    sf, why = import_specforge()                       # None and the reason when it cannot import
    draft = sf["LlamaForCausalLMEagle3"](specforge_config(config), attention_backend="flex_attention")
    draft.load_state_dict(specforge_state(our_weights), strict=False)
    ours = ours_from_specforge(draft.state_dict(), config)   # every weight accounted for, or ValueError

SpecForge is imported lazily: from the environment, else from `.whl/specforge-0.2.0-*.whl`
(a pure-Python wheel, extracted once to a temporary folder). Only the modules the comparison
needs are imported: its EAGLE-3 draft model, `OnlineEagle3Model` (training forward and loss),
`BF16Optimizer` and its schedulers. They need torch, transformers, safetensors and
huggingface_hub, plus triton for the loss (`specforge.core.loss` is a Triton kernel module);
`import_specforge(training=False)` imports what runs without triton (the draft model, the
optimiser), so a CPU host without triton can still build, load, map and export the model.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

import torch

PROJECT_ROOT = Path(__file__).resolve().parents[1]
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))

from eagle_assets.drafter.config import DrafterConfig  # noqa: E402

SPECFORGE_VERSION = "0.2.0"
STEP_DECAY = 0.8  # both sides weight TTT step i by 0.8**i
WHEEL_HINT = f"pip download --no-deps specforge=={SPECFORGE_VERSION} -d .whl"


def _put_on_path() -> str:
    """Make `import specforge` work: '' when it does, else why not."""
    try:
        import specforge  # noqa: F401

        return ""
    except ImportError:
        pass
    wheels = sorted((PROJECT_ROOT / ".whl").glob(f"specforge-{SPECFORGE_VERSION}-*.whl"))
    if not wheels:
        return f"specforge is not installed and no .whl/specforge-{SPECFORGE_VERSION}-*.whl is present ({WHEEL_HINT})"
    # A pure-Python wheel: extract it once (under a temp name, then rename) and import from there.
    target = Path(tempfile.gettempdir()) / f"eagle_assets-specforge-{SPECFORGE_VERSION}"
    if not (target / "specforge" / "__init__.py").is_file():
        tmp = Path(tempfile.mkdtemp(dir=tempfile.gettempdir(), prefix=".specforge-"))
        with zipfile.ZipFile(wheels[0]) as zf:
            zf.extractall(tmp)
        try:
            os.replace(tmp, target)
        except OSError:  # another process extracted it first
            pass
    sys.path.insert(0, str(target))
    return ""


def import_specforge(training: bool = True) -> tuple[dict | None, str]:
    """SpecForge's classes, or (None, why).

    training=True: all of them, or None when any fails (e.g. no triton on a CPU-only torch).
    training=False: the draft model, `BF16Optimizer` and `padding` are required; the training
    forward `OnlineEagle3Model` is added when it imports, else it is None and
    `why_no_training` says why.
    """
    why = _put_on_path()
    if why:
        return None, why
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="flash_attn is not found")  # flex_attention is what we use
            from specforge.lr_scheduler import CosineAnnealingWarmupLR
            from specforge.modeling.draft.llama3_eagle import LlamaForCausalLMEagle3
            from specforge.optimizer import BF16Optimizer
            from specforge.utils import padding
    except Exception as err:
        return None, f"specforge {SPECFORGE_VERSION} does not import here: {type(err).__name__}: {err}"
    import specforge

    out = {
        "LlamaForCausalLMEagle3": LlamaForCausalLMEagle3,
        "BF16Optimizer": BF16Optimizer,
        "CosineAnnealingWarmupLR": CosineAnnealingWarmupLR,
        "padding": padding,
        "OnlineEagle3Model": None,
        "why_no_training": "",
        "where": str(Path(specforge.__file__).parent),
    }
    try:
        from specforge.algorithms.eagle3.model import OnlineEagle3Model

        out["OnlineEagle3Model"] = OnlineEagle3Model
    except Exception as err:  # e.g. no Triton on a CPU-only torch
        out["why_no_training"] = (
            f"specforge {SPECFORGE_VERSION}'s OnlineEagle3Model (its training forward) does not import here: "
            f"{type(err).__name__}: {err} (its loss, specforge.core.loss, is a Triton GPU kernel)"
        )
        if training:
            return None, out["why_no_training"]
    return out, ""


def specforge_config(config: DrafterConfig):
    """The `LlamaConfig` SpecForge's `LlamaForCausalLMEagle3` builds the same drafter from."""
    from transformers import LlamaConfig

    if config.num_hidden_layers != 1:
        raise ValueError(f"SpecForge's LlamaForCausalLMEagle3 has one decoder layer; this drafter has {config.num_hidden_layers}")
    if config.ptd_token_id is not None:
        raise ValueError("a parallel-drafting drafter (ptd_token_id) has no SpecForge LlamaForCausalLMEagle3 counterpart")
    rope = {"rope_type": config.rope_type, "rope_theta": config.rope_theta}
    if config.rope_scaling:
        rope.update({k: v for k, v in config.rope_scaling.items() if k not in ("type", "rope_type")})
    cfg = LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_norm_eps,
        max_position_embeddings=config.max_position_embeddings,
        hidden_act=config.hidden_act,
        tie_word_embeddings=False,
        attention_bias=False,
        rope_parameters=rope,
    )
    cfg.rope_theta = config.rope_theta
    cfg.draft_vocab_size = config.draft_vocab_size
    cfg.target_hidden_size = config.target_hidden_size
    cfg.pretraining_tp = 1
    cfg.norm_output = True  # SpecForge's default: lm_head(norm(h)), our function
    return cfg


def specforge_state(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our names -> SpecForge's (`layers.0.` is its `midlayer.`)."""
    return {k.replace("layers.0.", "midlayer."): v for k, v in weights.items()}


def ours_from_specforge(state: dict[str, torch.Tensor], config: DrafterConfig) -> dict[str, torch.Tensor]:
    """SpecForge's draft-model state -> our `Eagle3Drafter.trainable_state_dict()` names and shapes.

    `midlayer.` becomes `layers.0.`; `embed_tokens` (the target's, frozen) is left out. Raises
    ValueError naming every tensor that has no place in ours, every one of ours left unfilled,
    and every shape that differs: a mapping that drops a weight must not export.
    """
    from eagle_assets.drafter.model import exported_shapes

    mapped = {k.replace("midlayer.", "layers.0."): v for k, v in state.items() if not k.startswith("embed_tokens.")}
    expected = exported_shapes(config)
    unknown = sorted(set(mapped) - set(expected))
    missing = sorted(set(expected) - set(mapped))
    wrong = [
        f"{k} {tuple(mapped[k].shape)} vs ours {expected[k]}"
        for k in sorted(set(mapped) & set(expected))
        if tuple(mapped[k].shape) != tuple(expected[k])
    ]
    if unknown or missing or wrong:
        raise ValueError(f"SpecForge's weights do not map onto our drafter: no place for {unknown}, unfilled {missing}, shapes {wrong}")
    return mapped


def shift_batch(batch: dict[str, torch.Tensor], padding) -> dict[str, torch.Tensor]:
    """SpecForge's inputs for one of our collated micro-batches, with its own input shift.

    `TargetHead.preprocess` (offline training): tokens and the target's final states move left
    by one (position t reads x_{t+1} and the state that predicts x_{t+2}), the aux states do
    not, the loss mask keeps its place and gains a trailing dimension. Right padding becomes
    its `attention_mask` (1 on the first `lengths` positions).
    """
    T = batch["input_ids"].shape[1]
    attention_mask = (torch.arange(T, device=batch["lengths"].device)[None, :] < batch["lengths"][:, None]).long()
    return {
        "input_ids": padding(batch["input_ids"], left=False),
        "attention_mask": attention_mask,
        "loss_mask": batch["loss_mask"][..., None],
        "hidden_states": batch["aux"],
        "target_hidden_for_compact": padding(batch["final"], left=False),
    }
