"""The EAGLE-3 drafter's architecture, as one frozen dataclass, and its engine configs.

A drafter is one Llama decoder layer whose attention takes 2H inputs (the token embedding
and the projected target state), plus `fc` (n_aux * Ht -> H), a final norm and a
draft-vocabulary `lm_head`; vLLM also serves further plain (H-input) layers after it. `DrafterConfig` holds everything that fixes its shapes and its
function; it is built from a target's `config.json` (new drafter), from an existing drafter's
`config.json` (warm start), or from JSON (the trainer reads it under torchrun):

    >>> import json
    >>> cfg = DrafterConfig.from_target_config(json.load(open("target/config.json")))
    >>> cfg.to_vllm_config()["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    [2, 15, 27]

Layer ids use the project's one convention (docs/design.md, "Layer ids"): id k = Hugging Face
`output_hidden_states[k]`, the residual stream after k decoder layers. vLLM reads that
numbering as is; SGLang adds one to every id, so `to_sglang_config` writes id - 1.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

DRAFTER_ARCHITECTURE = "LlamaForCausalLMEagle3"
"""The `architectures[0]` both vLLM and SGLang resolve to their Llama EAGLE-3 drafter."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
"""RoPE variants the drafter implements exactly as the engines do."""

SGLANG_FIRST_ID_RULE = ("deepseek_v2", "deepseek_v3", "kimi_k2", "kimi_k25")
"""Targets whose SGLang model adds 1 to the configured ids only when the first id is 1
(`deepseek_v2.py` `set_eagle3_layers_to_capture`); SGLang's llama always adds 1."""


def sglang_can_capture(aux_layer_ids, target_num_layers: int) -> bool:
    """Whether SGLang can capture these layers: it captures at a layer's input, so never the last
    layer's output (id L, docs/eagle3-semantics.md section 5)."""
    return max(aux_layer_ids) < target_num_layers


def vllm_only_reason(num_layers: int, aux_layer_ids, target_num_layers: int, parallel: bool) -> str | None:
    """Why a drafter of this shape is exported for vLLM only; None when SGLang serves it too."""
    if parallel:
        return "a parallel-drafting drafter (ptd_token_id) is exported for vLLM only: SGLang's EAGLE-3 drafts step by step"
    if num_layers > 1:
        return f"a {num_layers}-layer drafter is exported for vLLM only: SGLang's later layers compute another function"
    if not sglang_can_capture(aux_layer_ids, target_num_layers):
        return "a drafter that reads the last layer's output is exported for vLLM only: SGLang cannot capture it"
    return None


def _rope_type(rope_scaling: dict | None) -> str:
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


@dataclass(frozen=True)
class DrafterConfig:
    """Shapes and function of a Llama EAGLE-3 drafter (vLLM's `LlamaForCausalLMEagle3`)."""

    hidden_size: int
    """Width H of the drafter's residual stream (the engines require H = the target's hidden size
    unless `target_hidden_size` says otherwise; the embedding is the target's, so H = its width)."""
    intermediate_size: int
    """Width of the drafter's gated MLP."""
    num_attention_heads: int
    """Query heads of the drafter's attention."""
    num_key_value_heads: int
    """Key/value heads (grouped-query attention when fewer than the query heads)."""
    head_dim: int
    """Width of one attention head; q_proj has num_attention_heads * head_dim outputs."""
    rms_norm_eps: float
    """Epsilon of every RMSNorm in the drafter."""
    rope_theta: float
    """RoPE base frequency (the target's, so that positions mean the same thing)."""
    rope_scaling: dict | None
    """RoPE scaling as in a HF config (`{"rope_type": "llama3", ...}`), or None for plain RoPE."""
    max_position_embeddings: int
    """Longest position the drafter is configured for (written to the engine config)."""
    vocab_size: int
    """The target's vocabulary size V (rows of the embedding, length of `t2d`)."""
    draft_vocab_size: int
    """Draft vocabulary size N (rows of `lm_head`, length of `d2t`)."""
    target_hidden_size: int
    """Width Ht of each captured target state; `fc` takes n_aux * Ht inputs."""
    aux_layer_ids: tuple[int, ...]
    """Captured target layers, project numbering (HF `output_hidden_states` index), ascending:
    the order in which vLLM concatenates them, hence the order of `fc`'s input columns."""
    hidden_act: str = "silu"
    """MLP activation; the engines' Llama MLP supports only silu."""
    num_hidden_layers: int = 1
    """Decoder layers. Layer 0 takes [embedding ; hidden]; vLLM runs each later one as a plain
    Llama layer on the running residual stream (`input_layernorm(h, residual)`). SGLang's later
    layers drop that residual (a different function), so drafters of more than one layer are
    exported for vLLM only (docs/eagle3-semantics.md section 7, row 9)."""
    target_num_layers: int | None = None
    """Decoder layers of the target, when known: bounds the layer ids each engine can capture."""
    target_model_type: str | None = None
    """The target text model's `model_type` (e.g. "llama", "kimi_k2"): SGLang numbers aux ids
    differently per target architecture, so an SGLang export needs it."""
    ptd_token_id: int | None = None
    """Parallel drafting (vLLM's `parallel_drafting`, P-EAGLE): set, the drafter drafts all K
    tokens in one forward, draft j > 1 from a mask slot that pairs this token's embedding with
    the learned state fc(`mask_hidden`) instead of draft j-1 and its hidden state. None: chain
    drafting, step by step (EAGLE-3). vLLM only."""
    extra: dict = field(default_factory=dict, compare=False)
    """Keys copied from a parent drafter's config.json that do not change the function
    (e.g. `torch_dtype`); kept so that a warm-started export stays recognisable."""

    def __post_init__(self) -> None:
        ids = tuple(int(i) for i in self.aux_layer_ids)
        object.__setattr__(self, "aux_layer_ids", ids)
        if not ids:
            raise ValueError("DrafterConfig.aux_layer_ids is empty: give the target layers to capture, e.g. (2, L//2, L-3)")
        if list(ids) != sorted(set(ids)):
            raise ValueError(
                f"DrafterConfig.aux_layer_ids={ids} must be ascending and distinct: vLLM and SGLang "
                f"concatenate captured states in ascending layer order, so fc's columns follow it. "
                f"Use {tuple(sorted(set(ids)))} (and permute fc's column blocks if the weights came in another order)."
            )
        if min(ids) < 0 or (self.target_num_layers is not None and max(ids) > self.target_num_layers):
            raise ValueError(
                f"DrafterConfig.aux_layer_ids={ids} out of range for a target with "
                f"{self.target_num_layers} layers: ids go from 0 (embeddings) to L (last layer output)"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads={self.num_attention_heads} is not a multiple of num_key_value_heads={self.num_key_value_heads}")
        if self.draft_vocab_size > self.vocab_size:
            raise ValueError(f"draft_vocab_size={self.draft_vocab_size} exceeds the target vocab_size={self.vocab_size}")
        if self.num_hidden_layers < 1:
            raise ValueError(f"num_hidden_layers={self.num_hidden_layers}: a drafter has at least one decoder layer")
        if self.ptd_token_id is not None and not 0 <= self.ptd_token_id < self.vocab_size:
            raise ValueError(f"ptd_token_id={self.ptd_token_id} is not a token id of a {self.vocab_size}-token vocabulary")
        if self.hidden_act != "silu":
            raise ValueError(f"hidden_act={self.hidden_act!r}: the engines' EAGLE-3 Llama layer only runs silu")
        if _rope_type(self.rope_scaling) not in SUPPORTED_ROPE_TYPES:
            raise ValueError(
                f"rope_scaling type {_rope_type(self.rope_scaling)!r} is not implemented by the drafter "
                f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)}); train with rope_scaling=None or add it to "
                "drafter/model.py's RotaryEmbedding first"
            )

    # ------------------------------------------------------------------ derived sizes
    @property
    def num_aux(self) -> int:
        """Number of captured target states (fc takes num_aux * target_hidden_size inputs)."""
        return len(self.aux_layer_ids)

    @property
    def fc_in_features(self) -> int:
        return self.num_aux * self.target_hidden_size

    @property
    def q_size(self) -> int:
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def rope_type(self) -> str:
        return _rope_type(self.rope_scaling)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def from_target_config(
        cls,
        target_hf_config: dict,
        aux_layer_ids: tuple[int, ...] | list[int] | None = None,
        draft_vocab_size: int | None = None,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 1,
    ) -> "DrafterConfig":
        """A new drafter for the target whose HF `config.json` is `target_hf_config`.

        Attention and MLP shapes are the target's (as SpecForge and the published drafters do);
        `aux_layer_ids` defaults to (2, L//2, L-3), the ids both engines fall back to.
        """
        text = target_hf_config.get("text_config") or target_hf_config
        try:
            hidden = int(text["hidden_size"])
            num_layers = int(text["num_hidden_layers"])
            vocab = int(text["vocab_size"])
            heads = int(text["num_attention_heads"])
        except KeyError as missing:
            raise KeyError(
                f"target config.json has no {missing.args[0]!r}; pass the HF config of the target "
                "(a text model, or a multimodal one with a `text_config`)"
            ) from None
        theta, scaling = _read_rope(text)
        if _rope_type(scaling) not in SUPPORTED_ROPE_TYPES:
            # A new drafter is a model of its own: where the target's RoPE scaling is one the
            # drafter does not implement (DeepSeek-V3's and Kimi-K2.5's YaRN), it takes plain RoPE
            # at the target's theta, and its export says so, so the engines serve what it trained.
            scaling = None
        ids = tuple(aux_layer_ids) if aux_layer_ids else (2, num_layers // 2, num_layers - 3)
        return cls(
            hidden_size=hidden,
            intermediate_size=int(intermediate_size or text.get("intermediate_size") or 4 * hidden),
            num_attention_heads=heads,
            num_key_value_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or hidden // heads),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(text.get("max_position_embeddings", 4096)),
            vocab_size=vocab,
            draft_vocab_size=int(draft_vocab_size or vocab),
            target_hidden_size=hidden,
            aux_layer_ids=tuple(sorted(ids)),
            target_num_layers=num_layers,
            target_model_type=text.get("model_type") or target_hf_config.get("model_type"),
            num_hidden_layers=int(num_hidden_layers),
        )

    @classmethod
    def from_hf_drafter_config(
        cls,
        cfg: dict,
        layer_id_numbering: str = "vllm",
        target_num_layers: int | None = None,
    ) -> "DrafterConfig":
        """An existing drafter's `config.json` (vLLM / SpecForge / SafeAILab `LlamaForCausalLMEagle3`).

        `layer_id_numbering` says how its `eagle_aux_hidden_state_layer_ids` count: "vllm" (as
        ours) or "sglang" (SpecForge / ModelOpt "output of layer" ids, one less than ours).
        Options that change the drafter's function away from the engines' defaults are refused.
        """
        if layer_id_numbering not in ("vllm", "sglang"):
            raise ValueError(f"layer_id_numbering={layer_id_numbering!r}: use 'vllm' (as ours) or 'sglang' (ours - 1)")
        eagle = cfg.get("eagle_config") or {}
        _refuse_unsupported(cfg, eagle, layer_id_numbering)
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        vocab = int(cfg["vocab_size"])
        n_layers = target_num_layers or cfg.get("target_num_hidden_layers")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids") or cfg.get("eagle_aux_hidden_state_layer_ids")
        if ids:
            ids = tuple(int(i) + (1 if layer_id_numbering == "sglang" else 0) for i in ids)
        elif n_layers:
            ids = (2, int(n_layers) // 2, int(n_layers) - 3)
        else:
            raise ValueError(
                "the drafter config names no eagle_aux_hidden_state_layer_ids, so the engines would use "
                "their defaults (2, L//2, L-3), which depend on the target: pass target_num_layers=L"
            )
        theta, scaling = _read_rope(cfg)
        extra = {k: cfg[k] for k in ("torch_dtype", "dtype", "transformers_version") if k in cfg}
        return cls(
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_attention_heads=heads,
            num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            vocab_size=vocab,
            draft_vocab_size=int(cfg.get("draft_vocab_size") or vocab),
            target_hidden_size=int(cfg.get("target_hidden_size") or hidden),
            aux_layer_ids=tuple(sorted(ids)),
            target_num_layers=int(n_layers) if n_layers else None,
            target_model_type=cfg.get("target_model_type"),
            num_hidden_layers=int(cfg.get("num_hidden_layers", 1)),
            ptd_token_id=int(cfg["ptd_token_id"]) if cfg.get("ptd_token_id") is not None else None,
            extra=extra,
        )

    # ------------------------------------------------------------------ engine configs
    def _common_hf_config(self) -> dict:
        cfg = {
            "architectures": [DRAFTER_ARCHITECTURE],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_hidden_layers": self.num_hidden_layers,
            "hidden_act": self.hidden_act,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.draft_vocab_size,
            "target_hidden_size": self.target_hidden_size,
            # Both engines: tied embeddings would make lm_head the (target-vocab) embedding;
            # attention_bias adds q/k/v/o biases in vLLM that the drafter does not have.
            "tie_word_embeddings": False,
            "attention_bias": False,
            "mlp_bias": False,
            "torch_dtype": self.extra.get("torch_dtype", "bfloat16"),
        }
        if self.rope_scaling:
            cfg["rope_scaling"] = dict(self.rope_scaling)
        if self.target_num_layers is not None:
            # Not read by the engines; lets a warm start check the ids against its new target.
            cfg["target_num_hidden_layers"] = self.target_num_layers
        if self.target_model_type is not None:
            cfg["target_model_type"] = self.target_model_type  # not read by the engines either
        if self.ptd_token_id is not None:
            cfg["ptd_token_id"] = self.ptd_token_id  # vLLM's mask token for parallel drafting
        # `norm_output` is deliberately absent: "true" makes the engines feed back the normed
        # state, and SpecForge reads "false" as "no final norm". Absent = our function everywhere.
        return cfg

    def to_vllm_config(self) -> dict:
        """config.json for vLLM: layer ids in our numbering, which vLLM uses as is."""
        if self.target_num_layers is not None and max(self.aux_layer_ids) > self.target_num_layers:
            raise ValueError(f"aux id {max(self.aux_layer_ids)} > target layers {self.target_num_layers}")
        cfg = self._common_hf_config()
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": list(self.aux_layer_ids),
            "use_aux_hidden_state": True,
        }
        return cfg

    def sglang_layer_ids(self) -> list[int]:
        """Our ids in the numbering SGLang's target model reads (docs/eagle3-semantics.md section 5).

        SGLang captures r_j at the entry of layer j. Its llama captures j = id + 1, so we write
        id - 1; its deepseek_v2 (DeepSeek-V3, Kimi-K2.x) adds 1 only when the first id is 1, so
        ids starting at 2 are written minus one and others as they are.
        """
        ids = list(self.aux_layer_ids)
        if self.target_num_layers is not None and not sglang_can_capture(ids, self.target_num_layers):
            raise ValueError(
                f"aux id {max(ids)} is the last layer's output (target has {self.target_num_layers} layers), which "
                "SGLang cannot capture: it captures at a layer's input (docs/eagle3-semantics.md section 5). "
                f"Use ids <= {self.target_num_layers - 1}."
            )
        if self.target_model_type is None:
            raise ValueError(
                "target_model_type is unknown: SGLang numbers aux ids per target architecture (llama adds 1; "
                "deepseek_v2 / kimi_k2 add 1 only when the first id is 1). Set DrafterConfig.target_model_type."
            )
        if self.target_model_type in SGLANG_FIRST_ID_RULE:
            if ids[0] == 1:
                raise ValueError(
                    f"aux ids {tuple(ids)} cannot be written for SGLang's {self.target_model_type}: written as 1.. it "
                    "adds 1 to all of them, written as 0.. it reads them as they are. Train with a first id other than 1."
                )
            return [i - 1 for i in ids] if ids[0] == 2 else ids
        if min(ids) < 1:
            raise ValueError(
                f"aux id {min(ids)} (the embeddings) has no SGLang id for a {self.target_model_type} target: SGLang "
                "id -1 is not a layer it captures. Use ids >= 1 for a drafter meant for SGLang."
            )
        return [i - 1 for i in ids]

    def to_sglang_config(self) -> dict:
        """config.json for SGLang: layer ids minus one, read from `eagle_config` only."""
        if self.ptd_token_id is not None:
            raise ValueError(
                "a parallel-drafting drafter (ptd_token_id set) serves in vLLM only: SGLang's EAGLE-3 drafts "
                "step by step. Export it for vLLM only, or train it without parallel drafting."
            )
        if self.num_hidden_layers != 1:
            raise ValueError(
                f"a {self.num_hidden_layers}-layer drafter does not serve in SGLang: its layers after the first "
                "restart the residual stream from the previous layer's MLP output (vLLM keeps it), so the "
                "drafter would compute another function there. Export it for vLLM only, or train one layer."
            )
        cfg = self._common_hf_config()
        cfg["eagle_config"] = {
            "eagle_aux_hidden_state_layer_ids": self.sglang_layer_ids(),
            "use_aux_hidden_state": True,
        }
        return cfg

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict:
        d = asdict(self)
        d["aux_layer_ids"] = list(self.aux_layer_ids)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "DrafterConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"DrafterConfig.from_dict: unknown keys {unknown}; known keys: {sorted(known)}")
        d = dict(d)
        d["aux_layer_ids"] = tuple(d["aux_layer_ids"])
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "DrafterConfig":
        return cls.from_dict(json.loads(text))


def _folder_config(folder) -> dict:
    """A drafter folder's config.json; {} when it cannot be read (the warm start or the preflight
    reading that folder then names what is wrong with it)."""
    try:
        config = json.loads((Path(folder) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def folder_num_layers(folder) -> int:
    """Decoder layers of a drafter folder, from its config.json; 1 when it cannot be read."""
    try:
        return int(_folder_config(folder).get("num_hidden_layers", 1))
    except (TypeError, ValueError):
        return 1


def folder_drafts_in_parallel(folder) -> bool:
    """Whether a drafter folder was trained for parallel drafting (its config.json has ptd_token_id)."""
    return _folder_config(folder).get("ptd_token_id") is not None


def tiny_config(**overrides) -> DrafterConfig:
    """A small drafter for unit tests and CPU smoke runs (hidden 64, vocab 256, draft vocab 64)."""
    base = dict(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        rope_scaling=None,
        max_position_embeddings=512,
        vocab_size=256,
        draft_vocab_size=64,
        target_hidden_size=64,
        aux_layer_ids=(1, 2, 3),
        target_num_layers=4,
        target_model_type="llama",
    )
    base.update(overrides)
    return DrafterConfig(**base)


def _read_rope(cfg: dict) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from a transformers 4 (`rope_theta`/`rope_scaling`) or 5
    (`rope_parameters`) config."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and params:
        theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        if _rope_type(scaling) == "default":
            scaling = None
        return theta, scaling
    theta = float(cfg.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or None
    if scaling is not None and _rope_type(scaling) == "default":
        scaling = None
    return theta, dict(scaling) if scaling else None


def _refuse_unsupported(cfg: dict, eagle: dict, layer_id_numbering: str = "vllm") -> None:
    """Errors for drafter options whose function differs from ours (docs/eagle3-semantics.md section 7)."""
    problems = []
    layers = int(cfg.get("num_hidden_layers", 1))
    if layers < 1 or (layers > 1 and layer_id_numbering == "sglang"):
        problems.append(
            f"num_hidden_layers={layers} in an SGLang-numbered drafter: SGLang's layers after the first drop "
            "the residual stream that vLLM's (and ours) carry, so its function is not ours; only vLLM "
            "drafters may have more than one layer"
        )
    for key in ("norm_before_residual", "norm_before_fc", "fc_norm", "use_aux_norm", "attention_bias", "bias"):
        if cfg.get(key) or eagle.get(key):
            problems.append(f"{key}=true is not supported (SGLang or SpecForge ignore it; the function would differ)")
    if eagle.get("use_aux_hidden_state") is False:
        problems.append("eagle_config.use_aux_hidden_state=false (an EAGLE-1/2 drafter without fc) is not EAGLE-3")
    if float(cfg.get("logit_scale", 1.0)) != 1.0:
        problems.append(f"logit_scale={cfg['logit_scale']} is not supported")
    if problems:
        raise ValueError("unsupported drafter config.json: " + "; ".join(problems))
    if cfg.get("norm_output"):
        # SpecForge writes norm_output=true for "norm before lm_head", which is our function; for
        # the engines it would mean feeding back the normed state, so exports omit the key.
        warnings.warn(
            "drafter config has norm_output=true; reading it as SpecForge's 'final norm before lm_head' "
            "(pre-norm state fed back). Exports omit the key so that engines feed back the pre-norm state.",
            stacklevel=3,
        )
